"""jupyter-gpucr: suspend whole (GPU) processes and Jupyter kernels to disk, restore them later.

For agent frameworks::

    from jupyter_gpucr import Checkpointer
    cr = Checkpointer()                                   # store in ~/.local/share/jupyter-gpucr
    cr.run("worker", ["python", "agent.py"])              # start so it can be checkpointed
    cr.checkpoint("worker")                               # process gone, GPU free
    cr.restore("worker", gpu="auto")                      # back, on a GPU with room
"""
from ._version import __version__
from .core.checkpointer import Checkpointer
from .core.errors import GPUCRError
from .core.process.running import Running
from .core.storage.store import Checkpoint, Store

__all__ = ["Checkpointer", "Checkpoint", "GPUCRError", "Running", "Store", "__version__"]


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from .server.app import GPUCRApp

    return [{"module": "jupyter_gpucr.server.app", "app": GPUCRApp}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "jupyter-gpucr"}]

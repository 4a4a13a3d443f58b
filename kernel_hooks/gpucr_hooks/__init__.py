"""Kernel side of jupyter-gpucr, called inside an IPython kernel by the server; also an IPython
extension (``idle``: garbage collected between cells, not during a suspend).

The server calls these functions by executing code silently in the kernel (see
``jupyter_gpucr.server.kernel_rpc``): nothing they do reaches a cell's output. Importing this
package is cheap: it never imports torch, CuPy, JAX or NumPy itself, it only uses them when the
notebook already has.
"""

from __future__ import annotations

from . import _rpc
from .history import reopen_history
from .idle import load_ipython_extension, unload_ipython_extension
from .offload import offload_tensors, reload_tensors, reload_tensors_from
from .reseed import reseed
from .snapshot import snapshot_load, snapshot_prepare, snapshot_save
from .trim import prepare_suspend
from .widgets import widget_states

__all__ = ["load_ipython_extension", "offload_tensors", "prepare_suspend", "reload_tensors", "reload_tensors_from", "reopen_history", "reseed", "snapshot_load",
           "snapshot_prepare", "snapshot_save", "unload_ipython_extension", "widget_states"]

_rpc.register(prepare_suspend, offload_tensors, reload_tensors, reload_tensors_from, reopen_history, snapshot_save,
              snapshot_load, snapshot_prepare, widget_states)

"""Kernel side of jupyter-gpucr, loaded into an IPython kernel (``%load_ext gpucr_hooks``).

The server calls these functions by executing code silently in the kernel (see
``jupyter_gpucr.server.kernel_rpc``). Importing this package is cheap: it never imports
torch, CuPy, JAX or NumPy itself, it only uses them when the notebook already has.
"""

from __future__ import annotations

from typing import Any

from . import _rpc, notice
from .notice import after_restore, format_duration
from .snapshot import snapshot_load, snapshot_save
from .trim import prepare_suspend

__all__ = [
    "after_restore",
    "format_duration",
    "load_ipython_extension",
    "prepare_suspend",
    "snapshot_load",
    "snapshot_save",
    "unload_ipython_extension",
]


def load_ipython_extension(ip: Any) -> None:
    """Register the hook that shows a pending "restored" notice in the next cell's output."""
    ip.events.register("pre_run_cell", notice.show_pending)


def unload_ipython_extension(ip: Any) -> None:
    """Undo :func:`load_ipython_extension` (``%unload_ext`` / ``%reload_ext``)."""
    ip.events.unregister("pre_run_cell", notice.show_pending)


_rpc.register(prepare_suspend, after_restore, snapshot_save, snapshot_load)

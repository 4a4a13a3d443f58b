"""Who runs CRIU for this server: the server itself (root or the CRIU capabilities) or, for an
unprivileged server such as a JupyterHub user's, the gpucr daemon when its socket answers."""
from __future__ import annotations

from dataclasses import dataclass

from ..core.backend import CheckpointBackend
from ..core.checkpointer import Checkpointer
from ..core.process.privileges import check_privileges
from ..core.sizes import parse_size
from ..core.storage.openfiles import OpenFiles
from ..core.storage.store import Store
from ..daemon.client import DaemonCheckpointer, DaemonClient
from .config import GPUCR
from .remote import remote_url


@dataclass(frozen=True)
class Backend:
    """``kind`` is "local", "daemon" or "none" (only the snapshot engine); ``why`` says why."""

    kind: str
    why: str


def choose_backend(config: GPUCR) -> Backend:
    privileges = check_privileges()
    if privileges.ok:
        return Backend("local", f"this server may run CRIU ({privileges.detail})")
    if config.daemon_socket:
        reason = DaemonClient(config.daemon_socket).unavailable_reason()
        if reason is None:
            return Backend("daemon", f"through the gpucr daemon at {config.daemon_socket}")
        return Backend("none", f"no checkpoint privileges ({privileges.detail}) and {reason}")
    return Backend("none", f"no checkpoint privileges ({privileges.detail}) and no daemon configured (c.GPUCR.daemon_socket)")


def build_checkpointer(config: GPUCR, backend: Backend, store: Store, max_bytes: int) -> CheckpointBackend:
    """A core Checkpointer, or one whose privileged work the daemon does."""
    if backend.kind == "daemon":
        return DaemonCheckpointer(store, config.daemon_socket, keep_last=config.keep_last, max_bytes=max_bytes)
    # checkpoints uploaded for other nodes keep what those nodes lack of the files a kernel holds open
    open_files = OpenFiles(tuple(config.shared_paths), parse_size(config.max_scratch_bytes)) if remote_url(config) else None
    return Checkpointer(store, criu_path=config.criu_path or None, keep_last=config.keep_last, max_bytes=max_bytes,
                        lock_timeout_ms=config.lock_timeout_ms, lazy_restore=config.lazy_restore,
                        network_lock_hold=config.network_lock_hold, open_files=open_files)

"""What a front end (the Jupyter server) needs of whoever checkpoints its processes.

Two implement it: :class:`~jupyter_gpucr.core.checkpointer.Checkpointer`, which runs CRIU and the
driver in this process, and :class:`~jupyter_gpucr.daemon.client.DaemonCheckpointer`, which has
the gpucr daemon run them. Both free the GPU before they call ``before_dump``, and call it before
CRIU freezes the process.
"""
from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from .criu.images import RegFile, RunningAgain, read_image
from .errors import PreconditionError
from .process.running import Running
from .recovery import Recovery
from .storage import chain
from .storage.store import Checkpoint, Store

Progress = Callable[[str, int, int], None]
#: Entered with (name, checkpoint id, images folder) while CRIU writes a dump's images.
BesideDump = Callable[[str, str, Path], AbstractContextManager[Any]]


def _no_progress(phase: str, done: int, total: int) -> None:
    pass


class CheckpointBackend(Protocol):
    """Start, checkpoint, restore and recover processes of one store (see the module docstring).
    Both implementations subclass it, so that the optional abilities at its end have defaults: a
    backend that has one overrides it, and callers ask instead of checking a backend's class."""

    store: Store
    keep_last: int
    max_bytes: int | None

    def unavailable_reason(self) -> str | None:
        """None when checkpoints can be taken; else why not, in a sentence's words."""

    def run(self, name: str, command: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
            detach: bool = True) -> Running: ...

    def checkpoint(self, target: str, leave_running: bool = False, reason: str = "manual",
                   extra: dict[str, Any] | None = None, progress: Progress = _no_progress,
                   before_dump: Callable[[], None] | None = None, also_durable: Sequence[Path] = (),
                   incremental: bool = False, running_again: RunningAgain | None = None) -> Checkpoint:
        """A complete checkpoint of ``target``. ``before_dump`` runs once the GPU is free and
        before CRIU freezes the process; if it raises, the process runs on as before.
        ``incremental``: only what changed since the last save point, where that can be done.
        ``running_again`` (with ``leave_running``): called as soon as the process runs on, where
        that is before the checkpoint is complete (``criu.images.RunningAgain``); never otherwise."""

    def restore(self, name: str, gpu: str | int | None = "auto", checkpoint_id: str | None = None,
                progress: Progress = _no_progress, detach: bool = True,
                gpu_bytes_beside: Mapping[str, int] | None = None) -> Running: ...

    def await_pages(self, name: str) -> None: ...

    def recover_all(self, wait_s: float = ...) -> dict[str, Recovery]: ...

    def remove(self, target: str, kill: bool = False) -> builtins.list[str]: ...

    # -- optional abilities: their defaults say the backend lacks them ------------------------
    def cannot_fork(self) -> str | None:
        """Why this backend makes no copies of a process (forks); None when it does."""
        return "its checkpoint backend does not copy processes"

    def cannot_save_points(self) -> str | None:
        """Why this backend keeps no save points (checkpoints a process goes back to under its own
        name: a dump that leaves it running, copies of checkpoints); None when it does."""
        return self.cannot_fork()

    def copy_checkpoint(self, cid: str, reason: str, extra: dict[str, Any] | None = None,
                        drop: tuple[str, ...] = ()) -> Checkpoint:
        """A copy of checkpoint ``cid`` of hard links, as ``Store.copy_checkpoint`` makes it."""
        return self.store.copy_checkpoint(cid, reason, extra, drop)

    def image_files(self, ckpt: Checkpoint) -> builtins.list[RegFile]:
        """The files the image of ``ckpt`` has open or mapped (its restore reopens them by path)."""
        return read_image(ckpt.images).files

    def share_pages(self, cid: str, base_id: str) -> int | None:
        """Rewrite checkpoint ``cid`` to take its pages equal to ``base_id``'s from it
        (``chain.share_pages``); its bytes then, or None where the backend shares no pages."""
        return chain.share_pages(self.store, cid, base_id).size

    def fork(self, name: str, count: int = 1, names: Sequence[str] | None = None, gpu: str | int | None = "auto",
             detach: bool = True, gpu_bytes_beside: Mapping[str, int] | None = None,
             checkpoint_id: str | None = None) -> builtins.list[Running]:
        """``count`` copies of ``name``, each in namespaces of its own (see ``Checkpointer.fork``)."""
        raise PreconditionError(f"Processes cannot be forked here: {self.cannot_fork()}.",
                                "Suspend and restore work as before.")

    def stream_dumps_to(self, beside: BesideDump) -> bool:
        """Have each dump that stops its process enter ``beside`` (name, checkpoint id, images
        folder) while CRIU writes the images, for an upload that ends soon after the dump; False
        when this process cannot read the images as they are written (the daemon's store)."""
        return False

    def image_problem(self, ckpt: Checkpoint) -> str | None:
        """Why the whole-process image of ``ckpt`` cannot run on this node; None when it can, or when
        the backend finds that out on its own side (the daemon, at the restore)."""
        return None

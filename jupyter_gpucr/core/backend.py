"""What a front end (the Jupyter server) needs of whoever checkpoints its processes.

Two implement it: :class:`~jupyter_gpucr.core.checkpointer.Checkpointer`, which runs CRIU and the
driver in this process, and :class:`~jupyter_gpucr.daemon.client.DaemonCheckpointer`, which has
the gpucr daemon run them. Both free the GPU before they call ``before_dump``, and call it before
CRIU freezes the process.
"""
from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from .process.running import Running
from .recovery import Recovery
from .storage.store import Checkpoint, Store

Progress = Callable[[str, int, int], None]


def _no_progress(phase: str, done: int, total: int) -> None:
    pass


class CheckpointBackend(Protocol):
    """Start, checkpoint, restore and recover processes of one store (see the module docstring)."""

    @property
    def store(self) -> Store: ...

    @property
    def keep_last(self) -> int: ...

    @property
    def max_bytes(self) -> int | None: ...

    def unavailable_reason(self) -> str | None:
        """None when checkpoints can be taken; else why not, in a sentence's words."""

    def run(self, name: str, command: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
            detach: bool = True) -> Running: ...

    def checkpoint(self, target: str, leave_running: bool = False, reason: str = "manual",
                   extra: dict[str, Any] | None = None, progress: Progress = _no_progress,
                   before_dump: Callable[[], None] | None = None, also_durable: Sequence[Path] = ()) -> Checkpoint:
        """A complete checkpoint of ``target``. ``before_dump`` runs once the GPU is free and
        before CRIU freezes the process; if it raises, the process runs on as before."""

    def restore(self, name: str, gpu: str | int | None = "auto", checkpoint_id: str | None = None,
                progress: Progress = _no_progress, detach: bool = True,
                gpu_bytes_beside: Mapping[str, int] | None = None) -> Running: ...

    def await_pages(self, name: str) -> None: ...

    def recover_all(self, wait_s: float = ...) -> dict[str, Recovery]: ...

    def remove(self, target: str, kill: bool = False) -> builtins.list[str]: ...

"""What the checkpointer's steps and the checkpointer that runs them agree on: what a step reads
of the checkpointer, how progress is reported, and the checks someone CRIU's root must not trust
asks for around every restore (the gpucr daemon's users)."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol

from ..criu.commands import Criu
from ..errors import GPUCRError
from ..storage.openfiles import OpenFiles
from ..storage.store import Store

Progress = Callable[[str, int, int], None]


def no_progress(phase: str, done: int, total: int) -> None:
    pass


class RestoreCheck(Protocol):
    """Checks around every restore for someone CRIU's root must not trust (the daemon's users).
    ``approve`` reads the images before CRIU starts and refuses by raising; what it returns are
    options for ``criu restore``; ``handed``: files of the image that the holder opens itself and
    hands to CRIU (image path -> path to open); ``refused`` says why a failed restore was refused."""

    def approve(self, images: Path, workdir: Path) -> list[str]: ...

    def handed(self, images: Path, proc_dir: Path) -> dict[str, str]: ...

    def refused(self, workdir: Path) -> GPUCRError | None: ...


class CheckpointerParts(Protocol):
    """What the steps read of the checkpointer that runs them (``Checkpointer`` is the one: it
    calls the steps, which do not import it). See its constructor for what each option means."""

    @property
    def store(self) -> Store: ...

    @property
    def criu(self) -> Criu: ...

    @property
    def keep_last(self) -> int: ...

    @property
    def max_bytes(self) -> int | None: ...

    @property
    def lock_timeout_ms(self) -> int: ...

    @property
    def check_space(self) -> bool: ...

    @property
    def verify(self) -> bool: ...

    @property
    def lazy_restore(self) -> bool: ...

    @property
    def restore_check(self) -> RestoreCheck | None: ...

    @property
    def open_files(self) -> OpenFiles | None: ...

    @property
    def full_dumps(self) -> str | None: ...

    @property
    def beside_dump(self) -> Callable[[str, str, Path], AbstractContextManager[Any]] | None: ...

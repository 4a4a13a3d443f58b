"""One operation at a time per process name, across processes (flock on a file in its dir)."""
from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import BusyError


@contextmanager
def exclusive(proc_dir: Path, name: str, what: str) -> Iterator[None]:
    path = proc_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another operation"
            raise BusyError(
                f"{name!r} is busy: {holder} is in progress.",
                "Wait for it to finish, then try again.",
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        yield
    finally:
        os.close(fd)

"""One operation at a time per process name, across processes (flock on a file in its dir)."""
from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import BusyError


def _holder(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "another operation"


@contextmanager
def exclusive(proc_dir: Path, name: str, what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the process's lock for ``what``; BusyError when another operation holds it: at once,
    or with ``wait_s``, once it still holds it after that long."""
    path = proc_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    waited = f" (waited {wait_s:g} s)" if wait_s else ""
                    raise BusyError(
                        f"{name!r} is busy: {_holder(fd)} is in progress{waited}.",
                        "It takes longer than a checkpoint should: see the process's logs in the store "
                        "(holder.log, dump-failed.log), then try again." if wait_s else
                        "Wait for it to finish, then try again.",
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        yield
    finally:
        os.close(fd)

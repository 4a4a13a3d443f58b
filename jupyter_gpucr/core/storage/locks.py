"""One operation at a time per process name, across processes (flock on a file in its dir).

The holder writes what it does into the lock file and empties it as it lets go. An flock belongs
to the open file, which a child forked at that moment shares until it execs or exits (any
``subprocess`` start in another thread of the same server): the lock can then outlive its
holder by a few milliseconds. A holder killed with SIGKILL cannot empty the file, and a child it
was starting holds the lock until it execs (under load, tens of milliseconds after the kill). A
lock that is held while its file is empty, or names a process that is gone, is such a leftover (or
a holder between taking it and writing its name), so it is waited for, up to ``LEFTOVER_WAIT_S``,
instead of being reported as an operation in progress that has already ended.
"""
from __future__ import annotations

import fcntl
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..errors import BusyError
from ..process.procs import is_alive

#: How long a lock held with no operation named in it is waited for (see the module docstring).
LEFTOVER_WAIT_S = 10.0


_HOLDER_PID = re.compile(r"\(pid (\d+)\)$")


def _holder(fd: int) -> str:
    """What the holder wrote it does, while it runs; empty once it has let go or is gone."""
    holder = os.pread(fd, 200, 0).decode(errors="replace").strip()
    named = _HOLDER_PID.search(holder)
    return "" if named and not is_alive(int(named.group(1))) else holder


@contextmanager
def exclusive(proc_dir: Path, name: str, what: str, wait_s: float = 0.0) -> Iterator[None]:
    """Hold the process's lock for ``what``; BusyError when another operation holds it: at once,
    or with ``wait_s``, once it still holds it after that long."""
    path = proc_dir / ".lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        started = time.monotonic()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                waited_s = time.monotonic() - started
                if waited_s >= wait_s and (holder or waited_s >= LEFTOVER_WAIT_S):
                    waited = f" (waited {wait_s:g} s)" if wait_s else ""
                    raise BusyError(
                        f"{name!r} is busy: {holder or 'another operation'} is in progress{waited}.",
                        "It takes longer than a checkpoint should: see the process's logs in the store "
                        "(holder.log, dump-failed.log), then try again." if wait_s else
                        "Wait for it to finish, then try again.",
                    ) from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{what} (pid {os.getpid()})".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)

"""Start putting written file ranges on disk without waiting (``sync_file_range``).

A checkpoint is durable only after fsync; but fsync starts the disk on everything at once at the
end. Handing complete ranges to the disk while the rest is still being written keeps it busy
from the start, so the final fsync has little left. Best effort: where the call is missing or
fails nothing changes but the timing (tmpfs ignores it).
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

SYNC_FILE_RANGE_WRITE = 2

_libc = ctypes.CDLL(None, use_errno=True)
_sync_file_range = getattr(_libc, "sync_file_range", None)
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def start_writeback(path: Path, offset: int, length: int) -> None:
    """Ask the kernel to begin writing ``length`` bytes of ``path`` from ``offset`` to disk."""
    if _sync_file_range is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        _sync_file_range(fd, offset, length, SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)

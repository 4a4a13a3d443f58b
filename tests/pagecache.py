"""Page cache residency of files, for the prefetch test and bench: how much of them is in memory
(mincore on a read-only mapping), dropping them from it (as after a reboot), and how much the
block device under a folder has written (whether dirty pages reached the disk)."""
from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Iterable
from pathlib import Path

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]


def resident_fraction(files: Iterable[Path]) -> float:
    pages = resident = 0
    for path in files:
        size = path.stat().st_size
        if not size:
            continue
        n = (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
        vec = ctypes.create_string_buffer(n)
        fd = os.open(path, os.O_RDONLY)
        try:
            addr = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
            try:
                if _libc.mincore(addr, size, vec) != 0:
                    raise OSError(ctypes.get_errno(), f"mincore failed on {path}")
            finally:
                _libc.munmap(addr, size)
        finally:
            os.close(fd)
        pages += n
        resident += sum(b & 1 for b in vec.raw)
    return resident / max(pages, 1)


def evict(files: Iterable[Path]) -> None:
    """Drop the files' clean pages from the page cache (any user can, for files it may read)."""
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def block_device_stat(path: Path) -> Path | None:
    """The sysfs ``stat`` of the block device holding ``path``; None where there is none of its
    own (tmpfs, overlay)."""
    dev = os.stat(path).st_dev
    stat = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}/stat")
    return stat if stat.exists() else None


def device_counters(stat: Path) -> dict[str, int]:
    """The device's counters since boot (Documentation/block/stat.rst): bytes read, written and
    discarded, and milliseconds it had I/O in flight."""
    f = [int(x) for x in stat.read_text().split()]
    return {"read": f[2] * 512, "written": f[6] * 512, "busy_ms": f[9], "discarded": f[13] * 512 if len(f) > 13 else 0}

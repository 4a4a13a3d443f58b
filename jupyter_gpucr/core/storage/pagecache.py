"""Read a checkpoint into the page cache before it is needed.

Opening a notebook whose kernel is on disk says the user is about to come back. Reading the image
then (in the background, at idle I/O priority) turns the restore that follows into a read from
memory, which on a cold disk is most of a restore. A restore that starts on a cold disk reads the
kernel's offloaded tensors ahead the same way, with several readers at normal priority, once the
process's own image is read (CRIU, the page daemon and the checksums need that first; the tensors
only when the driver has restored), while the driver and the refill do their part. Nothing is
kept in this process: the pages belong to the kernel's page cache, which drops them again under
memory pressure.
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

CHUNK = 8 << 20


def prefetch(paths: Iterable[Path]) -> int:
    """Read every file under ``paths`` (files or directories) once, at idle I/O priority (for
    this thread only, put back afterwards); returns the bytes read. Files that vanish or cannot
    be read are skipped: a prefetch never fails anything."""
    thread = psutil.Process(threading.get_native_id())  # Linux I/O priorities are per thread
    before = thread.ionice()
    thread.ionice(psutil.IOPRIO_CLASS_IDLE)
    try:
        buf = bytearray(CHUNK)
        return sum(_read(file, buf) for file in _files(paths))
    finally:
        thread.ionice(before.ioclass, before.value if before.ioclass not in (0, psutil.IOPRIO_CLASS_IDLE) else None)


def read_ahead(paths: Iterable[Path], stop: threading.Event, threads: int = 8,
               start: threading.Event | None = None) -> int:
    """Read every file under ``paths`` into the page cache with ``threads`` readers (a disk gives
    its whole bandwidth only to several), once ``start`` is set, until done or ``stop`` is set;
    returns the bytes read."""
    if start is not None:
        start.wait()
    if stop.is_set():
        return 0
    files = _files(paths)
    with ThreadPoolExecutor(max(1, min(threads, len(files)))) as pool:
        return sum(pool.map(lambda file: _read(file, bytearray(CHUNK), stop), files))


def in_memory(path: Path) -> bool:
    """Whether ``path`` lies on tmpfs or ramfs (the mount with the longest matching prefix): there,
    nothing is worth reading ahead."""
    real = os.path.realpath(path)
    best, fstype = "", ""
    for part in psutil.disk_partitions(all=True):
        mount = part.mountpoint
        if (real == mount or real.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
            best, fstype = mount, part.fstype
    return fstype in ("tmpfs", "ramfs")


def _files(paths: Iterable[Path]) -> list[Path]:
    return [file for path in paths for file in (sorted(path.rglob("*")) if path.is_dir() else [path])]


def _read(file: Path, buf: bytearray, stop: threading.Event | None = None) -> int:
    """Read one regular file through ``buf`` (until ``stop`` is set); what fails is skipped."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return 0
    done = 0
    try:
        if not os.path.isfile(f"/proc/self/fd/{fd}"):
            return 0
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
        while (stop is None or not stop.is_set()) and (n := os.readv(fd, [buf])):
            done += n
    except OSError:
        pass
    finally:
        os.close(fd)
    return done

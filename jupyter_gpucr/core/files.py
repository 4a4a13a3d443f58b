"""Files gpucr writes: private to their owner (a checkpoint holds all of a process's memory), and
on disk before a rename publishes them.

The store, CRIU's runner, the checkpointer and the daemon all write such files; none of them owns
these rules, so they live here, below all of them.
"""
from __future__ import annotations

import ctypes
import os
from collections import deque
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def make_private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def tighten_permissions(root: Path) -> None:
    """Make everything below ``root`` private (CRIU and loggers create files with their own modes)."""
    os.chmod(root, 0o700)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, 0o600)


def fsync_path(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """Put every file below ``root`` on disk, then the directories naming them, so that a rename
    published afterwards never points at images a power loss could still take away. The files
    are flushed in parallel: one at a time leaves the disk's queue mostly empty."""
    walked = list(os.walk(root, topdown=False))
    files = [p for dirpath, _d, names in walked for p in (os.path.join(dirpath, f) for f in names) if not os.path.islink(p)]
    with ThreadPoolExecutor(max(1, min(len(files), 16))) as pool:
        list(pool.map(fsync_path, files))
    for dirpath, _d, _names in walked:  # deepest first
        fsync_path(dirpath)


def fsync_trees(roots: Iterable[Path]) -> None:
    """:func:`fsync_tree` on each of ``roots`` that exists (folders a checkpoint needs beside
    its images, which a process may not have written)."""
    for root in roots:
        if root.exists():
            fsync_tree(root)


def private_files(directory: Path, *names: str) -> None:
    """Create (or make) these files 0600 before a process opens them: its output and databases
    hold its data, and CRIU checks their modes at restore, so they must never change later."""
    for name in names:
        path = directory / name
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
        os.chmod(path, 0o600)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def copy_data(src: Path, dst: Path, start: int, limit: int) -> int:
    """Copy what ``src`` holds from ``start`` on into a new ``dst``: its data only, holes left out,
    at most the newest ``limit`` bytes of it, read in chunks. ``src`` may be a file its user can
    grow (a process's log), sparse and as large as the file system allows. The bytes copied."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        ranges = _newest_data(fd, start, limit)
        copied = 0
        with open(dst, "xb") as out:
            for at, end in ranges:
                while at < end:
                    chunk = os.pread(fd, min(_CHUNK, end - at), at)
                    if not chunk:
                        break
                    out.write(chunk)
                    at += len(chunk)
                    copied += len(chunk)
        return copied
    finally:
        os.close(fd)


_CHUNK = 1 << 20


def _newest_data(fd: int, start: int, limit: int) -> deque[tuple[int, int]]:
    """The ranges of ``fd`` past ``start`` that hold data, the newest ``limit`` bytes of them."""
    size = os.fstat(fd).st_size
    ranges: deque[tuple[int, int]] = deque()
    total, at = 0, start
    while at < size:
        try:
            data = os.lseek(fd, at, os.SEEK_DATA)
        except OSError:  # ENXIO: only a hole is left
            break
        at = min(os.lseek(fd, data, os.SEEK_HOLE), size)
        ranges.append((data, at))
        total += at - data
        while total > limit:
            first, end = ranges.popleft()
            if total - (end - first) < limit:
                ranges.appendleft((end - (limit - (total - (end - first))), end))
                total = limit
            else:
                total -= end - first
    return ranges


_RENAME_EXCHANGE = 2  # <linux/fs.h>
_libc = ctypes.CDLL(None, use_errno=True)


def exchange(a: Path, b: Path) -> None:
    """Swap two paths of one file system in one step (``renameat2`` with ``RENAME_EXCHANGE``):
    whoever looks finds either the old or the new directory at each, never neither."""
    if _libc.renameat2(-100, os.fsencode(a), -100, os.fsencode(b), _RENAME_EXCHANGE) != 0:  # AT_FDCWD
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), str(a), None, str(b))

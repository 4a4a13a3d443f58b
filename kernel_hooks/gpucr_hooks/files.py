"""Private, atomic snapshot directories: a failed save must leave nothing that looks complete."""

from __future__ import annotations

import contextlib
import ctypes
import io
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO


@contextlib.contextmanager
def atomic_directory(path: Path) -> Iterator[Path]:
    """Yield a fresh 0700 directory beside ``path``; it becomes ``path`` only if the block succeeds.

    ``path`` may not exist yet (missing parents are created 0700) or be an empty directory.
    """
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path} already exists and is not an empty directory")
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent))
    try:
        yield staging
        _fsync(staging)
        os.replace(staging, path)
        _fsync(path.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


@contextlib.contextmanager
def private_file(path: Path) -> Iterator[BinaryIO]:
    """Create ``path`` (0600, must not exist) for writing; flushed to disk on success."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as f:
        yield f
        f.flush()
        os.fsync(f.fileno())


def write_private(path: Path, data: bytes) -> None:
    """Write a small file with :func:`private_file`."""
    with private_file(path) as f:
        f.write(data)


def readinto_exactly(f: io.BufferedIOBase, buffer: memoryview) -> None:
    """Fill ``buffer`` from ``f``; a short file is an error, not silent zeros."""
    while len(buffer):
        n = f.readinto(buffer)
        if not n:
            raise EOFError(f"{getattr(f, 'name', 'file')} ended early")
        buffer = buffer[n:]


def pread_into(fd: int, address: int, n: int, offset: int) -> None:
    """Read ``n`` bytes at ``offset`` of ``fd`` into memory at ``address`` (the GIL released
    while the kernel copies); a short file is an error."""
    view = memoryview((ctypes.c_char * n).from_address(address)).cast("B")
    while len(view):
        got = os.preadv(fd, [view], offset)
        if not got:
            raise EOFError(f"the file ends at byte {offset}, before the bytes it should hold")
        view, offset = view[got:], offset + got


def _fsync(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

"""Checksums of checkpoint files, computed in parallel at memory speed (XXH3-128).

Images are many GB; a cryptographic hash would add seconds per GB to every suspend and
restore. XXH3 detects corruption (the goal here). Files are hashed in 256 MiB chunks on a
thread pool (xxhash releases the GIL), so one large pages image uses every core; a file's
digest is the XXH3 of its chunk digests (the chunk size is part of the format).
"""
from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Final, TypedDict

import xxhash

from .writeback import start_writeback

ALGORITHM: Final = "xxh3_128"
CHUNK = 256 << 20
_READ = 16 << 20
#: Threads that hash a dump's chunks while CRIU writes it: enough to keep up with CRIU's one
#: writing thread on a large machine, one on a small one (they run at the lowest priority).
_BESIDE_THE_DUMP = max(1, min(4, (os.cpu_count() or 1) // 4))

ChunkDigest = Callable[[Path, int, int], bytes]


class FileDigest(TypedDict):
    """A file of a checkpoint: its size and XXH3-128 digest (the manifest's ``files``)."""

    size: int
    xxh3_128: str


def _chunk_digest(path: Path, offset: int, length: int) -> bytes:
    """Digest of one chunk, read in large pieces (a file on a cold disk is read ahead this way)."""
    h = xxhash.xxh3_128()
    buf = bytearray(_READ)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY)
    try:
        end = offset + length
        while offset < end:
            n = os.preadv(fd, [view[: min(_READ, end - offset)]], offset)
            if n <= 0:
                break
            h.update(view[:n])
            offset += n
    finally:
        os.close(fd)
    return h.digest()


def _chunk_digest_in_place(path: Path, offset: int, length: int) -> bytes:
    """Digest of one chunk of a complete file just written, so in memory: hashed where its pages
    lie, without copying them first (1.6x as fast as reading on the CPU machine)."""
    if length == 0:
        return xxhash.xxh3_128().digest()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), length, access=mmap.ACCESS_READ, offset=offset) as m:
        return xxhash.xxh3_128(m).digest()


def _digests(files: list[Path], done: dict[Path, list[bytes]] | None = None,
             chunk_digest: ChunkDigest = _chunk_digest) -> list[str]:
    """Digest of each file; ``done`` holds chunk digests already computed from the start of a file."""
    done = done or {}
    jobs = [(i, p, off, min(CHUNK, size - off))
            for i, (p, size) in enumerate((p, p.stat().st_size) for p in files)
            for off in range(len(done.get(p, [])) * CHUNK, max(size, 1), CHUNK)]
    with ThreadPoolExecutor(max(1, min(len(jobs), os.cpu_count() or 1, 16))) as pool:
        parts = list(pool.map(lambda j: chunk_digest(j[1], j[2], j[3]), jobs))
    per_file: list[list[bytes]] = [list(done.get(p, [])) for p in files]
    for (i, *_), digest in zip(jobs, parts):
        per_file[i].append(digest)
    return [xxhash.xxh3_128_hexdigest(b"".join(d)) for d in per_file]


def digest_tree(root: Path) -> dict[str, FileDigest]:
    """Map each regular file below ``root`` (relative path) to its size and digest."""
    return digest_files(root, [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and not p.is_symlink()])


def digest_files(root: Path, names: list[str]) -> dict[str, FileDigest]:
    """Size and digest of each of the files ``names`` (relative to ``root``), as :func:`digest_tree` gives them."""
    files = [root / n for n in sorted(names)]
    return {str(p.relative_to(root)): {"size": p.stat().st_size, ALGORITHM: d}
            for p, d in zip(files, _digests(files))}


class DigestWhileWriting:
    """Hash the complete 256 MiB chunks of files while CRIU is still writing them, so that
    only the tails are left when the dump ends and checksums add almost nothing to a suspend;
    each hashed chunk is handed to the disk right away.

    Safe because CRIU writes every image file sequentially and never rewrites what it wrote;
    only bytes below the file's current size, in whole chunks, are read.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._chunks: dict[Path, list[Future[bytes]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._pool = ThreadPoolExecutor(_BESIDE_THE_DUMP, thread_name_prefix="gpucr-digest",
                                        initializer=_lowest_priority)
        # Its own thread: handing a range to a busy disk can block, and the digests must not wait for that.
        self._to_disk = ThreadPoolExecutor(1, thread_name_prefix="gpucr-writeback")

    def __enter__(self) -> DigestWhileWriting:
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is not None:  # the dump failed: nothing will ask for the digests
            self._pool.shutdown(cancel_futures=True)
            self._to_disk.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for p in [p for p in self.root.glob("*.img") if p.is_file()]:
                chunks = self._chunks.setdefault(p, [])
                size = p.stat().st_size
                while not self._stop.is_set() and size >= (len(chunks) + 1) * CHUNK:
                    chunks.append(self._pool.submit(self._digest_and_hand_to_disk, p, len(chunks) * CHUNK))

    def _digest_and_hand_to_disk(self, path: Path, offset: int) -> bytes:
        # Read, not mapped, while CRIU runs: a file cut short under a mapping would kill this
        # process (SIGBUS); a read only comes up short. The tail, once CRIU is done, is mapped.
        digest = _chunk_digest(path, offset, CHUNK)
        self._to_disk.submit(start_writeback, path, offset, CHUNK)  # the commit's fsync finds it (mostly) on disk
        return digest

    def result(self) -> dict[str, FileDigest]:
        """Digests of every file below ``root``, like :func:`digest_tree`; call after the writer ended."""
        done = {p: [f.result() for f in chunks] for p, chunks in self._chunks.items()}
        self._pool.shutdown()
        self._to_disk.shutdown(wait=False, cancel_futures=True)  # the commit's fsync writes what is left
        files = sorted(p for p in self.root.rglob("*") if p.is_file() and not p.is_symlink())
        return {str(p.relative_to(self.root)): {"size": p.stat().st_size, ALGORITHM: d}
                for p, d in zip(files, _digests(files, done, _chunk_digest_in_place))}


def _lowest_priority() -> None:
    """The dump must never wait for its own checksums."""
    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)


def find_mismatches(root: Path, expected: dict[str, FileDigest], contents: bool = True) -> list[str]:
    """Return human-readable problems; empty when every file is present and intact (without
    ``contents``: present with its size)."""
    problems, present = [], []
    for rel, meta in expected.items():
        p = root / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != meta["size"]:
            problems.append(f"{rel}: size {p.stat().st_size}, expected {meta['size']}")
        else:
            present.append(rel)
    if not contents:
        return problems
    for rel, digest in zip(present, _digests([root / r for r in present])):
        if digest != expected[rel][ALGORITHM]:
            problems.append(f"{rel}: checksum mismatch")
    return problems

"""Checksums of checkpoint files, computed in parallel at memory speed (XXH3-128).

Images are many GB; a cryptographic hash would add seconds per GB to every suspend and
restore. XXH3 detects corruption (the goal here), and threads hash files side by side
because xxhash releases the GIL.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import xxhash

ALGORITHM = "xxh3_128"
_CHUNK = 8 << 20


def file_digest(path: Path) -> str:
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(_CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def digest_tree(root: Path, exclude: frozenset[str] = frozenset()) -> dict[str, dict[str, int | str]]:
    """Map each regular file below ``root`` (relative path) to its size and digest."""
    files = sorted(
        p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and p.name not in exclude
    )
    workers = max(1, min(len(files), os.cpu_count() or 1, 8))
    with ThreadPoolExecutor(workers) as pool:
        digests = list(pool.map(file_digest, files))
    return {
        str(p.relative_to(root)): {"size": p.stat().st_size, "xxh3_128": d}
        for p, d in zip(files, digests)
    }


def find_mismatches(root: Path, expected: dict[str, dict[str, int | str]]) -> list[str]:
    """Return human-readable problems; empty when every file is present and intact."""
    problems = []
    present = {}
    for rel, meta in expected.items():
        p = root / rel
        if not p.is_file():
            problems.append(f"{rel}: missing")
        elif p.stat().st_size != meta["size"]:
            problems.append(f"{rel}: size {p.stat().st_size}, expected {meta['size']}")
        else:
            present[rel] = p
    with ThreadPoolExecutor(max(1, min(len(present), os.cpu_count() or 1, 8))) as pool:
        for rel, digest in zip(present, pool.map(file_digest, present.values())):
            if digest != expected[rel][ALGORITHM]:
                problems.append(f"{rel}: checksum mismatch")
    return problems

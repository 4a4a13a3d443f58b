"""A resume from a cold disk reads the kernel's offloaded tensors ahead, in parallel, while CRIU
restores the process: the files end up in the page cache (checked with mincore after evicting
them), a stop ends the reading early, and a store in memory is recognised (nothing to read ahead)."""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from jupyter_gpucr.core import pagecache

from .pagecache import evict, resident_fraction


def test_read_ahead_fills_the_page_cache(tmp_path):
    if pagecache.in_memory(tmp_path):
        pytest.skip("the temporary folder is in memory: nothing to evict")
    folder = tmp_path / "gpu-tensors"
    folder.mkdir()
    files = [folder / f"{i}.bin" for i in range(4)]
    for f in files:
        f.write_bytes(os.urandom(8 << 20))
        with open(f, "rb+") as fh:
            os.fsync(fh.fileno())
    evict(files)
    assert resident_fraction(files) == 0.0
    assert pagecache.read_ahead([folder], threading.Event()) == 32 << 20
    assert resident_fraction(files) == 1.0


def test_a_stopped_read_ahead_reads_nothing_more(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x" * (16 << 20))
    stop = threading.Event()
    stop.set()
    assert pagecache.read_ahead([tmp_path], stop) == 0


def test_a_store_in_memory_is_recognised(tmp_path):
    for path in (Path("/dev/shm"), tmp_path):  # against coreutils' answer for the same folder
        if path.is_dir():
            fstype = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True).stdout.strip()
            assert pagecache.in_memory(path / "gpu-tensors") == (fstype in ("tmpfs", "ramfs")), fstype

"""A resume from a cold disk reads the kernel's offloaded tensors ahead, in parallel, once the
process's own image is read: the files end up in the page cache (checked with mincore after
evicting them), nothing is read before the start, a stop ends the reading early, and a store in
memory is recognised (nothing to read ahead)."""
from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from jupyter_gpucr.core.storage import pagecache
from tests.pagecache import evict, resident_fraction

#: Of the files, what must be in the page cache after reading ahead: clean pages may be reclaimed
#: at any moment under memory pressure (a CI run once lost 2 pages of 8192 in between).
FILLED = 0.99


def _evicted_tensors(tmp_path: Path) -> tuple[Path, list[Path]]:
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
    return folder, files


def test_read_ahead_fills_the_page_cache(tmp_path):
    folder, files = _evicted_tensors(tmp_path)
    assert pagecache.read_ahead([folder], threading.Event()) == 32 << 20
    assert resident_fraction(files) >= FILLED


def test_read_ahead_waits_for_the_process_image_to_be_read(tmp_path):
    folder, files = _evicted_tensors(tmp_path)
    start, stop, result = threading.Event(), threading.Event(), []
    reader = threading.Thread(target=lambda: result.append(pagecache.read_ahead([folder], stop, start=start)))
    reader.start()
    reader.join(0.5)
    assert reader.is_alive() and resident_fraction(files) == 0.0  # the image comes first
    start.set()
    reader.join(30)
    assert result == [32 << 20] and resident_fraction(files) >= FILLED


def test_a_restore_that_fails_before_its_images_are_read_reads_no_tensors(tmp_path):
    folder, files = _evicted_tensors(tmp_path)
    start, stop = threading.Event(), threading.Event()
    stop.set()  # what the server does when the restore failed: stop, then start
    start.set()
    assert pagecache.read_ahead([folder], stop, start=start) == 0
    assert resident_fraction(files) == 0.0


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

"""A kernel's offloaded tensors reach the disk while the kernel still writes them: the server
hands each appended MiB to the disk (``sync_file_range``) from a thread of its own, so the disk
is busy from the start of a suspend. Checked against the block device's own count of written
sectors, before any fsync (the kernel's own flusher waits 30 s before it writes dirty pages)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jupyter_gpucr.core.storage import writeback
from jupyter_gpucr.core.storage.writeback import WritebackWhileWriting
from tests.pagecache import block_device_stat, device_counters

MIB = 1 << 20


def _append_and_wait(folder: Path, stat: Path, total: int) -> int:
    """Append ``total`` bytes in 8 MiB writes, then give the disk up to 3 s; what it wrote."""
    before = device_counters(stat)["written"]
    with open(folder / "0.bin", "wb") as f:
        for _ in range(total // (8 * MIB)):
            f.write(os.urandom(8 * MIB))
            f.flush()
            time.sleep(0.02)
    deadline = time.monotonic() + 3
    while device_counters(stat)["written"] - before < total * 0.9 and time.monotonic() < deadline:
        time.sleep(0.05)
    return device_counters(stat)["written"] - before


@pytest.fixture
def on_disk(tmp_path: Path) -> tuple[Path, Path]:
    stat = block_device_stat(tmp_path)
    if stat is None:
        pytest.skip("the temporary folder is not on a block device of its own (tmpfs, overlay)")
    folder = tmp_path / "gpu-tensors"
    folder.mkdir()
    return folder, stat


def test_appended_bytes_reach_the_disk_while_they_are_written(on_disk):
    folder, stat = on_disk
    with WritebackWhileWriting(folder) as watcher:
        written = _append_and_wait(folder, stat, 96 * MIB)
    assert written >= 0.9 * 96 * MIB, f"the disk wrote {written >> 20} MiB of 96 before any fsync"
    watcher.thread.join(5)
    assert watcher.handed == {folder / "0.bin": 96 * MIB}


def test_a_folder_that_appears_later_or_never_is_no_error(tmp_path):
    folder = tmp_path / "not-yet"
    with WritebackWhileWriting(folder, interval=0.01) as watcher:
        time.sleep(0.05)
        folder.mkdir()
        (folder / "0.bin").write_bytes(b"x" * (3 * MIB + 5))
        time.sleep(0.1)
    watcher.thread.join(5)
    assert watcher.handed == {folder / "0.bin": 3 * MIB + 5}  # whole MiB while written, the tail at the end
    with WritebackWhileWriting(tmp_path / "never"):
        time.sleep(0.05)


def test_leaving_the_block_does_not_wait_for_the_disk(tmp_path, monkeypatch):
    """Run 47 on the H200: the server's event loop left the block and waited 2.5 s in
    sync_file_range behind a busy disk before it could free the GPU. The rest is handed over by
    the thread, which ends on its own."""
    folder = tmp_path / "gpu-tensors"
    folder.mkdir()
    handed: list[tuple[int, int]] = []

    def busy_disk(path: Path, offset: int, length: int) -> None:
        time.sleep(0.5)
        handed.append((offset, length))

    monkeypatch.setattr(writeback, "start_writeback", busy_disk)
    with WritebackWhileWriting(folder, interval=0.01) as watcher:
        (folder / "0.bin").write_bytes(b"x" * (2 * MIB))
        time.sleep(0.05)  # the thread is now inside the slow call
        with (folder / "0.bin").open("ab") as f:
            f.write(b"y" * 7)
        t0 = time.perf_counter()
    left_after = time.perf_counter() - t0
    assert left_after < 0.05, f"leaving the block took {left_after:.2f} s"
    watcher.thread.join(5)
    assert not watcher.thread.is_alive()
    assert handed == [(0, 2 * MIB), (2 * MIB, 7)]


def test_without_the_handover_the_disk_waits(on_disk, monkeypatch):
    """The control: the same writes with the handover switched off stay in the page cache."""
    folder, stat = on_disk
    monkeypatch.setattr(writeback, "start_writeback", lambda *a: None)
    with WritebackWhileWriting(folder):
        written = _append_and_wait(folder, stat, 96 * MIB)
    assert written < 0.5 * 96 * MIB, "something else flushed the page cache: this test cannot tell"
    os.sync()

"""The tensor offload's files, without a GPU: chunks written by parallel threads into one file
per writer come back byte for byte at the places recorded for them, and the folder is private
(tensors are the notebook's data). On this machine's real mounts: a disk folder and tmpfs."""
from __future__ import annotations

import ctypes
import os
import stat
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from gpucr_hooks import offload

CHUNK = 1 << 20


@pytest.fixture(params=["disk", "tmpfs"])
def folder(request, tmp_path):
    if request.param == "disk":
        yield str(tmp_path / "gpu-tensors")
        return
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm here")
    root = f"/dev/shm/gpucr-test-{os.getpid()}"
    os.mkdir(root, 0o700)
    yield f"{root}/gpu-tensors"
    offload._Stripes.remove_folder(f"{root}/gpu-tensors")
    os.rmdir(root)


def test_parallel_chunks_come_back_from_where_they_were_placed(folder):
    chunks = [bytes([i]) * CHUNK + os.urandom(64) for i in range(40)]
    buffers = [ctypes.create_string_buffer(c, len(c)) for c in chunks]
    offsets = [i * (CHUNK + 64) for i in range(len(chunks))]
    stripes = offload._Stripes.create(folder, 4)
    try:
        with ThreadPoolExecutor(8) as pool:  # more threads than files: a write waits for a free file
            list(pool.map(lambda i: stripes.write_placed(ctypes.addressof(buffers[i]), len(chunks[i]), offsets[i]),
                          range(len(chunks))))
        stripes.close()
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
        files = sorted(os.listdir(folder))
        tag = files[0].split("-")[0]
        assert files == [f"{tag}-{i}.bin" for i in range(4)]  # named for this offload alone
        assert all(stat.S_IMODE(os.stat(os.path.join(folder, f)).st_mode) == 0o600 for f in files)
        assert sum(os.path.getsize(os.path.join(folder, f)) for f in files) == sum(map(len, chunks))
        readers = offload._Stripes.open(folder)
        for chunk, offset in zip(chunks, offsets):
            back = ctypes.create_string_buffer(len(chunk))
            readers.read_placed(ctypes.addressof(back), len(chunk), offset)
            assert back.raw == chunk
        readers.close()
    finally:
        offload._placed.clear()
        offload._Stripes.remove_folder(folder)
    assert not os.path.exists(folder)


def test_a_refilled_folder_is_out_of_the_way_at_once_and_deleted_behind(folder):
    stripes = offload._Stripes.create(folder, 2)
    data = ctypes.create_string_buffer(os.urandom(CHUNK), CHUNK)
    stripes.write_placed(ctypes.addressof(data), CHUNK, 0)
    stripes.close()
    offload._placed.clear()
    offload._Stripes.discard_folder(folder)
    assert not os.path.exists(folder)
    offload._Stripes.create(folder, 2).remove()  # the next suspend can take the name right away
    parent = os.path.dirname(folder)
    deadline = time.monotonic() + 10
    while [n for n in os.listdir(parent) if ".old-" in n] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [n for n in os.listdir(parent) if ".old-" in n], os.listdir(parent)


def test_a_save_point_links_an_earlier_offloads_file_and_reads_it_back(folder):
    """What a save point takes by reference: a file of an earlier offload, linked (the same inode,
    nothing copied) into the new folder under its own unique name, read back at its place; a name
    no earlier folder has is not linked."""
    earlier = folder + "-earlier"
    data = ctypes.create_string_buffer(os.urandom(CHUNK), CHUNK)
    old = offload._Stripes.create(earlier, 1)
    try:
        old.write_placed(ctypes.addressof(data), CHUNK, 0)
        old.close()
        ((name, at),) = offload._placed.values()
        offload._placed.clear()
        new = offload._Stripes.create(folder, 2)
        assert new.link_from(["/nonexistent", earlier], name) and not new.link_from([earlier], "gone-0.bin")
        new.close()
        assert os.stat(os.path.join(folder, name)).st_ino == os.stat(os.path.join(earlier, name)).st_ino
        assert name not in new.names  # nothing is written into it
        offload._placed[5 * CHUNK] = (name, at)
        readers = offload._Stripes.open(folder)
        back = ctypes.create_string_buffer(CHUNK)
        readers.read_placed(ctypes.addressof(back), CHUNK, 5 * CHUNK)
        readers.close()
        assert back.raw == data.raw
    finally:
        offload._placed.clear()
        offload._Stripes.remove_folder(folder)
        offload._Stripes.remove_folder(earlier)

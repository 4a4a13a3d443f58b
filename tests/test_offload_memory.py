"""The tensor offload's early GPU release keeps a host copy of the tensors while it writes them;
it must only do so when memory holds that copy beside the file (which, on a tmpfs store, is memory
too), or the suspend could push the machine into the OOM killer. On this machine's real mounts."""
from __future__ import annotations

import pytest
from gpucr_hooks import offload


def test_tmpfs_store_counts_the_file_as_memory(tmp_path):
    if not offload._in_memory_fs("/dev/shm"):
        pytest.skip("/dev/shm is not tmpfs here")
    assert offload._in_memory_fs("/dev/shm/gpucr/procs/k/gpu-tensors.bin")
    available = offload._available_memory()
    fits_twice = (available - offload.HOST_HEADROOM) // 2 - (64 << 20)
    fits_once = (available - offload.HOST_HEADROOM) * 3 // 4
    assert offload._room_for_host_copy("/dev/shm/x", fits_twice)
    assert not offload._room_for_host_copy("/dev/shm/x", fits_once), "copy + tmpfs file would not fit"
    if not offload._in_memory_fs(str(tmp_path)):
        assert offload._room_for_host_copy(str(tmp_path / "x"), fits_once), "a disk store holds only the copy in memory"
    assert not offload._room_for_host_copy(str(tmp_path / "x"), available), "never the whole of memory"

"""The tensor offload and refill in this process, on a real GPU: every byte comes back, also when
the driver refuses to pin some of the refill's staging buffers (they are registered lazily, on
their first use). Skipped without PyTorch or a GPU; run on the H200 machine (docs/dev/gpu-tests.md)."""
from __future__ import annotations

import os

import pytest
from gpucr_hooks import offload

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def folder():
    path = f"/dev/shm/gpucr-offload-test-{os.getpid()}"
    yield path
    offload._Stripes.remove_folder(path)


def _patterned(sizes_mib: list[int]) -> list:
    tensors = []
    for i, mib in enumerate(sizes_mib):
        n = (mib << 20) // 8
        tensors.append(torch.arange(n, dtype=torch.int64, device="cuda:0") * 7919 + i)
    torch.cuda.synchronize()
    return tensors


@pytest.mark.parametrize("refused", [set(), {1, 4, 5}], ids=["all pinned", "some buffers refused"])
def test_refill_brings_every_byte_back(folder, monkeypatch, refused):
    tensors = _patterned([40, 17, 3, 64, 2])  # several chunks each, and partial last chunks
    expected = [t.cpu() for t in tensors]
    calls = []
    register = offload._Staging._register

    def sometimes_refused(self, address, size):
        calls.append(size)
        return False if len(calls) - 1 in refused else register(self, address, size)

    monkeypatch.setattr(offload._Staging, "_register", sometimes_refused)
    moved = offload.offload_tensors(folder, collect=False)
    assert moved["bytes"] == sum(t.nbytes for t in tensors)
    assert all(t.untyped_storage().nbytes() == 0 for t in tensors)  # the GPU memory was given back
    calls.clear()  # count the refill's registrations only
    back = offload.reload_tensors()
    assert back["bytes"] == moved["bytes"]
    assert calls and all(size == offload.CHUNK for size in calls)  # one buffer at a time, on first use
    for t, e in zip(tensors, expected):
        assert torch.equal(t.cpu(), e)

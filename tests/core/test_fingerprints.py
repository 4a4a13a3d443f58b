"""Fingerprints of tensor storages' bytes (what decides that a save point links a GPU tensor's
earlier file instead of writing it again), on this machine's CPU build of PyTorch with small
blocks so that several blocks and groups are crossed: equal bytes give equal fingerprints, and
every kind of change a cell makes gives another (one element, a swap inside a block and across
blocks, changes that cancel in a plain sum, the last bytes past the 64-bit words)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from gpucr_hooks import fingerprints as F  # noqa: E402


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch):
    monkeypatch.setattr(F, "BLOCK", 1024)
    monkeypatch.setattr(F, "GROUP", 3)


def fp(t):
    (one,) = F.fingerprints(torch, [t.untyped_storage()])
    return one


def changed(x, how):
    y = x.clone()
    how(y)
    return y


def test_equal_bytes_equal_fingerprints_and_every_change_seen():
    x = torch.randn(1024 * 10 + 3, dtype=torch.float32)  # 10 blocks of words, 4 groups, 4 bytes past the words
    same = fp(x)
    assert fp(x.clone()) == same and same[0] == x.numel() * 4 and len(same[3]) == 4

    def swap(i, j):
        def do(y):
            y[i], y[j] = x[j].item(), x[i].item()
        return do

    def cancel(y):  # a plain sum of the words would not see this
        words = y[:-3].view(torch.int64)
        words[5] += 1
        words[3000] -= 1

    for how in (lambda y: y.__setitem__(7, 0.5), swap(2, 9), swap(2, 2 + 2 * 1024), swap(100, 100 + 8 * 1024),
                cancel, lambda y: y.__setitem__(-1, 1.0)):
        assert fp(changed(x, how)) != same


def test_sizes_differ_and_zeros_are_not_all_alike():
    a, b = torch.zeros(4096, dtype=torch.uint8), torch.zeros(4104, dtype=torch.uint8)
    assert fp(a) != fp(b)
    assert fp(a) == fp(torch.zeros(4096, dtype=torch.uint8))

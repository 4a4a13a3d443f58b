"""Fingerprints of CUDA storages' bytes, computed on their device, so that a save point's offload
writes a storage again only when its bytes changed since the last save point (``offload``: an
unchanged one is taken by reference, a hard link to the earlier save point's file).

A fingerprint is the storage's size, its last bytes when the size is not a multiple of 8, and two
sums of its bytes read as 64-bit words, each word weighted by a random odd number for its place in a
block of ``BLOCK`` words, each block's sum by another for the block (mod 2^64). Changing one word
always changes both sums; several changes cancel in both with a chance of about 2^-128, and the
weights are drawn once per process, so no data can be made to collide on purpose. About four passes
over the bytes at the device's memory bandwidth (milliseconds per GiB on an H100), against writing
them to files (about 12 GB/s). PyTorch's version counters would be free, but writes through
``.data``, DLPack or a custom kernel do not count in them: they are not used.
"""
from __future__ import annotations

import secrets
from typing import Any

BLOCK = 1 << 20  # words per block: the weights of one block are 8 MiB on the device
GROUP = 8  # blocks summed per step: a 64 MiB temporary
_MASK = (1 << 64) - 1
_SEEDS = (secrets.randbits(64), secrets.randbits(64))  # drawn once: a restored process keeps them

Fingerprint = tuple[int, int, int, bytes]


def fingerprints(torch: Any, storages: list[Any]) -> list[Fingerprint | None]:
    """The fingerprint of each storage; None for one that could not be read (no memory left on its
    device for the temporary): it is then written as if it had changed."""
    weights: dict[int, tuple[Any, Any]] = {}
    out: list[Fingerprint | None] = []
    try:
        for st in storages:
            try:
                if st.device.index not in weights:
                    weights[st.device.index] = _word_weights(torch, st.device)
                out.append(_fingerprint(torch, st, weights[st.device.index]))
            except torch.cuda.OutOfMemoryError:
                out.append(None)
    finally:
        weights.clear()  # back to the allocator before the GPU is emptied
    return out


def _fingerprint(torch: Any, st: Any, word_weights: tuple[Any, Any]) -> Fingerprint:
    size = st.nbytes()
    whole = bytes_of(torch, st)
    n_words = size // 8
    tail = bytes(whole[n_words * 8:].cpu().numpy().tobytes()) if size % 8 else b""
    words = whole[:n_words * 8].view(torch.int64)
    sums = [torch.zeros((), dtype=torch.int64, device=st.device) for _ in _SEEDS]
    n_blocks = -(-n_words // BLOCK)
    block_weights = [torch.tensor([_signed(_mix(seed, b)) for b in range(n_blocks)], dtype=torch.int64,
                                  device=st.device) for seed in _SEEDS]
    for first in range(0, n_blocks, GROUP):
        start = first * BLOCK
        count = min(GROUP * BLOCK, n_words - start)
        full, rest = divmod(count, BLOCK)
        part = words[start:start + count]
        for h, (w, bw) in enumerate(zip(word_weights, block_weights)):
            per_block = []
            if full:
                per_block.append((part[:full * BLOCK].view(full, BLOCK) * w).sum(dim=1))
            if rest:
                per_block.append((part[full * BLOCK:] * w[:rest]).sum().reshape(1))
            sums[h] += (torch.cat(per_block) * bw[first:first + full + (1 if rest else 0)]).sum()
    h1, h2 = (int(s.item()) & _MASK for s in sums)
    return size, h1, h2, tail


def bytes_of(torch: Any, st: Any) -> Any:
    """The storage as one flat uint8 tensor on its device."""
    return torch.empty(0, dtype=torch.uint8, device=st.device).set_(st, 0, (st.nbytes(),))


def _word_weights(torch: Any, device: Any) -> tuple[Any, Any]:
    """Each seed's odd weights for the words of a block, made on the CPU (the same on every device
    and after a restore) and copied to ``device``."""
    gen = torch.Generator()
    out = []
    for seed in _SEEDS:
        gen.manual_seed(seed & ((1 << 63) - 1))
        w = torch.randint(-(1 << 62), 1 << 62, (BLOCK,), generator=gen, dtype=torch.int64) * 2 + 1
        out.append(w.to(device))
    return out[0], out[1]


def _mix(seed: int, n: int) -> int:
    """SplitMix64 of ``seed + n``, made odd: a block's weight."""
    z = (seed + (n + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return (z ^ (z >> 31)) | 1


def _signed(u: int) -> int:
    return u - (1 << 64) if u >> 63 else u

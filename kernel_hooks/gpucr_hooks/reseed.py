"""Reseed a fork's random generators so that forks diverge.

A fork starts from its source's memory, random generator states included: every fork draws the
same numbers as the source would. A framework that wants copies to explore different paths calls
:func:`reseed` in each fork. Only libraries the process has imported already are touched.
"""
from __future__ import annotations

import os
import random
import sys


def reseed(seed: int | None = None) -> int:
    """Reseed Python's ``random``, NumPy's global generator and PyTorch's CPU and CUDA generators
    with ``seed`` (fresh entropy when None); return the seed used."""
    seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
    random.seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(seed)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)  # the CUDA generators too, where CUDA is initialised
    return seed

"""Give back the GPU local memory reserved for thread stacks while a process is suspended.

The CUDA driver reserves local memory for the per-thread stack of every thread the GPU can hold
at once: with the default 1 KiB, 264 MiB on an H200 (measured: 736 MiB in use after W2's tensors
were gone, 472 MiB with the stack limit at 0). The driver's checkpoint copies that reservation to
host memory and CRIU writes it into the image. Setting the limit to 0 frees it at once; the
driver grows the stack again for any kernel that needs more. The old limit is put back after the
restore, so the process runs as it did.
"""
from __future__ import annotations

import ctypes
from typing import Any

CU_LIMIT_STACK_SIZE = 0

_saved: dict[int, int] = {}  # device index: its stack limit before the suspend (CRIU restores this)


def release(torch: Any, devices: set[int]) -> None:
    """Set the stack limit of each device's context to 0, remembering the old one."""
    cuda = ctypes.CDLL("libcuda.so.1")
    for d in sorted(devices - _saved.keys()):
        with torch.cuda.device(d):  # makes its primary context current
            size = ctypes.c_size_t()
            if cuda.cuCtxGetLimit(ctypes.byref(size), CU_LIMIT_STACK_SIZE) == 0 and size.value and \
                    cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(0)) == 0:
                _saved[d] = size.value


def restore(torch: Any) -> None:
    """Put back the limits :func:`release` changed."""
    cuda = ctypes.CDLL("libcuda.so.1")
    for d, size in sorted(_saved.items()):
        with torch.cuda.device(d):
            cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(size))
    _saved.clear()

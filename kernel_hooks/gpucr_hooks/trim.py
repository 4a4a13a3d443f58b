"""Shrink the process before it is written to disk.

A CRIU image carries every byte the process holds, including memory that allocators cache
for reuse (PyTorch's caching allocator can hold gigabytes of freed GPU memory). Releasing
those caches first makes the image smaller and suspend/restore faster. Only libraries the
notebook already imported are touched; nothing here imports them or initialises CUDA.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from . import idle


def prepare_suspend() -> dict[str, Any]:
    """Collect garbage and give allocator caches back; report what is left.

    Returns ``live_bytes`` (GPU memory still in use by live arrays), ``reserved_before`` /
    ``reserved_after`` (GPU memory held by the allocators), ``per_device`` rows, the
    ``libraries`` that were trimmed, host ``rss_before`` / ``rss_after``, ``warnings`` and
    where the time went (``gc_s``, ``libraries_s``, ``malloc_trim_s``, ``seconds``);
    ``gc_collected`` is None when the collection was skipped (done while the kernel was idle).
    """
    t0 = time.perf_counter()
    rss_before = _rss()
    collected = idle.collect_unless_clean()
    t_gc = time.perf_counter()
    report: dict[str, Any] = {"per_device": [], "libraries": [], "warnings": [], "live_bytes": 0}
    for name, trim in _TRIMMERS.items():
        if name not in sys.modules:
            continue
        try:
            rows, live = trim(sys.modules[name])
        except Exception as exc:  # a broken library must not stop the suspend
            report["warnings"].append(f"{name}: could not release caches: {type(exc).__name__}: {exc}")
            continue
        report["libraries"].append(name)
        report["per_device"].extend(rows)
        report["live_bytes"] += live
    t_libraries = time.perf_counter()
    _malloc_trim()
    t_end = time.perf_counter()
    report["reserved_before"] = sum(r["reserved_before"] for r in report["per_device"])
    report["reserved_after"] = sum(r["reserved_after"] for r in report["per_device"])
    report.update(gc_collected=collected, rss_before=rss_before, rss_after=_rss(),
                  seconds=round(t_end - t0, 3), gc_s=round(t_gc - t0, 3), libraries_s=round(t_libraries - t_gc, 3),
                  malloc_trim_s=round(t_end - t_libraries, 3))
    return report


def _trim_torch(torch: Any) -> tuple[list[dict[str, Any]], int]:
    if not torch.cuda.is_initialized():  # never create a CUDA context here
        return [], 0
    devices = range(torch.cuda.device_count())
    before = [(torch.cuda.memory_allocated(d), torch.cuda.memory_reserved(d)) for d in devices]
    torch.cuda.empty_cache()
    host_empty_cache = getattr(torch._C, "_host_emptyCache", None)  # cached pinned host memory
    if host_empty_cache is not None:
        host_empty_cache()
    rows = [_row("torch", f"cuda:{d}", allocated, reserved,
                 torch.cuda.memory_allocated(d), torch.cuda.memory_reserved(d))
            for d, (allocated, reserved) in zip(devices, before)]
    return rows, sum(r["allocated_after"] for r in rows)


def _trim_cupy(cupy: Any) -> tuple[list[dict[str, Any]], int]:
    pool = cupy.get_default_memory_pool()
    rows = []
    for d in range(cupy.cuda.runtime.getDeviceCount()):
        with cupy.cuda.Device(d):
            used, held = pool.used_bytes(), pool.total_bytes()
            pool.free_all_blocks()
            rows.append(_row("cupy", f"cuda:{d}", used, held, pool.used_bytes(), pool.total_bytes()))
    cupy.get_default_pinned_memory_pool().free_all_blocks()
    return rows, sum(r["allocated_after"] for r in rows)


def _trim_jax(jax: Any) -> tuple[list[dict[str, Any]], int]:
    jax.clear_caches()  # compiled executables; JAX's preallocated pool itself cannot be returned
    return [], sum(a.nbytes for a in jax.live_arrays())


_TRIMMERS: dict[str, Callable[[Any], tuple[list[dict[str, Any]], int]]] = {
    "torch": _trim_torch,
    "cupy": _trim_cupy,
    "jax": _trim_jax,
}


def _row(library: str, device: str, allocated_before: int, reserved_before: int,
         allocated_after: int, reserved_after: int) -> dict[str, Any]:
    return {"library": library, "device": device,
            "allocated_before": allocated_before, "reserved_before": reserved_before,
            "allocated_after": allocated_after, "reserved_after": reserved_after}


def _rss() -> int:
    """Resident set size in bytes, from /proc (0 where there is no /proc)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _malloc_trim() -> None:
    """Return free heap pages to the OS (glibc only) so they are not written into the image."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass

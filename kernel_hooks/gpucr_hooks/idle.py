"""Collect garbage while the kernel is idle, so that a suspend need not.

A full collection takes 0.25-0.3 s in a kernel holding a 2.7 B-parameter model (the W2 benchmark kernel),
a quarter of the time a suspend takes to free the GPU. Garbage only forms while code runs, so
once the kernel has been idle for ``IDLE_S`` seconds after a cell, one collection leaves nothing
for a suspend to find until the next cell starts: ``prepare_suspend`` then skips its own.
The collection runs on the kernel's event loop between requests, never during a cell (an async
cell awaiting counts as running); a request arriving meanwhile waits for it. Work that depends
on the heap alone follows it (``after_idle_collection``: ``offload`` finds the GPU tensors).

Loaded as an IPython extension (the gpucr provisioner adds it to IPython kernels); without it,
every suspend collects.
"""
from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import Any

IDLE_S = 2.0

_clean = False  # a full collection ran after the last cell ended
_running = 0  # cells started and not ended (async cells can overlap)
_cells = 0  # cells started so far: what the idle collection found holds until this changes
_timer: asyncio.TimerHandle | None = None
_after_collection: list[Callable[[], None]] = []


def load_ipython_extension(ip: Any) -> None:
    ip.events.register("pre_run_cell", _cell_starts)
    ip.events.register("post_run_cell", _cell_ends)


def unload_ipython_extension(ip: Any) -> None:
    ip.events.unregister("pre_run_cell", _cell_starts)
    ip.events.unregister("post_run_cell", _cell_ends)
    _cancel()


def after_idle_collection(fn: Callable[[], None]) -> None:
    """Run ``fn`` after each idle collection, on the event loop (a failure is ignored: the kernel
    must not notice)."""
    _after_collection.append(fn)


def cells_started() -> int:
    """How many cells have started: equal to an earlier count, no cell ran in between."""
    return _cells


def collect_unless_clean() -> int | None:
    """For a suspend: a full collection, unless one ran after the last cell and no cell ran
    since (then None). A collection still pending is cancelled: it must not run in the middle
    of the suspend."""
    global _clean
    _cancel()
    if _clean and not _running:
        return None
    collected = gc.collect()
    _clean = not _running
    return collected


def _cell_starts(_info: Any) -> None:
    global _clean, _running, _cells
    _clean = False
    _running += 1
    _cells += 1
    _cancel()


def _cell_ends(_result: Any) -> None:
    global _running, _timer
    _running = max(0, _running - 1)
    _cancel()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no event loop here: the suspend collects
        return
    _timer = loop.call_later(IDLE_S, _collect)


def _collect() -> None:
    global _clean, _timer
    _timer = None
    if _running:
        return
    gc.collect()
    _clean = True
    for fn in _after_collection:
        try:
            fn()
        except Exception:  # best effort: a suspend then does the work itself
            pass


def _cancel() -> None:
    global _timer
    if _timer is not None:
        _timer.cancel()
        _timer = None

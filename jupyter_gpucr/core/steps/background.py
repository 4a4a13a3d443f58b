"""Work that runs beside a step (hashing, flushing) on a thread of its own."""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


def in_background(fn: Callable[..., None], *args: Any) -> Future[None]:
    """``fn(*args)`` on a thread of its own; the future carries its outcome."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="gpucr-background")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)

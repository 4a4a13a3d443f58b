"""A point where a worker thread waits for a step of the event loop.

The checkpointing thread reaches such a point (``before_dump``: the GPU is free, CRIU has not
frozen the kernel yet) while the server's connections to the kernel live on the event loop. The
thread only says it got there and waits; the coroutine that started it awaits that, takes its
step and lets the thread go on, so the engine reads as the steps it awaits, in order.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable, Callable
from typing import Any

from ..core.errors import EngineError


class LoopStep:
    """Made on the event loop; the thread calls it (see the module docstring)."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._reached: asyncio.Future[None] = self._loop.create_future()
        self._answer: concurrent.futures.Future[None] = concurrent.futures.Future()

    def __call__(self) -> None:
        """In the thread: say the point is reached, wait for the loop's step; raise what it raised."""
        self._loop.call_soon_threadsafe(self._arrive)
        self._answer.result()

    def _arrive(self) -> None:
        if not self._reached.done():
            self._reached.set_result(None)

    async def take(self, step: Callable[[], Awaitable[None]], work: asyncio.Future[Any]) -> None:
        """Once the thread is at the point, run ``step`` and let the thread go on; nothing runs
        when ``work`` (the thread's) ends first. What ``step`` raises is raised in the thread
        instead, whose work then fails with it: awaiting ``work`` tells how it ended."""
        try:
            await asyncio.wait({self._reached, work}, return_when=asyncio.FIRST_COMPLETED)
            if self._reached.done():
                await step()
        except Exception as e:
            self._answer.set_exception(e)
        except BaseException:  # cancelled: the thread must not wait for ever, and the caller stops here
            self._answer.set_exception(EngineError("The suspend was cancelled before the kernel was frozen.",
                                                   "The kernel keeps running."))
            raise
        else:
            self._answer.set_result(None)

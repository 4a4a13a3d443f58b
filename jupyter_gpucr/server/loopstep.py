"""A point where a worker thread waits for a step of the event loop.

The checkpointing thread reaches such a point (``before_dump``: the GPU is free, CRIU has not
frozen the kernel yet) while the server's connections to the kernel live on the event loop. The
thread only says it got there and waits; the coroutine that started it awaits that, takes its
step and lets the thread go on, so the engine reads as the steps it awaits, in order.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Awaitable
from typing import Any, TypeVar, cast

from ..core.errors import EngineError

T = TypeVar("T")


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

    async def reached(self, work: asyncio.Future[Any]) -> None:
        """Return once the thread is at the point, or once ``work`` (the thread's) ended first;
        raise what ``work`` raised then."""
        await asyncio.wait({self._reached, work}, return_when=asyncio.FIRST_COMPLETED)
        if not self._reached.done():
            await work

    def go_on(self) -> None:
        """The loop's step is done: the thread goes on."""
        if not self._answer.done():
            self._answer.set_result(None)

    def refuse(self, why: BaseException) -> None:
        """The loop's step failed (or was cancelled): the thread raises instead of going on."""
        if self._answer.done():
            return
        if not isinstance(why, Exception):
            why = EngineError("The suspend was cancelled before the kernel was frozen.", "The kernel keeps running.")
        self._answer.set_exception(why)


async def unless_lost(lost: asyncio.Future[None], work: Awaitable[T]) -> T:
    """``work``'s result, unless ``lost`` fails first: then ``work`` is cancelled and that failure
    raised. ``lost`` is left running either way (its owner awaits it). A restore hands a kernel
    back before all its memory is in; reconnecting to it waits for the kernel, which never answers
    if the rest never comes."""
    task: asyncio.Future[Any] = asyncio.ensure_future(work)
    await asyncio.wait({cast("asyncio.Future[Any]", lost), task}, return_when=asyncio.FIRST_COMPLETED)
    if lost.done() and lost.exception() is not None and not task.done():
        task.cancel()
        raise cast(BaseException, lost.exception())
    return cast(T, await task)

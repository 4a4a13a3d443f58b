"""The checkpointing thread stops at ``before_dump`` and the event loop takes its step there
(server/loopstep.py): in order, with the step's failure raised in the thread, never run once the
thread's work ended first, and never leaving the thread waiting when the step is cancelled."""
from __future__ import annotations

import asyncio
import threading

import pytest

from jupyter_gpucr.core.errors import EngineError, StateError
from jupyter_gpucr.server.loopstep import LoopStep


def _work(point: LoopStep, events: list[str], reach: bool = True) -> str:
    """A checkpoint's order: free the GPU, stop at the point, then dump."""
    events.append(f"gpu free in {threading.current_thread().name}")
    if reach:
        point()
    events.append("dump")
    return "checkpoint"


async def test_the_step_runs_on_the_loop_between_the_threads_steps():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events))

    async def detach() -> None:
        await asyncio.sleep(0.05)  # the thread waits meanwhile
        events.append(f"detach in {threading.current_thread().name}")

    await point.take(detach, work)
    assert await work == "checkpoint"
    loop_thread = threading.current_thread().name
    assert events[1:] == [f"detach in {loop_thread}", "dump"] and events[0] != f"gpu free in {loop_thread}", events


async def test_a_failing_step_fails_the_threads_work_with_its_error():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events))

    async def detach() -> None:
        raise StateError("The server still talks to the kernel.")

    await point.take(detach, work)
    with pytest.raises(StateError, match="still talks"):
        await work
    assert len(events) == 1 and events[0].startswith("gpu free"), events  # no dump


async def test_no_step_when_the_work_ends_before_the_point():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events, False))
    ran = []

    async def detach() -> None:
        ran.append(True)

    await point.take(detach, work)
    assert await work == "checkpoint" and ran == []


async def test_a_cancelled_step_lets_the_thread_go_with_an_error():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events))
    taking = asyncio.ensure_future(point.take(lambda: asyncio.sleep(60), work))
    await asyncio.sleep(0.2)
    taking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await taking
    with pytest.raises(EngineError, match="cancelled before the kernel was frozen"):
        await asyncio.wait_for(work, 5)

"""The checkpointing thread stops at ``before_dump`` and the event loop takes its step there
(server/loopstep.py): in order, with the step's failure raised in the thread, nothing to wait for
once the thread's work ended first, and never leaving the thread waiting when the step is cancelled.
And a restore's reconnection given up as soon as the restored kernel is lost (``unless_lost``)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from jupyter_gpucr.core.errors import EngineError, StateError
from jupyter_gpucr.server.loopstep import LoopStep, unless_lost


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
    await point.reached(work)
    await asyncio.sleep(0.05)  # the thread waits meanwhile
    events.append(f"detach in {threading.current_thread().name}")
    point.go_on()
    assert await work == "checkpoint"
    loop_thread = threading.current_thread().name
    assert events[1:] == [f"detach in {loop_thread}", "dump"] and events[0] != f"gpu free in {loop_thread}", events


async def test_a_refused_step_fails_the_threads_work_with_its_error():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events))
    await point.reached(work)
    point.refuse(StateError("The server still talks to the kernel."))
    with pytest.raises(StateError, match="still talks"):
        await work
    assert len(events) == 1 and events[0].startswith("gpu free"), events  # no dump


async def test_the_work_ending_before_the_point_is_reached_too():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events, False))
    await point.reached(work)
    assert work.done() and await work == "checkpoint"


async def test_a_cancelled_step_lets_the_thread_go_with_an_error():
    events: list[str] = []
    point = LoopStep()
    work = asyncio.ensure_future(asyncio.to_thread(_work, point, events))
    await point.reached(work)
    point.refuse(asyncio.CancelledError())
    with pytest.raises(EngineError, match="cancelled before the kernel was frozen"):
        await asyncio.wait_for(work, 5)


async def test_a_lost_kernel_cuts_its_reconnection_short():
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    reconnect = asyncio.ensure_future(asyncio.sleep(60))
    asyncio.get_running_loop().call_later(0.05, lost.set_exception, EngineError("The pages never came."))
    with pytest.raises(EngineError, match="never came"):
        await unless_lost(lost, reconnect)
    await asyncio.sleep(0)
    assert reconnect.cancelled()


async def test_a_reconnection_that_ends_first_is_answered_and_the_settling_goes_on():
    lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    assert await unless_lost(lost, asyncio.sleep(0.01, result="reattached")) == "reattached"
    assert not lost.done()

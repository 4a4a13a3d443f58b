"""The one runner of the checks of what kernels grew into (``pressure.GrowthChecks``): a cell's end
asks for a check with the kernels whose cells ended (the GPUs' room kept free is checked where
they hold memory), also without a host memory budget, and cells that end while a check runs make
one check more, not one each."""
from __future__ import annotations

import asyncio
import logging

from jupyter_gpucr.server.pressure import GrowthChecks

LOG = logging.getLogger("test_growth_checks")


async def test_the_kernels_whose_cells_ended_are_handed_to_one_check_at_a_time():
    seen: list[frozenset[str]] = []
    running, go_on = asyncio.Event(), asyncio.Event()

    async def check(cells_ended: frozenset[str]) -> None:
        seen.append(cells_ended)
        running.set()
        await go_on.wait()

    growth = GrowthChecks(check, LOG)
    growth.start(0, 600, after_cells=True)  # no budget: only the cells' ends ask
    try:
        growth.cell_ended("a")
        await asyncio.wait_for(running.wait(), 5)
        growth.cell_ended("b")
        growth.cell_ended("c")
        go_on.set()
        for _ in range(100):
            if len(seen) == 2:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # and no third
        assert seen == [frozenset({"a"}), frozenset({"b", "c"})]
    finally:
        growth.stop()


async def test_without_a_budget_or_room_kept_free_a_cell_end_checks_nothing():
    seen: list[frozenset[str]] = []

    async def check(cells_ended: frozenset[str]) -> None:
        seen.append(cells_ended)

    growth = GrowthChecks(check, LOG)
    growth.start(0, 600)
    try:
        growth.cell_ended("a")
        await asyncio.sleep(0.5)
        assert seen == []
    finally:
        growth.stop()

"""Room made ahead (``c.GPUCR.room_headroom``), through a real server with real kernels and CRIU:
with one kernel's room kept free, a kernel that comes back (or starts) finds its room at once and
never waits for another kernel's suspend; the least recently used idle kernel is suspended in the
background afterwards, and the budget holds all along."""
from __future__ import annotations

import asyncio

import pytest

from jupyter_gpucr.server.lifecycle import SUSPENDED, WAITING
from tests.kernel_ws import execute
from tests.server.test_room_host import KernelMemory, budget_config
from tests.server.test_server import new_session, open_ws
from tests.server.test_server_lifecycle import wait_state

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20
SIZE = 256 * MiB
BUDGET = 3 * SIZE
DATA = SIZE - 96 * MiB


@pytest.fixture
def jp_server_config(tmp_path):
    return budget_config(tmp_path, SIZE, room_headroom=f"{SIZE}")


async def test_room_is_kept_free_ahead_so_no_one_waits(jp_fetch, jp_ws_fetch, server_events):
    kids, sockets = {}, {}
    with KernelMemory() as memory:
        for i, name in enumerate("abcd"):
            kids[name] = (await new_session(jp_fetch, f"{name}.ipynb"))["kernel"]["id"]
            sockets[name] = await open_ws(jp_ws_fetch, kids[name], session_id=f"s-{name}")
            _, out, _ = await execute(sockets[name], f"b = bytes([{i + 1}]) * {DATA}\nprint(b[0] + b[-1])")
            assert out.split() == [str(2 * (i + 1))]
        # c's start left no room: a (least recently used) went ahead; d's start then did the same to b
        st = await wait_state(jp_fetch, kids["b"], SUSPENDED)
        assert (st["checkpoint"]["reason"], st["made_room_for"]) == ("room", None)
        _, out, _ = await execute(sockets["a"], "print(b[0] + b[-1], len(b))")  # a comes back: room is there
        assert out.split() == ["2", str(DATA)]
        await wait_state(jp_fetch, kids["c"], SUSPENDED)  # and c, now least recently used, goes ahead
    assert memory.peak <= BUDGET, f"the kernels held {memory.peak >> 20} MiB, over the budget of {BUDGET >> 20} MiB"

    by_id = {v: k for k, v in kids.items()}
    room = [(e["for"], by_id[e["kernel_id"]], [by_id[v] for v in e["victims"]]) for e in server_events.room()
            if e["outcome"] == "suspending"]
    assert room == [("headroom", "c", ["a"]), ("headroom", "d", ["b"]), ("headroom", "a", ["c"])]
    assert not [e for e in server_events.lifecycle() if e["state"] == WAITING], "someone waited for room"
    for ws in sockets.values():
        ws.close()
    await asyncio.sleep(0)

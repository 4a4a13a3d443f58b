"""Make room in host memory, through a real server with real kernels and CRIU: six kernels of
SIZE each under a budget of three, users taking turns in a scripted order. Every cell gets its
answer, the kernels' processes never hold more than the budget (sampled all along), and the kernel
suspended for room is each time the least recently used idle one."""
from __future__ import annotations

import asyncio
import os
import threading
import time
from datetime import datetime
from typing import Any

import psutil
import pytest

from jupyter_gpucr.server.lifecycle import WAITING
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, new_session, open_ws

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20
#: What a kernel is declared to take (its data is SIZE less the kernel's own baseline): the issue's 1 GiB;
#: GPUCR_ROOM_TEST_MIB=256 runs it with a quarter of it on a small VM.
SIZE = int(os.environ.get("GPUCR_ROOM_TEST_MIB", "1024")) * MiB
BUDGET = 3 * SIZE
DATA = SIZE - 96 * MiB
NAMES = "abcdef"
#: After the six starts (d, e and f each made room: a, b, c went), users come back in this order:
#: a makes room (d goes), e runs (it is resident), b makes room (f goes, not e: e ran last), d too (a).
TURNS = "aebd"


def budget_config(tmp_path, size: int, **gpucr) -> dict:
    """A server whose kernels each take ``size`` under a host memory budget of three of them, idle ones
    suspended for room at once (no ``min_resident_s``)."""
    criu_or_skip()
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store"), "host_memory_budget": f"{3 * size}",
                  "kernel_memory": f"{size}", "min_resident_s": 0, **gpucr},
    }


@pytest.fixture
def jp_server_config(tmp_path):
    return budget_config(tmp_path, SIZE)


class KernelMemory:
    """Samples the RSS of this process's kernels (descendants running ipykernel) every few ms."""

    def __init__(self) -> None:
        self.peak, self.samples = 0, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            total = 0
            for p in me.children(recursive=True):
                try:
                    if any("ipykernel" in part for part in p.cmdline()):
                        total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak, self.samples = max(self.peak, total), self.samples + 1
            time.sleep(0.01)

    def __enter__(self) -> KernelMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


#: Users come back seconds to hours apart. The turns here are this far apart at least, so that the
#: order in which the server notes the cells' ends is the order in which they ended: it notes them
#: through its own iopub stream, which under load can lag the client's websocket by some ms (CI once
#: saw a cell's end noted after the next user's cell, 15 ms later).
TURN_GAP_S = 0.3


async def between_turns(serverapp: Any, kernel_id: str, reply: dict[str, Any], timeout: float = 30) -> None:
    """Wait until the server shows the kernel idle with activity noted after the cell's reply, then
    :data:`TURN_GAP_S`: messages still on their way to its activity watcher then arrive before
    the next user's cell."""
    replied = datetime.fromisoformat(reply["header"]["date"])
    km = serverapp.kernel_manager.get_kernel(kernel_id)
    deadline = time.monotonic() + timeout
    while not (km.execution_state == "idle" and km.last_activity >= replied):
        assert time.monotonic() < deadline, f"the server did not see kernel {kernel_id}'s cell end in {timeout} s"
        await asyncio.sleep(0.005)
    await asyncio.sleep(TURN_GAP_S)


def fill(n: int) -> str:
    return f"b = bytes([{n}]) * {DATA}\nprint(b[0] + b[-1], len(b))"


async def test_six_kernels_take_turns_under_a_budget_of_three(jp_fetch, jp_ws_fetch, jp_serverapp, server_events):
    kids: dict[str, str] = {}
    sockets = {}
    resident: list[str] = []  # least recently used first, as the test expects the server to see it
    expected_victims: list[tuple[str, str]] = []  # (victim, for whom)
    t0 = time.monotonic()
    with KernelMemory() as memory:
        for i, name in enumerate(NAMES):
            if len(resident) == 3:
                expected_victims.append((resident.pop(0), name))
            kids[name] = (await new_session(jp_fetch, f"{name}.ipynb"))["kernel"]["id"]
            sockets[name] = await open_ws(jp_ws_fetch, kids[name], session_id=f"s-{name}")
            reply, out, _ = await execute(sockets[name], fill(i + 1))
            assert out.split() == [str(2 * (i + 1)), str(DATA)]
            await between_turns(jp_serverapp, kids[name], reply)
            resident.append(name)
        for name in TURNS:
            if name in resident:
                resident.remove(name)
            else:
                expected_victims.append((resident.pop(0), name))
            reply, out, _ = await execute(sockets[name], "print(b[0] + b[-1], len(b))")
            n = NAMES.index(name) + 1
            assert out.split() == [str(2 * n), str(DATA)], f"kernel {name}: {out!r}"
            await between_turns(jp_serverapp, kids[name], reply)
            resident.append(name)
    took = time.monotonic() - t0
    print(f"\n{len(NAMES)} kernels of {SIZE >> 20} MiB, budget {BUDGET >> 20} MiB, {len(TURNS)} turns: {took:.1f} s, "
          f"peak {memory.peak >> 20} MiB over {memory.samples} samples")
    assert memory.peak <= BUDGET, f"the kernels held {memory.peak >> 20} MiB, over the budget of {BUDGET >> 20} MiB"

    by_id = {v: k for k, v in kids.items()}
    made = [(by_id[e["victims"][0]], by_id[e["kernel_id"]]) for e in server_events.room() if e["outcome"] == "suspending"]
    assert made == expected_victims
    for victim, for_whom in expected_victims[-2:]:  # not run again since
        if victim not in resident:
            st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kids[victim])
            assert (st["state"], st["checkpoint"]["reason"], st["made_room_for"]) == ("suspended", "room", kids[for_whom])
    waits = [e["room"]["message"] for e in server_events.lifecycle() if e["state"] == WAITING]
    assert waits and set(waits) == {"waiting for room in host memory: suspending 1 idle kernel"}

    report = await fetch_json(jp_fetch, "api", "gpucr", "room")
    host = report[-1]
    assert host["where"] == "host memory" and host["total"] == BUDGET
    assert sorted(k["kernel_id"] for k in host["kernels"]) == sorted(kids[n] for n in resident)
    assert host["idle"] == host["held_by_kernels"]  # min_resident_s 0: every idle kernel could make room
    for ws in sockets.values():
        ws.close()
    await asyncio.sleep(0)

    # a kernel shut down, running or suspended, leaves nothing behind in what makes room
    room = jp_serverapp.kernel_manager.runtime.room
    shut = [kids[resident[-1]], kids[next(n for n in NAMES if n not in resident)]]
    assert all(k in room._arrived and k in room._owners for k in shut)
    for kid in shut:
        await jp_fetch("api", "kernels", kid, method="DELETE")
    assert not [k for k in shut if k in room._arrived or k in room._owners]

"""The host memory budget holds while kernels grow, not only when one starts or comes back: four
kernels of a real server (CRIU) each fill DATA in a cell, under a budget that holds two and a half
of them; the least recently used idle ones are suspended as the others grow, and every cell (the
suspended kernels' too) answers right afterwards."""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(300)

MiB = 1 << 20
DATA = 200 * MiB  # each kernel: about 280 MiB with its own baseline
BUDGET = 700 * MiB


async def states(server: RealServer, kids: dict[str, str]) -> dict[str, str]:
    return {name: (await server.get(f"api/gpucr/kernels/{kid}"))["state"] for name, kid in kids.items()}


async def wait_states(server: RealServer, kids: dict[str, str], want: dict[str, str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (now := await states(server, kids)) != want:
        assert time.monotonic() < deadline, f"states {now}, wanted {want}"
        await asyncio.sleep(0.3)


async def test_idle_kernels_are_suspended_lru_first_as_others_grow_past_the_budget(tmp_path):
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    server = RealServer(root, store, log, f"--GPUCR.host_memory_budget={BUDGET}", "--GPUCR.min_resident_s=0",
                        "--GPUCR.budget_check_interval=0.5")
    try:
        await server.wait_ready()
        kids: dict[str, str] = {}
        expected: dict[str, str] = {}
        for name, gone in (("a", None), ("b", None), ("c", "a"), ("d", "b")):
            # each started when it is used: a kernel started earlier and never used would be the least
            # recently used one, and rightly go first
            kids[name] = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
            expected[name] = "running"
            ws = await server.ws(kids[name])
            _, out, _ = await execute(ws, f"import numpy as np\nx = np.full({DATA // 8}, {ord(name)}.0)\n"
                                          "print(int(x.sum()))")
            ws.close()
            assert out == f"{ord(name) * (DATA // 8)}\n"
            if gone:  # the least recently used idle kernel goes, the others stay
                expected[gone] = "suspended"
            await wait_states(server, kids, expected)
        await asyncio.sleep(1.5)  # three more checks: nothing else is suspended
        assert await states(server, kids) == expected
        memory = [k for k in await server.get("api/gpucr/kernels") if k["kernel_id"] in (kids["a"], kids["b"])]
        assert {(k.get("checkpoint") or {}).get("reason") for k in memory} == {"memory"}

        for name in "ab":  # the suspended kernels answer right; room is made for them as they come back
            ws = await server.ws(kids[name])
            _, out, _ = await execute(ws, "print(int(x.sum()))")
            ws.close()
            assert out == f"{ord(name) * (DATA // 8)}\n"
        assert "more than the host memory budget: suspending" in log.read_text()
    finally:
        assert server.sigterm() == 0

"""Kernels nobody comes back to: past ``c.GPUCR.suspended_hours`` a suspended kernel is shut down
by the server, its saved state in the trash (reason "expired"), from where it can still be
restored until ``trash_hours`` deletes it. A running kernel is never expired."""
from __future__ import annotations

import asyncio
import time

from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server_lifecycle import RealServer

LIMIT_H = 3 / 3600  # three seconds


async def test_a_kernel_suspended_past_the_limit_goes_to_the_trash_and_can_come_back(tmp_path):
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    server = RealServer(root, store, log, f"--GPUCR.suspended_hours={LIMIT_H}", "--GPUCR.idle_check_interval=1")
    try:
        await server.wait_ready()
        kept = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await execute(ws, "x = 42")
        ws.close()
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        suspended = time.monotonic()
        deadline = suspended + 60
        while kid in [k["id"] for k in await server.get("api/kernels")]:
            assert time.monotonic() < deadline, "the expired kernel is still listed"
            await asyncio.sleep(0.5)
        assert time.monotonic() - suspended > 2.5  # not before its time
        [item] = [t for t in await server.get("api/gpucr/trash") if t.get("kernel_id", t.get("name")) == kid]
        assert item["reason"] == "expired", item
        assert kept in [k["id"] for k in await server.get("api/kernels")]  # running: never expired

        await server.request(f"api/gpucr/trash/{item['id']}/restore", "POST", {})
        await server.wait_listed(kid)
        await asyncio.sleep(2)  # two checks: its time counts from its return, not from its suspend
        assert kid in [k["id"] for k in await server.get("api/kernels")]
        ws = await server.ws(kid)
        _, out, _ = await execute(ws, "print(x)")
        assert out == "42\n"
        ws.close()
    finally:
        assert server.sigterm() == 0

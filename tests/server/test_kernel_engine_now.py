"""A running kernel's REST model says which engine a suspend would use now, and why (it was null
until the kernel's first suspend), in the kernel's state and in the listing; once suspended, the
engine that did it. A real server process, a real kernel and CRIU."""
from __future__ import annotations

import pytest

from tests.conftest import criu_or_skip
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(180)

WHOLE = ("criu", "whole process (CRIU + CUDA driver) available")


async def test_a_running_kernel_says_which_engine_a_suspend_would_use(tmp_path):
    criu_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    server = RealServer(root, tmp_path / "store", tmp_path / "server.log", "--GPUCR.suspend_on_stop=False")
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        st = await server.get(f"api/gpucr/kernels/{kid}")
        assert st["state"] == "running" and (st["engine"], st["engine_reason"]) == WHOLE, st
        listed = {k["kernel_id"]: k for k in await server.get("api/gpucr/kernels")}
        assert (listed[kid]["engine"], listed[kid]["engine_reason"]) == WHOLE, listed[kid]

        st = await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {"engine": "snapshot"})
        assert st["state"] == "suspended" and (st["engine"], st["engine_reason"]) == ("snapshot", "requested"), st
        await server.request(f"api/kernels/{kid}", "DELETE")
    finally:
        server.sigterm()

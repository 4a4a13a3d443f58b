"""The 'about to use it' hint (REST resume with {"wait": false}; jupyter_gpucr.agents.about_to_use):
the answer comes at once, the restore runs in the background with the state saying it was asked
for ahead, and a request that comes meanwhile waits for that one restore."""
from __future__ import annotations

import asyncio
import time

from jupyter_gpucr.agents import about_to_use
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server_lifecycle import RealServer

# Large enough that its restore takes a moment: the answer must not wait for it.
FILL = "import numpy as np\nx = np.full((300 << 20) // 8, 3.0)\nprint(int(x.sum()))"


async def test_about_to_use_restores_in_the_background_and_the_run_finds_it_back(tmp_path):
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    server = RealServer(root, store, log)
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        _, out, _ = await execute(ws, FILL)
        ws.close()
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})

        t0 = time.monotonic()
        answered = await asyncio.to_thread(about_to_use, kid, server.url, "secret-token")
        took = time.monotonic() - t0
        assert answered["kernel_id"] == kid and answered["state"] in ("suspended", "restoring"), answered
        seen = set()
        deadline = time.monotonic() + 120
        while (st := await server.get(f"api/gpucr/kernels/{kid}"))["state"] != "running":
            assert time.monotonic() < deadline, st
            seen.add((st["state"], st.get("ahead")))
            await asyncio.sleep(0.05)
        assert st["ahead"] is False  # once it runs
        assert ("restoring", True) in seen, seen  # the hint answered before the restore ended
        print(f"about_to_use answered in {took:.3f} s; the restore ran behind it")

        ws = await server.ws(kid)
        _, again, _ = await execute(ws, "print(int(x.sum()))")
        ws.close()
        assert again == out
    finally:
        assert server.sigterm() == 0

"""The 'about to use it' hint (REST resume with {"wait": false}; jupyter_gpucr.agents.about_to_use):
the answer comes at once, the restore runs in the background with the state saying it was asked
for ahead, and a request that comes meanwhile waits for that one restore."""
from __future__ import annotations

import asyncio
import re
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


async def wait_state(server: RealServer, kid: str, state: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while (st := await server.get(f"api/gpucr/kernels/{kid}"))["state"] != state:
        assert time.monotonic() < deadline, st
        await asyncio.sleep(0.2)
    return st


async def restores_ahead(server: RealServer) -> dict:
    return next(c for c in (await server.get("api/gpucr/doctor"))["checks"] if c["name"] == "restores ahead")


async def test_a_restore_ahead_that_no_run_follows_is_counted_with_what_it_held(tmp_path):
    """First a run follows the hint: nothing counted. Then none does: the idle timeout suspends the
    kernel again, the server says so in its log (how long, how much) and the doctor counts it; a
    shutdown instead of the run counts too."""
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    server = RealServer(root, store, log, "--GPUCR.idle_timeout=4", "--GPUCR.idle_check_interval=1")
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        _, out, _ = await execute(ws, "import numpy as np\nx = np.full((100 << 20) // 8, 3.0)\nprint(int(x.sum()))")
        ws.close()
        await wait_state(server, kid, "suspended")  # idle

        await server.request(f"api/gpucr/kernels/{kid}/resume", "POST", {"wait": False})
        await wait_state(server, kid, "running")
        ws = await server.ws(kid)
        _, again, _ = await execute(ws, "print(int(x.sum()))")  # the run the hint was for
        ws.close()
        assert again == out
        await wait_state(server, kid, "suspended")
        row = await restores_ahead(server)
        assert (row["severity"], row["detail"]) == ("ok", "1 started ahead of use; none went back to disk or was "
                                                           "shut down before a run"), row
        assert "restored ahead of use and" not in log.read_text()

        await server.request(f"api/gpucr/kernels/{kid}/resume", "POST", {"wait": False})  # typing, then nothing
        await wait_state(server, kid, "running")
        st = await wait_state(server, kid, "suspended")
        assert st["checkpoint"]["reason"] == "idle"
        said = re.findall(rf"kernel {kid} was restored ahead of use and suspended again unused after ([\d.]+) s, "
                          r"holding ([\d.]+) MiB", log.read_text())
        assert len(said) == 1, log.read_text()[-3000:]
        seconds, mib = map(float, said[0])
        assert 4 <= seconds < 30 and mib >= 100, said
        print(f"restored ahead, no run: back {seconds} s, holding {mib} MiB")
        row = await restores_ahead(server)
        assert row["severity"] == "note" and row["detail"].startswith("1 of 2 started ahead of use were followed by "
                                                                     "no run"), row
        assert f"by kernel: {kid} 1" in row["detail"], row

        await server.request(f"api/gpucr/kernels/{kid}/resume", "POST", {"wait": False})  # and a shutdown instead
        await wait_state(server, kid, "running")
        await server.request(f"api/kernels/{kid}", "DELETE")
        assert f"kernel {kid} was restored ahead of use and shut down unused after" in log.read_text()
        assert (await restores_ahead(server))["detail"].startswith("2 of 3 started ahead of use")
    finally:
        assert server.sigterm() == 0

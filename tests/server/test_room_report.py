"""What ``gpucr doctor`` and ``gpucr kernel room`` say about memory, against a real server process
with a host memory budget and two real kernels, one running a cell: the kernels' share, how much
of it idle kernels hold that could be suspended to make room, and, without a server, that the
kernels were not counted. On this machine without a GPU the doctor says "no GPU"."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jupyter_gpucr.core.gpu import gpus
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute, request, send
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(180)

MiB = 1 << 20
KERNEL = 512 * MiB  # each kernel's declared memory: more than its RSS, so what it counts is exact
BUDGET = 4 * KERNEL
CLI = [sys.executable, "-m", "jupyter_gpucr.cli.main"]


async def gpucr(*args: str, runtime: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)}
    return await asyncio.to_thread(subprocess.run, [*CLI, *args], capture_output=True, text=True, env=env)


async def wait_busy(server: RealServer, kernel_id: str) -> None:
    deadline = time.monotonic() + 30
    while (await server.get(f"api/kernels/{kernel_id}"))["execution_state"] != "busy":
        assert time.monotonic() < deadline, "the server never saw the kernel busy"
        await asyncio.sleep(0.2)


async def test_doctor_and_kernel_room_say_what_the_kernels_hold_and_what_is_idle(tmp_path):
    criu_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    server = RealServer(root, tmp_path / "store", tmp_path / "server.log", f"--GPUCR.host_memory_budget={BUDGET}",
                        f"--GPUCR.kernel_memory={KERNEL}", "--GPUCR.min_resident_s=0",
                        "--GPUCR.suspend_on_stop=False")
    try:
        await server.wait_ready()
        busy, idle = [(await server.request("api/kernels", "POST", {"name": "python3"}))["id"] for _ in range(2)]
        ws_idle = await server.ws(idle)
        await execute(ws_idle, "x = 1")
        ws_busy = await server.ws(busy)
        await send(ws_busy, request("import time; time.sleep(60)"))
        await wait_busy(server, busy)

        out = await gpucr("--json", "doctor", runtime=root / "runtime")
        memory = json.loads(out.stdout)["memory"]
        assert memory["server"] == f"{server.url}/" and memory["not_asked"] is None
        host = memory["places"][-1]
        assert (host["where"], host["total"], host["held_by_kernels"], host["idle"], host["free"]) == (
            "host memory", BUDGET, 2 * KERNEL, KERNEL, 2 * KERNEL)
        kept = {k["kernel_id"]: k["kept"] for k in host["kernels"]}
        assert kept == {busy: "running a cell", idle: None}

        text = (await gpucr("doctor", runtime=root / "runtime")).stdout
        section = text[text.index("GPU memory:"):].splitlines()
        if not gpus.list_gpus():
            assert section[1] == "    no GPU"
        assert ("    host memory budget: 1.0 GiB of 2.0 GiB counted for kernels, 1.0 GiB of it held by 2 kernels, "
                "512 MiB idle (could be made room of); 1.0 GiB free") in section
        assert section[-1] == f"    kernels: as the Jupyter server at {server.url}/ counts them"

        auth = ["--server", server.url, "--token", "secret-token"]
        room = (await gpucr("kernel", "room", *auth, runtime=tmp_path)).stdout.splitlines()
        rows = {line.split()[0]: line for line in room if line.startswith("    ")}
        assert rows[busy].endswith("kept: running a cell")
        assert rows[idle].endswith("could be suspended to make room")
        ws_idle.close()
        ws_busy.close()
    finally:
        server.sigterm()

    alone = (await gpucr("doctor", runtime=tmp_path / "no-server")).stdout
    assert alone.splitlines()[-1].startswith("    kernels: not counted (No running Jupyter server found for this user.")

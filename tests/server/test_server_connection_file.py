"""Clients that reach a suspended kernel by its connection file, not through the server: `jupyter
run --existing` (jupyter_client's wait_for_ready: the heartbeat, then kernel_info) and a
BlockingKernelClient that sends at once. Their first request wakes the kernel and is answered
once it is back; a heartbeat or an iopub subscriber alone leaves it on disk."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time

import zmq

from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server_lifecycle import RealServer

CLIENT = """
import json, sys, time
from jupyter_client import BlockingKernelClient
client = BlockingKernelClient(connection_file=sys.argv[1])
client.load_connection_file()
client.start_channels()
t0 = time.monotonic()
msg_id = client.execute(sys.argv[2])
while True:
    msg = client.get_iopub_msg(timeout=60)
    if msg["parent_header"].get("msg_id") == msg_id and msg["msg_type"] == "stream":
        print(json.dumps([msg["content"]["text"], time.monotonic() - t0]))
        break
"""


def first_output(connection_file: str, code: str) -> tuple[str, float]:
    """What a BlockingKernelClient (its own process) that sends ``code`` at once prints first, and when."""
    out = subprocess.run([sys.executable, "-c", CLIENT, connection_file, code], capture_output=True, text=True,
                         timeout=120, check=True)
    text, took = json.loads(out.stdout)
    return text, took


async def state(server: RealServer, kid: str) -> str:
    return (await server.get(f"api/gpucr/kernels/{kid}"))["state"]


async def test_clients_of_the_connection_file_wake_the_kernel_and_are_answered(tmp_path):
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    server = RealServer(root, store, log)
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await execute(ws, "x = 42")
        ws.close()
        connection_file = root / "runtime" / f"kernel-{kid}.json"
        info = json.loads(connection_file.read_text())
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})

        # A monitor: its heartbeat is answered, its subscription and its connection to the control
        # port (jupyter-resource-usage's usage requests) wait; none of them wakes the kernel.
        control = socket.create_connection((info["ip"], info["control_port"]), timeout=5)
        context = zmq.Context()
        hb = context.socket(zmq.REQ)
        hb.connect(f"tcp://{info['ip']}:{info['hb_port']}")
        sub = context.socket(zmq.SUB)
        sub.connect(f"tcp://{info['ip']}:{info['iopub_port']}")
        hb.send(b"ping")
        assert hb.poll(5000) and hb.recv() == b"ping"
        await asyncio.sleep(1.5)
        assert await state(server, kid) == "suspended"
        context.destroy(linger=0)
        control.close()

        # jupyter run --existing: waits for the heartbeat and kernel_info, then runs the file.
        script = tmp_path / "script.py"
        script.write_text("print(x + 1)\n")
        t0 = time.monotonic()
        run = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "jupyter_client.runapp", "--existing",
                                                       str(connection_file), str(script)],
                                      capture_output=True, text=True, timeout=120)
        assert run.returncode == 0 and run.stdout.strip() == "43", (run.returncode, run.stdout, run.stderr)
        assert await state(server, kid) == "running"
        print(f"jupyter run --existing answered in {time.monotonic() - t0:.2f} s")

        # Suspended again: a client that sends at once is answered too, not lost.
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        text, took = await asyncio.to_thread(first_output, str(connection_file), "print(x)")
        assert text == "42\n"
        assert await state(server, kid) == "running"
        print(f"a BlockingKernelClient's first execute answered in {took:.2f} s")
    finally:
        assert server.sigterm() == 0

"""What a client hears while a restore runs, and what it is told when the restore finds a port of
the kernel taken, through a real jupyter server, real kernels and real CRIU.

- A slow restore (a delay put in front of the engine, in this test only) keeps a client that
  times out between two reads alive (ag2's executor with ``timeout=5`` reported a timeout for
  code that ran when gpucr spoke every 15 s): a websocket ping every ``c.GPUCR.restore_keepalive_s``
  seconds, no extra Jupyter message; it hears one ``busy`` for its request at once, then the
  request's own messages in order, as from a fresh kernel.
- A kernel port bound (not listening) by another process while the kernel is on disk: REST resume
  answers 409 naming the port and the process; once it is freed the resume works."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import websocket
from jupyter_client.jsonutil import json_default
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.server.engines import CriuEngine
from tests.agent_servers import Served, kill_leftovers
from tests.conftest import criu_or_skip
from tests.kernel_ws import collect, request, send
from tests.kernel_ws import execute as run_cell
from tests.server.test_server import fetch_json, jp_server_config, new_session, open_ws  # noqa: F401

pytestmark = pytest.mark.timeout(240)

KEEPALIVE_S = 1.0
DELAY_S = 6.0


@pytest.mark.parametrize("jp_server_config", [{"restore_keepalive_s": KEEPALIVE_S}], indirect=True)
async def test_a_client_waiting_for_a_slow_restore_keeps_waiting_and_hears_one_busy(
        jp_fetch, jp_ws_fetch, jp_serverapp, jp_http_port, jp_base_url, jp_auth_header, monkeypatch):
    kid = (await new_session(jp_fetch, "slow.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    reply, _, _ = await run_cell(ws, "x = 41")
    assert reply["content"]["status"] == "ok"
    ws.close()
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert st["state"] == "suspended"

    resume = CriuEngine.resume

    async def slow_resume(self, *args, **kwargs):
        await asyncio.sleep(DELAY_S)
        return await resume(self, *args, **kwargs)

    monkeypatch.setattr(CriuEngine, "resume", slow_resume)
    cell = request("x += 1\nprint(x)")
    url = f"ws://127.0.0.1:{jp_http_port}{jp_base_url}api/kernels/{kid}/channels?session_id={cell['header']['session']}"

    def ag2_executor() -> list[tuple[float, dict]]:
        """ag2's JupyterKernelClient's own calls (websocket-client; settimeout, then recv until the
        cell's idle): a WebSocketTimeoutException here is its "Timeout waiting for output"."""
        client = websocket.create_connection(url, header=[f"{k}: {v}" for k, v in jp_auth_header.items()])
        client.settimeout(KEEPALIVE_S + 1.5)  # a loaded machine's margin
        client.send(json.dumps(cell, default=json_default))
        heard = []  # every message for the cell, with when it came
        try:
            # up to the cell's idle, and its reply: the shell's reply and iopub's idle come from two
            # sockets, in either order (ag2 itself stops at the idle)
            while not (any(m["msg_type"] == "execute_reply" for _, m in heard) and
                       any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for _, m in heard)):
                msg = json.loads(client.recv())
                if msg["parent_header"].get("msg_id") == cell["header"]["msg_id"]:
                    heard.append((time.monotonic(), msg))
            return heard
        finally:
            client.close()

    sent = time.monotonic()
    heard = await asyncio.to_thread(ag2_executor)
    kinds = [m["msg_type"] if m["msg_type"] != "status" else m["content"]["execution_state"] for _, m in heard]
    assert heard[-1][0] - sent >= DELAY_S, kinds  # it did wait for the slow restore, kept alive by pings
    # what a fresh kernel says: one busy, at once, first; one idle, last; nothing else but the cell's own
    assert heard[0][0] - sent < KEEPALIVE_S + 1.5, kinds
    assert kinds[0] == "busy" and kinds.count("busy") == 1, kinds
    assert kinds.count("idle") == 1 and kinds.index("idle") >= len(kinds) - 2, kinds  # last but the reply
    assert "execute_reply" in kinds and "stream" in kinds, kinds
    out = "".join(m["content"]["text"] for _, m in heard if m["msg_type"] == "stream")
    assert out == "42\n"
    reply = next(m for _, m in heard if m["msg_type"] == "execute_reply")
    assert reply["content"]["status"] == "ok"


BIND = """import socket, sys, time
s = socket.socket()
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
except OSError as e:
    print("taken", e, flush=True)
    sys.exit(0)
print("bound", flush=True)
time.sleep(300)
"""


def _kernel_ports(runtime: Path, kid: str) -> list[int]:
    info = json.loads((runtime / f"kernel-{kid}.json").read_text())
    return [info[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]


def _bind_one(ports: list[int]) -> tuple[subprocess.Popen, int]:
    """Another process binds one of ``ports`` without listening (the first that is free)."""
    for port in ports:
        squatter = subprocess.Popen([sys.executable, "-c", BIND, str(port)], stdout=subprocess.PIPE, text=True)
        assert squatter.stdout is not None
        if squatter.stdout.readline().startswith("bound"):
            return squatter, port
        squatter.wait()
    raise AssertionError(f"none of the kernel's ports {ports} could be bound")


async def test_a_port_bound_by_another_process_is_a_conflict_naming_it(tmp_path):
    """The first server suspends its kernel as it stops; another process binds one of the
    kernel's ports (bound only, not listening); the next server on the same store answers the
    resume with 409 naming the port and the process; once it is freed, the resume works."""
    criu_or_skip()
    store, root = tmp_path / "store", tmp_path / "root"
    first = Served("server", root, store)
    squatter = None
    try:
        await first.wait_ready()
        kid = await first.start_kernel()
        ws = await first.ws(kid)
        reply, _, _ = await run_cell(ws, "x = 42", timeout=60)
        assert reply["content"]["status"] == "ok"
        ws.close()
        ports = _kernel_ports(root / "runtime", kid)
        assert first.stop() == 0  # its kernels go to disk
        squatter, port = _bind_one(ports)

        second = Served("server", root, store)
        try:
            await second.wait_ready()
            await second.wait_state(kid, "suspended")
            with pytest.raises(HTTPClientError) as err:
                await second.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
            assert err.value.code == 409, str(err.value)
            body = json.loads(err.value.response.body)
            assert body["error"] == "AddressInUseError", body
            assert f"Port {port} (127.0.0.1), which the process had bound, is now held by PID {squatter.pid}" \
                in body["message"], body
            assert "bound, not listening" in body["message"] and "checkpoint is kept" in body["hint"], body
            assert await second.state(kid) == "suspended"

            squatter.kill()
            squatter.wait()
            squatter = None
            st = await second.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
            assert st["state"] == "running"
            ws = await second.ws(kid)
            msg = request("print(x)")
            await send(ws, msg)
            reply, out, _ = await collect(ws, msg["header"]["msg_id"], timeout=60)
            assert reply["content"]["status"] == "ok" and out == "42\n"
            ws.close()
        finally:
            second.stop()
    finally:
        if squatter is not None:
            squatter.kill()
            squatter.wait()
        if first.proc.poll() is None:
            first.proc.kill()
        kill_leftovers(tmp_path)

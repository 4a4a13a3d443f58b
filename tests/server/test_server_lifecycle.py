"""Idle suspension, culling, events, and a real server process stopped with SIGTERM and
started again on the same store (what JupyterHub does to an idle single-user server)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, new_session, open_ws

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def jp_server_config(tmp_path):
    criu_or_skip()
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "MappingKernelManager": {"cull_idle_timeout": 2, "cull_interval": 1},
        "GPUCR": {"store": str(tmp_path / "gpucr-store")},
    }


async def wait_state(jp_fetch, kid, state, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
        if st["state"] == state:
            return st
        await asyncio.sleep(0.5)
    raise AssertionError(f"kernel {kid} never reached {state}: {st}")


async def test_culling_suspends_instead_of_deleting(jp_fetch, jp_ws_fetch, server_events):
    session = await new_session(jp_fetch, "idle.ipynb")
    kid = session["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "w = 'still here'")
    ws.close()
    st = await wait_state(jp_fetch, kid, "suspended")
    assert st["checkpoint"]["reason"] == "idle"
    assert kid in [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    assert [s["kernel"]["id"] for s in await fetch_json(jp_fetch, "api", "sessions")] == [kid]
    phases = [e["phase"] for e in server_events.lifecycle() if e["kernel_id"] == kid]
    assert phases[0] == "trimming" and "dumping" in phases and phases[-1] == "done"
    ws = await open_ws(jp_ws_fetch, kid)
    _, out, _ = await execute(ws, "print(w)")
    assert out.strip().endswith("still here")
    ws.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RealServer:
    """`jupyter server` as a separate process, as JupyterHub runs a single-user server."""

    def __init__(self, root: Path, store: Path, log: Path, *options: str) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": "token secret-token"}
        env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(root / "runtime")}
        # named here too: where gpucr is not installed (the GPU machine) no config file enables it;
        # ``options`` may name the extensions instead (traitlets refuses the option twice)
        extensions = [] if any(o.startswith("--ServerApp.jpserver_extensions=") for o in options) \
            else ["--ServerApp.jpserver_extensions={'jupyter_gpucr': True}"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1", "--no-browser",
             "--allow-root", f"--ServerApp.root_dir={root}", "--IdentityProvider.token=secret-token",
             *extensions, f"--GPUCR.store={store}", *options],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env=env)

    async def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                await self.get("api/status")
                return
            except Exception:
                await asyncio.sleep(0.3)
        raise TimeoutError("server did not start")

    async def request(self, path: str, method: str = "GET", body: object = None) -> object:
        req = HTTPRequest(f"{self.url}/{path}", method=method, headers=self.headers,
                          body=None if body is None else json.dumps(body), request_timeout=120)
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:  # say what the server answered, not only its status
            body = e.response.body.decode(errors="replace") if e.response is not None and e.response.body else ""
            raise HTTPClientError(e.code, f"{e.message} on {method} {path}: {body[:2000]}", e.response) from None
        return json.loads(resp.body) if resp.body else None

    async def get(self, path: str) -> object:
        return await self.request(path)

    async def wait_listed(self, kid: str, timeout: float = 10) -> None:
        """Suspended kernels are listed once the extension has started."""
        deadline = time.monotonic() + timeout
        while kid not in [k["id"] for k in await self.get("api/kernels")]:
            assert time.monotonic() < deadline, f"kernel {kid} was never listed"
            await asyncio.sleep(0.2)

    async def ws(self, kid: str):
        req = HTTPRequest(f"ws://127.0.0.1:{self.port}/api/kernels/{kid}/channels?session_id=s1", headers=self.headers)
        return await websocket_connect(req)

    def sigterm(self, timeout: float = 120) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


async def test_sigterm_suspends_all_and_next_server_restores(tmp_path):
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    first = RealServer(root, store, log)
    try:
        await first.wait_ready()
        session = await first.request("api/sessions", "POST", {"path": "keep.ipynb", "type": "notebook",
                                                               "name": "keep.ipynb", "kernel": {"name": "python3"}})
        kid = session["kernel"]["id"]
        ws = await first.ws(kid)
        await execute(ws, "x = 42")
        ws.close()
    finally:
        assert first.sigterm() == 0
    assert "1 kernel(s) are on disk for the next start" in log.read_text()

    second = RealServer(root, store, log)
    try:
        await second.wait_ready()
        await second.wait_listed(kid)
        sessions = await second.get("api/sessions")
        assert [(s["path"], s["kernel"]["id"]) for s in sessions] == [("keep.ipynb", kid)]
        assert (await second.get(f"api/gpucr/kernels/{kid}"))["state"] == "suspended"
        ws = await second.ws(kid)
        _, out, _ = await execute(ws, "print(x)")
        assert out.strip().splitlines()[-1] == "42"
        assert (await second.get(f"api/gpucr/kernels/{kid}"))["state"] == "running"
        ws.close()
    finally:
        second.sigterm()


async def test_cli_suspends_a_server_kernel_with_the_snapshot_engine(tmp_path):
    criu_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    server = RealServer(root, tmp_path / "store", tmp_path / "server.log")
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await execute(ws, "v = [1, 2, 3]")
        cli = [sys.executable, "-m", "jupyter_gpucr.cli.main", "kernel"]
        auth = ["--server", server.url, "--token", "secret-token"]
        out = await asyncio.to_thread(subprocess.run, [*cli, "suspend", kid, "--engine", "snapshot", *auth],
                                      capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "is suspended (engine snapshot: requested)" in out.stdout
        listed = await asyncio.to_thread(subprocess.run, [*cli, "ls", "--json", *auth], capture_output=True, text=True)
        assert [s["state"] for s in json.loads(listed.stdout)] == ["suspended"]
        _, text, _ = await execute(ws, "print(sum(v))")
        assert text.strip().splitlines()[-1] == "6"
        bad = await asyncio.to_thread(subprocess.run, [*cli, "resume", "nope", *auth], capture_output=True, text=True)
        assert bad.returncode == 1 and "No kernel nope" in bad.stderr
        ws.close()
    finally:
        server.sigterm()


BIND = """import errno, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as ZeroMQ binds
try:
    s.bind(("127.0.0.1", int(sys.argv[1])))
    s.listen()
except OSError as e:
    print(errno.errorcode[e.errno])
else:
    print("bound")
"""


def bind_elsewhere(port: int) -> str:
    """What another process gets when it binds and listens on ``port``: "bound" or the errno's name."""
    out = subprocess.run([sys.executable, "-c", BIND, str(port)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


async def test_a_suspended_kernels_ports_are_held_by_this_server_and_the_next(tmp_path):
    """While the kernel is on disk no other process binds its ports, in the server that suspended
    it and in the next one on the same store (the restore binds them all the same)."""
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    first = RealServer(root, store, log)
    try:
        await first.wait_ready()
        kid = (await first.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ports = json.loads((root / "runtime" / f"kernel-{kid}.json").read_text())
        ports = [ports[k] for k in ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")]
        ws = await first.ws(kid)
        await execute(ws, "x = 42")
        await first.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        assert [bind_elsewhere(p) for p in ports] == ["EADDRINUSE"] * 5
        _, out, _ = await execute(ws, "print(x)")
        assert out == "42\n"
        assert (await first.get(f"api/gpucr/kernels/{kid}"))["state"] == "running"
        ws.close()
    finally:
        assert first.sigterm() == 0

    second = RealServer(root, store, log)
    try:
        await second.wait_ready()
        await second.wait_listed(kid)
        assert [bind_elsewhere(p) for p in ports] == ["EADDRINUSE"] * 5
        ws = await second.ws(kid)
        _, out, _ = await execute(ws, "print(x + 1)")
        assert out == "43\n"
        ws.close()
    finally:
        second.sigterm()
    assert "cannot be held" not in log.read_text()


async def test_routine_suspends_and_restores_log_next_to_nothing_and_failures_say_why(tmp_path):
    """An agent framework that pipes the server's stderr and never reads it (ag2's LocalJupyterServer)
    froze once the 64 KiB pipe filled: a suspend and a restore add almost nothing at the default
    level, while a failed restore still says why."""
    criu_or_skip()
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    server = RealServer(root, store, log)
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await execute(ws, "x = 42")
        for _ in range(2):  # the first round's one-time lines (CRIU found, the store made) aside
            before = log.stat().st_size
            await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            _, out, _ = await execute(ws, "print(x)")  # restored by the cell, as an agent's next step does
            assert out == "42\n"
            logged = log.read_bytes()[before:]
        assert len(logged) < 200, logged.decode(errors="replace")
        ws.close()

        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        images = max((store / "checkpoints").glob(f"{kid}*/images"), key=lambda p: p.stat().st_mtime)
        with open(next(images.glob("pages-*.img")), "r+b") as f:  # damaged: its checksum no longer matches
            f.write(b"\xff" * 64)
        with pytest.raises(HTTPClientError):
            await server.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
        assert f"restoring kernel {kid} failed" in log.read_text()
    finally:
        server.sigterm()

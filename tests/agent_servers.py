"""A jupyter server with gpucr and a Kernel Gateway with gpucr as separate processes, as agent
frameworks start them, with the few REST calls the tests make."""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest
from tornado.websocket import websocket_connect

from jupyter_gpucr.core.criu.commands import network_lock_tables
from tests.hub import user_env

TOKEN = "secret-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Served:
    """``kind`` "server" (jupyter server with the gpucr extension) or "gateway" (``jupyter
    kernelgateway`` with gpucr's API module); ``options`` are added to its command line; an empty
    ``token`` turns authentication off; ``user`` runs it as that Unix user (``root`` must be theirs)."""

    def __init__(self, kind: str, root: Path, store: Path, *options: str, token: str = TOKEN,
                 env: dict[str, str] | None = None, user: str | None = None, port: int | None = None) -> None:
        self.kind = kind
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.headers = {"Authorization": f"token {token}"} if token else {}
        self.log = root / f"{kind}.log"
        root.mkdir(parents=True, exist_ok=True)
        env = {**(user_env(user) if user else os.environ), "JUPYTER_RUNTIME_DIR": str(root / "runtime"), **(env or {})}
        if kind == "gateway":  # the API module on the command line, or from KG_API in ``env``
            api = [] if "KG_API" in env else ["--KernelGatewayApp.api=jupyter_gpucr.gateway"]
            cmd = [sys.executable, "-m", "kernel_gateway", *api, f"--KernelGatewayApp.port={self.port}",
                   "--KernelGatewayApp.ip=127.0.0.1", f"--KernelGatewayApp.auth_token={token}"]
        else:
            cmd = [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1", "--no-browser",
                   "--allow-root", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={token}",
                   "--ServerApp.jpserver_extensions={'jupyter_gpucr': True}"]
            if not token:  # then nothing tells a script from a page the browser was tricked into
                cmd.append("--ServerApp.disable_check_xsrf=True")
        if user:  # setpriv execs: SIGTERM reaches the server itself
            pw = pwd.getpwnam(user)
            cmd = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--init-groups", *cmd]
        self.proc = subprocess.Popen([*cmd, f"--GPUCR.store={store}", *options], cwd=root,
                                     stdout=open(self.log, "ab"), stderr=subprocess.STDOUT, env=env)

    async def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: {self.log.read_text()[-3000:]}")
            try:
                await self.request("api")
                return
            except Exception:
                await asyncio.sleep(0.2)
        raise TimeoutError(f"{self.kind} did not start: {self.log.read_text()[-3000:]}")

    async def request(self, path: str, method: str = "GET", body: object = None, timeout: float = 120) -> Any:
        req = HTTPRequest(f"{self.url}/{path}", method=method, headers=self.headers,
                          body=None if body is None else json.dumps(body), request_timeout=timeout,
                          allow_nonstandard_methods=True)
        try:
            resp = await AsyncHTTPClient().fetch(req)
        except HTTPClientError as e:  # say what it answered, not only its status
            text = e.response.body.decode(errors="replace") if e.response is not None and e.response.body else ""
            if e.code == 599:  # no answer at all: was it this process or the server?
                text += f" [{self._reachable()}]"
            raise HTTPClientError(e.code, f"{e.message} on {method} {path}: {text[:2000]}", e.response) from None
        return json.loads(resp.body) if resp.body else None

    def _reachable(self) -> str:
        """Whether a plain connection to the server gets through now (tornado's own goes through this
        process's event loop and resolver), and the CRIU network locks the host holds."""
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=2).close()
            plain = "a plain connection to the port gets through now"
        except OSError as e:
            plain = f"a plain connection to the port fails too: {e}"
        try:
            locks = str(len(network_lock_tables()))
        except OSError as e:
            locks = f"not listed ({e})"
        return f"{plain}; server process {'running' if self.proc.poll() is None else 'ended'}; CRIU network locks held: {locks}"

    async def start_kernel(self, **body: Any) -> str:
        return (await self.request("api/kernels", "POST", {"name": "python3", **body}))["id"]

    async def state(self, kernel_id: str) -> str:
        return (await self.request(f"api/gpucr/kernels/{kernel_id}"))["state"]

    async def suspend(self, kernel_id: str) -> None:
        assert (await self.request(f"api/gpucr/kernels/{kernel_id}/suspend", "POST", {}))["state"] == "suspended"

    async def wait_state(self, kernel_id: str, state: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while await self.state(kernel_id) != state:
            assert time.monotonic() < deadline, f"kernel {kernel_id} never became {state}"
            await asyncio.sleep(0.2)

    async def ws(self, kernel_id: str) -> Any:
        req = HTTPRequest(f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?session_id=s1",
                          headers=self.headers)
        return await websocket_connect(req)

    def stop(self, timeout: float = 120) -> int:
        """SIGTERM, as a process manager stops it; killed (and said so) if it does not exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


def kernel_processes(kernel_id: str) -> list[psutil.Process]:
    """The kernel's processes, found by its connection file on their command line."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(kernel_id in arg for arg in p.info["cmdline"] or ()) and "kernel" in " ".join(p.info["cmdline"] or ()):
            found.append(p)
    return found


def kill_all(servers: list[Served], root: Path) -> None:
    """After a test with several servers: kill those still running, then what they left under ``root``."""
    for s in servers:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()
    kill_leftovers(root)


def kill_leftovers(root: Path) -> None:
    """Kill what a failed test left running under ``root`` (kernels whose connection file lives there)."""
    for p in psutil.process_iter(["cmdline"]):
        if p.pid != os.getpid() and any(str(root) in arg for arg in p.info["cmdline"] or ()):
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

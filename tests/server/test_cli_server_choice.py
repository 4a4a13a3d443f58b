"""`gpucr kernel ...` with several Jupyter servers running for the user, as `jupyter server list`
shows them: it talks to the server that has the kernel, or whose root folder holds the current
folder, or says which servers it could mean; never silently the first one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tests.server.test_server_lifecycle import _free_port

TOKEN = "cli-token"


class Server:
    def __init__(self, root: Path, runtime: Path, log: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.root, self.port = root, _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1", "--no-browser",
             "--allow-root", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.jpserver_extensions={'jupyter_gpucr': True}", f"--GPUCR.store={root.parent / (root.name + '-store')}"],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT, env={**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime)})

    def api(self, method: str, path: str, **kw: object) -> requests.Response:
        return requests.request(method, self.url + path, headers={"Authorization": f"token {TOKEN}"}, timeout=60, **kw)

    def wait_ready(self, runtime: Path) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # answering and listed in the runtime folder
            try:
                if self.api("GET", "api/status").ok and any(str(self.port) in p.read_text() for p in runtime.glob("jpserver-*.json")):
                    return
            except (requests.ConnectionError, OSError):
                pass
            time.sleep(0.3)
        raise TimeoutError(f"server on {self.port} did not start")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[list[Server], Path]]:
    runtime = tmp_path / "runtime"
    started = [Server(tmp_path / "one", runtime, tmp_path / "one.log"), Server(tmp_path / "two", runtime, tmp_path / "two.log"),
               Server(tmp_path / "two" / "nested", runtime, tmp_path / "nested.log")]
    try:
        for s in started:
            s.wait_ready(runtime)
        yield started, runtime
    finally:
        for s in started:
            s.proc.terminate()
        for s in started:
            try:
                s.proc.wait(30)
            except subprocess.TimeoutExpired:
                s.proc.kill()


def gpucr(runtime: Path, cwd: Path, *args: str, **env: str) -> tuple[int, object]:
    out = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--json", "kernel", *args], cwd=cwd,
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "JUPYTER_RUNTIME_DIR": str(runtime), **env})
    return out.returncode, json.loads(out.stdout)


def test_the_server_is_chosen_as_a_user_expects_or_the_choice_is_asked_for(servers: tuple[list[Server], Path],
                                                                            tmp_path: Path) -> None:
    (one, two, nested), runtime = servers
    kid = one.api("POST", "api/kernels", json={"name": "python3"}).json()["id"]
    try:
        # From a folder no server's root holds, with no kernel named: it names all three and asks
        code, err = gpucr(runtime, tmp_path, "ls")
        assert code == 1 and "3 Jupyter servers are running" in err["message"], err
        assert all(s.url in err["message"] for s in (one, two, nested)) and "--server" in err["hint"]
        # The kernel's own server, wherever the command runs
        code, st = gpucr(runtime, tmp_path, "suspend", kid)
        assert code == 0 and st["kernel_id"] == kid and st["state"] == "suspended", st
        # The server whose root holds the current folder most closely
        (nested.root / "deeper").mkdir()
        assert gpucr(runtime, nested.root / "deeper", "ls") == (0, [])
        code, listed = gpucr(runtime, one.root, "ls")
        assert code == 0 and [k["kernel_id"] for k in listed] == [kid]
        # Named by the environment, as --server names it
        assert gpucr(runtime, tmp_path, "ls", GPUCR_SERVER_URL=two.url, GPUCR_SERVER_TOKEN=TOKEN) == (0, [])
    finally:
        one.api("DELETE", f"api/kernels/{kid}")

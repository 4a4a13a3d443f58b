"""A real JupyterHub on this machine for tests: Unix users, the gpucr daemon, the hub with
configurable-http-proxy, LocalProcessSpawner and jupyterhub-idle-culler as a hub service."""
from __future__ import annotations

import contextlib
import json
import os
import pwd
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from jupyter_gpucr.core.storage.store import read_record

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
CLEAN_PATH = f"{VENV_BIN}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_proxy() -> str | None:
    """configurable-http-proxy from PATH, else where scripts/setup.sh puts it (.venv/node)."""
    return shutil.which("configurable-http-proxy") or next(
        (str(p) for p in [REPO / ".venv/node/node_modules/.bin/configurable-http-proxy"] if os.access(p, os.X_OK)), None)


def missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "the hub test runs the hub as root and creates Unix users"
    for tool in ("useradd", "runuser", "setpriv", "unshare", "nsenter"):
        if not shutil.which(tool):
            return f"{tool} is not installed"
    if not (VENV_BIN / "jupyterhub").exists():
        return "jupyterhub is not installed in the venv (bash scripts/setup.sh installs it)"
    if not find_proxy():
        return "configurable-http-proxy is not installed (bash scripts/setup.sh installs it with npm)"
    return None


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
        return pwd.getpwnam(name)


def open_path_for_users(paths: list[Path]) -> dict[Path, int]:
    """Make the venv's Python (which may live under /root) and the repository reachable by other
    users: add search permission (o+x, not listing) to every directory above them that lacks it.
    Returns the original modes, to put back."""
    changed: dict[Path, int] = {}
    for target in paths:
        for d in [*reversed(target.parents), target]:
            mode = d.stat().st_mode
            if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
                changed[d] = stat.S_IMODE(mode)
                os.chmod(d, stat.S_IMODE(mode) | stat.S_IXOTH)
    return changed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(what: str, check: Any, timeout: float, every: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise TimeoutError(f"{what} did not happen within {timeout:.0f} s")


def wait_answering(what: str, proc: subprocess.Popen, log: Path, answers: Callable[[], bool], timeout: float = 60) -> None:
    """Until the HTTP probe ``answers`` says yes; fails at once, with the end of its log, when the
    process ``proc`` serving it exits."""
    def up() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            return answers()
        except requests.ConnectionError:
            return False

    wait_until(what, up, timeout)


def _pythonpath() -> dict[str, str]:
    """Where the package is only on PYTHONPATH and CRIU only named by GPUCR_CRIU (the GPU machine),
    the daemon and the users' processes need them too."""
    return {k: os.environ[k] for k in ("PYTHONPATH", "GPUCR_CRIU") if os.environ.get(k)}


def user_env(user: str) -> dict[str, str]:
    """The environment a test runs ``user``'s code in."""
    return {"PATH": CLEAN_PATH, "HOME": pwd.getpwnam(user).pw_dir, "LANG": "C.UTF-8", **_pythonpath()}


def as_user(user: str, code: str, timeout: float = 60) -> dict[str, Any]:
    """Run Python ``code`` as ``user`` (the venv's interpreter); it prints one JSON line."""
    out = subprocess.run(["runuser", "-u", user, "--", sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=timeout, env=user_env(user))
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@dataclass
class Daemon:
    socket: Path
    state: Path
    proc: subprocess.Popen
    log: Path

    def user_store(self, uid: int) -> Path:
        return self.state / "users" / str(uid)

    def stop(self) -> None:
        """Stop the daemon, then the processes it started for the test's users (by their PIDs)."""
        self.proc.terminate()
        self.proc.wait(10)
        for proc_dir in self.state.glob("users/*/procs/*"):
            rec = read_record(proc_dir)
            if rec.get("state") == "running" and rec.get("pid"):
                try:
                    init = int(Path(f"/proc/{rec['pid']}/stat").read_text().rsplit(")", 1)[1].split()[1])
                    os.kill(init, signal.SIGKILL)
                except (OSError, ValueError, IndexError):
                    pass


def daemon_command() -> list[str]:
    """The installed console script, or the module where the package is only on PYTHONPATH (the GPU machine)."""
    script = VENV_BIN / "gpucr-daemon"
    return [str(script)] if script.exists() else [sys.executable, "-m", "jupyter_gpucr.daemon.server"]


def start_daemon(root: Path, *options: str) -> Daemon:
    """The daemon on a socket and a store under ``root``, with ``options`` on its command line."""
    sock_dir = root / "run"
    sock_dir.mkdir(mode=0o755)
    log = root / "daemon.log"
    proc = subprocess.Popen([*daemon_command(), "--socket", str(sock_dir / "daemon.sock"), "--state-dir",
                             str(root / "state"), *options], stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                            env={"PATH": CLEAN_PATH, "LANG": "C.UTF-8", **_pythonpath()})
    wait_until("the daemon socket", lambda: (sock_dir / "daemon.sock").exists() or proc.poll() is not None, 30, 0.1)
    assert proc.poll() is None, log.read_text()
    return Daemon(sock_dir / "daemon.sock", root / "state", proc, log)


@contextlib.contextmanager
def daemon_for(users: Sequence[str], prefix: str, *options: str) -> Iterator[Daemon]:
    """A real gpucr-daemon (root) for ``users``, who are created if missing and may reach this
    Python and the repository; stopped, and its folder removed, afterwards."""
    for user in users:
        ensure_user(user)
    opened = open_path_for_users([Path(sys.executable).resolve(), REPO])
    root = Path(tempfile.mkdtemp(prefix=prefix))
    os.chmod(root, 0o755)
    d = start_daemon(root, *options)
    try:
        yield d
    finally:
        d.stop()
        for path, mode in opened.items():
            os.chmod(path, mode)
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Hub:
    url: str
    token: str
    proc: subprocess.Popen
    log: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def api(self, method: str, path: str, **kw: Any) -> requests.Response:
        return requests.request(method, f"{self.url}/hub/api{path}", headers={"Authorization": f"token {self.token}"},
                                timeout=60, **kw)

    def user_token(self, user: str) -> str:
        if user not in self.tokens:
            r = self.api("POST", f"/users/{user}/tokens", json={"note": "gpucr test"})
            assert r.status_code in (200, 201), r.text
            self.tokens[user] = r.json()["token"]
        return self.tokens[user]

    def server(self, user: str) -> dict[str, Any] | None:
        return self.api("GET", f"/users/{user}").json().get("servers", {}).get("")

    def start_server(self, user: str, timeout: float = 90) -> dict[str, Any]:
        r = self.api("POST", f"/users/{user}/server")
        assert r.status_code in (201, 202), r.text
        return wait_until(f"{user}'s server to be ready", lambda: (s := self.server(user)) and s.get("ready") and s, timeout)

    def wait_stopped(self, user: str, timeout: float) -> None:
        wait_until(f"{user}'s server to stop", lambda: self.server(user) is None, timeout, 1.0)

    def as_user(self, user: str, method: str, path: str, token_of: str | None = None, **kw: Any) -> requests.Response:
        """A request to ``user``'s single-user server through the proxy, with the token of ``token_of``."""
        token = self.user_token(token_of or user)
        return requests.request(method, f"{self.url}/user/{user}{path}", headers={"Authorization": f"token {token}"},
                                timeout=120, allow_redirects=False, **kw)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


HUB_CONFIG = """
c = get_config()  # noqa
c.JupyterHub.bind_url = {url!r}
c.JupyterHub.hub_bind_url = "http://127.0.0.1:{hub_port}"
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{proxy_api_port}"
c.ConfigurableHTTPProxy.command = [{proxy!r}]
c.JupyterHub.db_url = "sqlite:///{root}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{root}/cookie_secret"
c.JupyterHub.pid_file = "{root}/jupyterhub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {users!r}
c.JupyterHub.spawner_class = "localprocess"
c.JupyterHub.last_activity_interval = 5
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--GPUCR.daemon_socket={socket}", "--GPUCR.stop_budget=40"]
c.Spawner.environment = {{"GPUCR_SPAWNER_STOP_TIMEOUT": "60", "PATH": {path!r}}}
c.Spawner.poll_interval = 2
c.Spawner.start_timeout = 90
c.Spawner.http_timeout = 90
# SIGINT, then up to interrupt_timeout for the server to stop (its kernels go to disk meanwhile), then SIGTERM, SIGKILL
c.LocalProcessSpawner.interrupt_timeout = 60
c.JupyterHub.services = [
    {{"name": "tester", "api_token": {token!r}}},
    {{"name": "idle-culler", "command": [{python!r}, "-m", "jupyterhub_idle_culler", "--timeout={cull_timeout}",
                                         "--cull-every=5", "--concurrency=2"]}},
]
c.JupyterHub.load_roles = [
    {{"name": "tester", "services": ["tester"],
      "scopes": ["admin:users", "admin:servers", "admin:server_state", "tokens", "access:servers"]}},
    {{"name": "idle-culler", "services": ["idle-culler"],
      "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"]}},
]
"""


def start_hub(root: Path, daemon_socket: Path, users: list[str], cull_timeout: int) -> Hub:
    url = f"http://127.0.0.1:{free_port()}"
    token = secrets.token_hex(16)
    config = root / "jupyterhub_config.py"
    config.write_text(HUB_CONFIG.format(
        url=url, hub_port=free_port(), proxy_api_port=free_port(), proxy=find_proxy(), root=root, users=set(users),
        singleuser=str(VENV_BIN / "jupyterhub-singleuser"), socket=daemon_socket, path=CLEAN_PATH, token=token,
        python=sys.executable, cull_timeout=cull_timeout))
    log = root / "hub.log"
    proc = subprocess.Popen([str(VENV_BIN / "jupyterhub"), "-f", str(config)], cwd=root, stdout=open(log, "wb"),
                            stderr=subprocess.STDOUT, env={"PATH": CLEAN_PATH, "LANG": "C.UTF-8", "HOME": str(root)},
                            start_new_session=True)
    hub = Hub(url, token, proc, log)

    wait_answering("the hub", proc, log, lambda: hub.api("GET", "/").status_code == 200)
    for user in users:
        hub.api("POST", f"/users/{user}")
    return hub

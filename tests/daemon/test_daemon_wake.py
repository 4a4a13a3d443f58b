"""Idle pause and wake on request for an unprivileged user, through a real gpucr daemon (root) and
real CRIU: the user's waker holds the port while the process is checkpointed, the daemon's CRIU,
running as the user, restores the process's socket beside it (the same owner's SO_REUSEPORT), and
the next connection is served with the process's state kept."""
from __future__ import annotations

import json
import os
import pwd
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import hub as H
from tests.conftest import criu_or_skip, wait_for_line

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(H.missing_requirement() is not None,
                                                             reason=H.missing_requirement() or "")]
USER = "crwake"
AGENT = str(Path(__file__).parents[1] / "core" / "idle_agent.py")


@pytest.fixture
def daemon() -> Iterator[H.Daemon]:
    criu_or_skip()
    subprocess.run(["pkill", "-KILL", "-u", USER], check=False)  # an earlier run's processes
    with H.daemon_for([USER], "gpucr-daemon-wake-") as d:
        yield d
    subprocess.run(["pkill", "-KILL", "-u", USER], check=False)  # the waker, should the test fail before it ends


def curl(port: int) -> dict:
    out = subprocess.run(["curl", "-sS", "--max-time", "60", f"http://127.0.0.1:{port}/"], capture_output=True,
                         text=True, timeout=90)
    assert out.returncode == 0, f"curl failed ({out.returncode}): {out.stderr}"
    return json.loads(out.stdout)


def wait_for(what, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(0.1)
    raise TimeoutError(what)


def listener_owner(pid: int, port: int) -> int:
    """The owner of the socket with which ``pid`` listens on ``port`` (what ``ss -e`` shows as uid)."""
    inode = next(int(line.split()[9]) for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
                 if line.split()[3] == "0A" and int(line.split()[1].split(":")[1], 16) == port)
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        if os.readlink(fd) == f"socket:[{inode}]":
            return fd.stat().st_uid
    raise AssertionError(f"PID {pid} does not listen on {port}")


def test_a_users_idle_agent_is_paused_and_woken_through_the_daemon(daemon: H.Daemon) -> None:
    user = pwd.getpwnam(USER)
    store = Path(user.pw_dir) / "gpucr-store"
    port = H.free_port()
    H.as_user(USER, f"""
import json, sys
from jupyter_gpucr.core.pausing.activation import WakeOn
from jupyter_gpucr.core.pausing.waker import start_waker
from jupyter_gpucr.daemon.client import DaemonCheckpointer
cr = DaemonCheckpointer({str(store)!r}, {str(daemon.socket)!r})
cr.run("web", [sys.executable, {AGENT!r}, "{port}", "10"], cwd={user.pw_dir!r})
start_waker(cr.store, "web", [WakeOn.parse("tcp:127.0.0.1:{port}")], 1.0, daemon_socket={str(daemon.socket)!r})
print("{{}}")
""")
    hello = wait_for_line(daemon.user_store(user.pw_uid) / "procs" / "web" / "stdout.log")
    waker = store / "procs" / "web" / "waker.json"
    try:
        first = curl(port)
        for counter in (1, 2, 3):  # awake, then woken twice: the restored socket is paused and woken again
            answer = first if counter == 1 else curl(port)
            assert answer == {**first, "counter": counter, "checksum": hello["checksum"]}, answer
            record = json.loads((daemon.user_store(user.pw_uid) / "procs" / "web" / "run.json").read_text())
            assert listener_owner(record["pid"], port) == user.pw_uid  # not root's, after a restore by root
            if counter == 3:
                break
            wait_for(lambda: json.loads(waker.read_text())["state"] in ("idle", "failed"))
            status = json.loads(waker.read_text())
            assert status["state"] == "idle" and not status["error"], status
        assert json.loads(waker.read_text())["last_wake"]["criu_restore"] > 0
    finally:
        pid = json.loads(waker.read_text()).get("pid")
        if pid:
            os.kill(pid, signal.SIGKILL)  # the daemon fixture ends the process

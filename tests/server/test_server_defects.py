"""Defects found trying the server as users do, each through a real jupyter server, real kernels
and real CRIU: a websocket opened in any phase of a suspend is answered after it, a suspended
kernel whose manifest cannot be read still connects and says why it cannot come back, a restart
restarts the idle clock, and the smaller rough edges (file modes, messages, readiness)."""
from __future__ import annotations

import asyncio
import json
import logging
import pathlib
import re
import shlex
import signal
import stat
import subprocess
import sys
import time

import psutil
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.storage.store import MANIFEST
from jupyter_gpucr.server.lifecycle import EVENT_SCHEMA_ID
from tests.conftest import criu_or_skip
from tests.kernel_ws import collect, message, request, send
from tests.kernel_ws import execute as run_cell
from tests.server.test_server import fetch_json, jp_server_config, kernel_pid, new_session, open_ws  # noqa: F401
from tests.server.test_server_faults import _leave_nothing_running
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(300)

#: About 600 MiB in the kernel: its dump takes long enough to open a websocket in each phase.
BIG = "import numpy as np\na = np.ones(75_000_000)\nn = 0"
COUNT = "n += 1\nprint(n)"


class Phases:
    """The suspend phases the server announced on its event bus, to act in a given one."""

    def __init__(self, serverapp, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self.seen: list[str] = []
        self._changed = asyncio.Event()
        serverapp.event_logger.add_listener(schema_id=EVENT_SCHEMA_ID, listener=self._on_event)

    async def _on_event(self, logger, schema_id, data) -> None:
        if data["kernel_id"] != self.kernel_id:
            return
        if data["phase"] not in self.seen[-1:]:
            self.seen.append(data["phase"])
            self._changed.set()

    async def reached(self, phase: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while phase not in self.seen:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), max(0.1, deadline - time.monotonic()))


async def until_frozen(pid: int, timeout: float = 30) -> None:
    """Until CRIU holds the kernel stopped to dump it (it seizes it with ptrace)."""
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() not in (psutil.STATUS_TRACING_STOP, psutil.STATUS_STOPPED):
        assert time.monotonic() < deadline, "CRIU never froze the kernel"
        await asyncio.sleep(0.001)


async def test_a_websocket_opened_during_a_dump_is_answered_after_the_restore(jp_fetch, jp_ws_fetch, jp_serverapp,
                                                                             caplog):
    """A second tab (or an agent's client) connects while the kernel is being dumped and runs a
    cell: the connection opens at once, the cell waits until the suspend is complete, restores the
    kernel and runs exactly once. Five times in a row, as the race is a matter of timing."""
    kid = (await new_session(jp_fetch, "race.ipynb"))["kernel"]["id"]
    first = await open_ws(jp_ws_fetch, kid)
    await run_cell(first, BIG)
    first.close()
    phases = Phases(jp_serverapp, kid)
    # five times in the dump, whose race this is, and once in each other phase of a suspend
    for i, phase in enumerate(["dumping"] * 5 + ["trimming", "gpu-checkpoint", "verifying"], 1):
        phases.seen.clear()
        pid = kernel_pid(jp_serverapp, kid)
        suspend = asyncio.ensure_future(fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST",
                                                   body={}))
        await phases.reached(phase)
        if phase == "dumping":
            await until_frozen(pid)
        t0 = time.monotonic()
        ws = await open_ws(jp_ws_fetch, kid, f"late-{i}")
        opened = time.monotonic() - t0
        cell = request(COUNT)
        await send(ws, cell)
        assert not suspend.done(), (i, phase)  # sent while the suspend ran
        reply, out, statuses = await collect(ws, cell["header"]["msg_id"], timeout=50)
        assert (await suspend)["state"] == "suspended"  # the suspend was not disturbed
        assert reply["content"]["status"] == "ok" and out == f"{i}\n", (i, phases.seen, reply["content"], out)
        assert opened < 5, (i, opened)
        assert statuses[-1] == "idle"
        state = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
        # the cell restored the kernel: it did not reach the kernel while it was being suspended
        assert state["state"] == "running" and state["restored_at"], (i, phase, phases.seen, state)
        ws.close()
    # nor did jupyter_server nudge a frozen kernel, or write to websockets it had closed
    noise = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.pathname.endswith("channels.py")]
    assert noise == [], noise[:5]


async def test_a_suspended_kernel_whose_manifest_cannot_be_read_connects_and_says_why(jp_fetch, jp_ws_fetch,
                                                                                      jp_serverapp):
    """Opening the notebook of such a kernel must not fail the websocket (its read-ahead cannot
    read the checkpoint): it connects, answers what it can from memory, and a cell gets the same
    error the REST API gives, naming the file."""
    kid = (await new_session(jp_fetch, "damaged.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await run_cell(ws, "x = 1")
    ws.close()
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    manifest = pathlib.Path(st["checkpoint"]["path"]) / MANIFEST
    manifest.write_text("{")
    ws = await open_ws(jp_ws_fetch, kid, "reopened")  # was HTTP 500
    info = message("kernel_info_request", {})
    await send(ws, info)
    reply, _, _ = await collect(ws, info["header"]["msg_id"], timeout=10)
    assert reply["content"]["implementation"] == "ipython"
    reply, out, statuses = await run_cell(ws, "print(x)", timeout=30)
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "resume", method="POST", body="{}")
    rest = json.loads(err.value.response.body)
    assert err.value.code == 422 and str(manifest) in rest["message"], rest
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RestoreFailed"
    assert rest["message"] in reply["content"]["evalue"] and rest["message"] in out
    assert statuses[-1] == "idle"
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "suspended" and str(manifest) in st["error"]
    ws.close()


async def stays_running(server: RealServer, kid: str, seconds: float) -> None:
    since = time.monotonic()
    while time.monotonic() - since < seconds:
        st = await server.get(f"api/gpucr/kernels/{kid}")
        assert st["state"] == "running", (time.monotonic() - since, st)
        await asyncio.sleep(0.2)


async def test_a_restarted_kernel_is_idle_from_its_restart_on(tmp_path):
    """Kernel > Restart in JupyterLab on a suspended notebook gives a fresh kernel: the idle
    suspension counts from the restart, not from the old kernel's last cell, and then from the
    new kernel's cells (a running kernel's restart takes the same path, minus the disk)."""
    criu_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    server = RealServer(root, tmp_path / "store", tmp_path / "server.log", "--GPUCR.idle_timeout=4",
                        "--GPUCR.idle_check_interval=1")
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await run_cell(ws, "x = 1")
        ws.close()
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        await asyncio.sleep(2.5)
        await server.request(f"api/kernels/{kid}/restart", "POST", {})
        await stays_running(server, kid, 2)  # idle for less than idle_timeout since the restart
        ws = await server.ws(kid)
        await run_cell(ws, "y = 2")
        ws.close()
        ran = time.monotonic()
        await stays_running(server, kid, 3)  # nor since the new kernel's cell
        while (st := await server.get(f"api/gpucr/kernels/{kid}"))["state"] != "suspended":  # and then it is
            assert time.monotonic() - ran < 20, st
            await asyncio.sleep(0.2)
        assert st["checkpoint"]["reason"] == "idle"
    finally:
        assert server.sigterm() == 0


async def test_the_next_server_answers_for_kernels_once_it_has_listed_those_left_running(tmp_path):
    """The server died (kill -9) with a kernel running. The next one puts that kernel on disk to
    list it: until it is listed, its API waits rather than answering 404 for it."""
    criu_or_skip()
    root, store = tmp_path / "root", tmp_path / "store"
    root.mkdir()
    server = RealServer(root, store, tmp_path / "server-0.log")
    kid = ""
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await run_cell(ws, "import numpy as np\na = np.ones(25_000_000)\nx = 42")  # a dump of a few tenths of a second
        ws.close()
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(10)
        server = RealServer(root, store, tmp_path / "server-1.log")
        await server.wait_ready()  # /api/status answers
        assert (await server.get(f"api/kernels/{kid}"))["id"] == kid
        assert (await server.get(f"api/gpucr/kernels/{kid}"))["state"] == "suspended"
        ws = await server.ws(kid)
        _, out, _ = await run_cell(ws, "print(x)")
        assert out == "42\n"
        ws.close()
        assert server.sigterm() == 0
    finally:
        if kid:
            _leave_nothing_running(server, kid)
        elif server.proc.poll() is None:
            server.sigterm()


@pytest.fixture
def small_store(tmp_path):
    """The server's store (``jp_server_config`` puts it at tmp_path/gpucr-store) on a 96 MiB
    tmpfs, mounted before the server starts."""
    store = tmp_path / "gpucr-store"
    store.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96m,mode=0700", "gpucr-test", str(store)], check=True)
    yield store
    subprocess.run(["umount", "-l", str(store)], check=True)


async def test_a_dump_that_fills_the_disk_says_so_in_sentences(small_store, jp_fetch, jp_ws_fetch, jp_serverapp):
    """The disk fills up during the dump (the check before it passed, as when something else
    writes meanwhile): the message says what happened and that the kernel runs on, as sentences."""
    jp_serverapp.kernel_manager.runtime.checkpointer.check_space = False  # so that CRIU itself runs out
    kid = (await new_session(jp_fetch, "full.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await run_cell(ws, "import numpy as np\na = np.ones(20_000_000)\nx = 42")
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}")
    body = json.loads(err.value.response.body)
    assert "No space left on device" in body["message"] and "disk is full" in body["hint"], body
    assert body["message"].endswith(": No space left on device. The process was left running."), body["message"]
    _, out, _ = await run_cell(ws, "print(x)")
    assert out == "42\n"
    ws.close()


async def test_the_log_of_a_failed_dump_is_private(jp_fetch, jp_ws_fetch, jp_serverapp):
    """CRIU refuses to dump a kernel with a child in a user namespace of its own; the log kept for
    the user is 0600, as every file of a checkpoint (it names the kernel's files)."""
    kid = (await new_session(jp_fetch, "nested.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await run_cell(ws, "import subprocess\nchild = subprocess.Popen(['unshare', '--user', 'sleep', '600'])\n"
                       "import time; time.sleep(0.5); print(child.poll())")
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}")
    body = json.loads(err.value.response.body)
    log = jp_serverapp.kernel_manager.runtime.store.proc_dir(kid) / "dump-failed.log"
    assert f"CRIU's log: {log}." in body["hint"], body
    assert stat.S_IMODE(log.stat().st_mode) == 0o600 and "nested user namespace" in log.read_text()
    assert body["message"].endswith(". The process was left running."), body["message"]
    await run_cell(ws, "child.kill(); child.wait()")
    ws.close()


def test_doctor_names_the_install_command_this_installation_has(tmp_path):
    """A pip user has no scripts/ folder: where CRIU is missing, `gpucr doctor` names a command
    this installation has, and that command is there."""
    proc = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(tmp_path / "store"),
                           "--criu", str(tmp_path / "no-criu"), "--json", "doctor"], capture_output=True, text=True,
                          timeout=120)
    criu = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}["criu"]
    assert not criu["ok"] and "scripts/" not in criu["fix"], criu
    command = re.fullmatch(r"Run '([^']+)' .*", criu["fix"])
    assert command, criu["fix"]
    shown = subprocess.run([*shlex.split(command.group(1)), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "--prefix" in shown.stdout, shown.stderr

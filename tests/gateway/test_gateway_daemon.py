"""A Kernel Gateway run by an ordinary Unix user, with no checkpoint privileges, and the gpucr
daemon (root): its kernels run as that user, go to disk whole (CRIU through the daemon, not the
snapshot engine) on request and when idle, and come back on the next execute over the
gateway's websocket; the gateway's stop puts them on disk the same way."""
from __future__ import annotations

import json
import os
import pwd
import shutil
from collections.abc import Iterator

import pytest

from jupyter_gpucr.core.storage.store import read_record
from tests import hub as H
from tests.agent_servers import Served, kernel_processes
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute

USER = "gpucr-gateway"


@pytest.fixture
def daemon() -> Iterator[H.Daemon]:
    criu_or_skip()
    if not shutil.which("useradd") or not shutil.which("setpriv"):
        pytest.skip("useradd and setpriv are needed to run the gateway as another user")
    with H.daemon_for([USER], "gpucr-gateway-daemon-") as d:
        yield d


def _manifests(daemon: H.Daemon, uid: int, kernel_id: str) -> list[dict]:
    return [json.loads(m.read_text()) for m in sorted(
        daemon.user_store(uid).glob(f"checkpoints/{kernel_id}-*/manifest.json"))]


async def test_unprivileged_gateway_suspends_whole_kernels_through_the_daemon(daemon: H.Daemon) -> None:
    pw = pwd.getpwnam(USER)
    home = daemon.state.parent / "gateway"  # the user's own folder for the gateway and its store
    home.mkdir()
    os.chown(home, pw.pw_uid, pw.pw_gid)
    gw = Served("gateway", home, home / "store", f"--GPUCR.daemon_socket={daemon.socket}", "--GPUCR.idle_timeout=3",
                "--GPUCR.idle_check_interval=1", "--GPUCR.suspend_connected=True", user=USER)
    try:
        await gw.wait_ready()
        assert f"whole-process engine: through the gpucr daemon at {daemon.socket}" in gw.log.read_text()
        kid = await gw.start_kernel()
        ws = await gw.ws(kid)
        _, out, _ = await execute(ws, "import os; x = 41; print(os.getuid(), os.environ.get('KERNEL_GATEWAY'))")
        assert out.split() == [str(pw.pw_uid), "1"]
        rec = read_record(daemon.user_store(pw.pw_uid) / "procs" / kid)
        assert rec["via"] == "daemon" and rec["state"] == "running"  # launched by the daemon, as the user

        await gw.suspend(kid)
        assert kernel_processes(kid) == []
        [manifest] = _manifests(daemon, pw.pw_uid, kid)
        assert (manifest["engine"], manifest["reason"]) == ("criu", "manual")
        assert "gpucr daemon" in manifest["engine_reason"]
        reply, out, _ = await execute(ws, "x += 1; print(x, os.getuid())")
        assert (reply["content"]["status"], out.split()) == ("ok", ["42", str(pw.pw_uid)])
        assert await gw.state(kid) == "running"

        await gw.wait_state(kid, "suspended", timeout=30)  # idle, the websocket still open
        assert kernel_processes(kid) == []
        assert _manifests(daemon, pw.pw_uid, kid)[-1]["reason"] == "idle"
        assert _manifests(daemon, pw.pw_uid, kid)[-1]["engine"] == "criu"
        reply, out, _ = await execute(ws, "x += 1; print(x)")
        assert (reply["content"]["status"], out.strip()) == ("ok", "43")
        ws.close()
    finally:
        stopped = gw.stop()
    assert stopped == 0
    assert "1 kernel(s) are on disk for the next start" in gw.log.read_text()  # the stop went through the daemon too
    assert (_manifests(daemon, pw.pw_uid, kid)[-1]["reason"], kernel_processes(kid)) == ("server-stop", [])

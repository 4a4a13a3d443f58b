"""JupyterHub for real: the hub (root) spawns single-user servers as Unix users with
LocalProcessSpawner; they have no checkpoint privileges and use the gpucr daemon. The idle culler
stops alice's server, whose kernel goes to disk whole (CRIU through the daemon) before the server
exits; she comes back and her variables are there. bob reaches none of it (REST, daemon, files).
A server killed with SIGKILL loses nothing already suspended."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpucr.core.storage.store import read_record
from tests import hub as H
from tests.kernel_ws import run_at

pytestmark = [pytest.mark.timeout(600), pytest.mark.skipif(H.missing_requirement() is not None,
                                                             reason=H.missing_requirement() or "")]

ALICE, BOB = "alice", "bob"
CULL_TIMEOUT = 15
SETUP = "import numpy as np\nx = 42\na = np.arange(1_000_000, dtype=np.int64) * 3\nprint('ready')"
CHECK = "print(x, int(a.sum()))"
EXPECTED = f"42 {sum(range(1_000_000)) * 3}"


@pytest.fixture(scope="module")
def world(request: pytest.FixtureRequest) -> Iterator[tuple[H.Hub, H.Daemon]]:
    users = {u: H.ensure_user(u) for u in (ALICE, BOB)}
    for pw in users.values():  # each run starts from an empty store
        store = Path(pw.pw_dir) / ".local/share/jupyter-gpucr"
        if store.exists():
            shutil.rmtree(store)
    failed_before = request.session.testsfailed
    opened = H.open_path_for_users([Path(sys.executable).resolve(), H.REPO])
    root = Path(tempfile.mkdtemp(prefix="gpucr-hub-"))
    os.chmod(root, 0o755)
    daemon = H.start_daemon(root)
    hub = None
    try:
        hub = H.start_hub(root, daemon.socket, list(users), CULL_TIMEOUT)
        yield hub, daemon
    finally:
        if hub is not None:
            hub.stop()
        daemon.stop()
        for path, mode in opened.items():
            os.chmod(path, mode)
        if request.session.testsfailed > failed_before:  # the hub's, the daemon's and the servers' logs
            print(f"logs kept in {root}")
        else:  # it holds the users' checkpoints: 50 MB a run, and their memory
            shutil.rmtree(root, ignore_errors=True)


def execute(hub: H.Hub, user: str, kernel_id: str, code: str) -> str:
    return run_at(f"{hub.url.replace('http', 'ws')}/user/{user}/api/kernels/{kernel_id}/channels", hub.user_token(user),
                  code)


def daemon_checkpoints(daemon: H.Daemon, uid: int, kernel_id: str) -> list[dict[str, Any]]:
    found = []
    for m in sorted(daemon.user_store(uid).glob(f"checkpoints/{kernel_id}-*/manifest.json")):
        found.append(json.loads(m.read_text()))
    return found


def mode_owner(path: Path) -> tuple[str, str]:
    st = path.stat()
    return oct(stat.S_IMODE(st.st_mode)), pwd.getpwuid(st.st_uid).pw_name


def test_alice_culled_and_back_bob_sees_nothing(world: tuple[H.Hub, H.Daemon]) -> None:
    hub, daemon = world
    alice = pwd.getpwnam(ALICE)

    # -- alice works: a kernel with x = 42 and a numpy array -----------------------------------
    hub.start_server(ALICE)
    r = hub.as_user(ALICE, "POST", "/api/sessions", json={"path": "work.ipynb", "type": "notebook", "name": "work.ipynb",
                                                          "kernel": {"name": "python3"}})
    assert r.status_code == 201, r.text
    kernel_id = r.json()["kernel"]["id"]
    assert execute(hub, ALICE, kernel_id, SETUP) == "ready"
    rec = read_record(daemon.user_store(alice.pw_uid) / "procs" / kernel_id)
    assert rec["via"] == "daemon" and rec["state"] == "running"
    assert f"Uid:\t{alice.pw_uid}\t" in Path(f"/proc/{rec['pid']}/status").read_text()  # the kernel runs as alice

    # -- the culler stops her idle server; the kernel went to disk whole before the server exited
    hub.wait_stopped(ALICE, timeout=CULL_TIMEOUT + 90)
    [manifest] = daemon_checkpoints(daemon, alice.pw_uid, kernel_id)
    assert manifest["engine"] == "criu" and manifest["reason"] == "server-stop"
    assert "gpucr daemon" in manifest["engine_reason"]
    assert manifest["owner"] == {"uid": alice.pw_uid, "user": ALICE}
    assert manifest["kernel"]["notebook_path"] == "work.ipynb"
    assert "Restoring" not in (daemon.log.read_text())  # nothing fell back to another engine
    cid = manifest["id"]
    # her images: root-only in the daemon's store; her mirror: her own, private
    dstore = daemon.user_store(alice.pw_uid)
    assert mode_owner(daemon.state) == ("0o700", "root") and mode_owner(dstore) == ("0o700", "root")
    assert mode_owner(dstore / "checkpoints" / cid) == ("0o700", "root")
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in (dstore / "checkpoints" / cid).rglob("*") if p.is_file())
    mirror = Path(alice.pw_dir) / ".local/share/jupyter-gpucr"
    assert mode_owner(mirror) == ("0o700", ALICE)
    assert mode_owner(mirror / "checkpoints" / cid / "manifest.json") == ("0o600", ALICE)

    # -- bob: his own server, the daemon and the files give him nothing of alice's ---------------
    hub.start_server(BOB)
    r = hub.as_user(BOB, "GET", "/api/gpucr/checkpoints")
    assert r.status_code == 200 and cid not in r.text and kernel_id not in r.text
    assert hub.as_user(BOB, "POST", f"/api/gpucr/kernels/{kernel_id}/resume").status_code == 404
    assert hub.as_user(BOB, "DELETE", f"/api/gpucr/checkpoints/{cid}").status_code == 404
    seen = H.as_user(BOB, f"""
import json
from jupyter_gpucr.daemon.client import DaemonClient
from jupyter_gpucr.core.errors import GPUCRError
c = DaemonClient({str(daemon.socket)!r})
out = {{"list": c.call("list")}}
for op, args in [("restore", {{"name": {kernel_id!r}}}), ("checkpoint", {{"name": {kernel_id!r}}}),
                 ("remove", {{"target": {cid!r}}}), ("remove", {{"target": {kernel_id!r}}}), ("kill", {{"name": {kernel_id!r}}}),
                 ("restore", {{"name": "../{alice.pw_uid}/procs/{kernel_id}"}})]:
    try:
        c.call(op, **args); out[op + str(args)] = "done"
    except GPUCRError as e:
        out[op + str(args)] = type(e).__name__
print(json.dumps(out))
""")
    listing = seen.pop("list")
    assert listing["procs"] == {} and listing["checkpoints"] == [] and listing["status"] == []
    assert set(seen.values()) <= {"NotFoundError", "InvalidNameError"} and "InvalidNameError" in seen.values(), seen
    files = H.as_user(BOB, f"""
import json, os
out = {{}}
for p in [{str(dstore / "checkpoints" / cid / "manifest.json")!r}, {str(dstore)!r},
          {str(mirror / "checkpoints" / cid / "manifest.json")!r}, {str(mirror)!r}]:
    try:
        open(p).read() if not os.path.isdir(p) else os.listdir(p); out[p] = "read"
    except PermissionError:
        out[p] = "denied"
print(json.dumps(out))
""")
    assert set(files.values()) == {"denied"}, files
    assert daemon_checkpoints(daemon, alice.pw_uid, kernel_id)  # still there

    # -- alice comes back (spawn through the hub API): the kernel is listed with its notebook ----
    hub.start_server(ALICE)
    sessions = hub.as_user(ALICE, "GET", "/api/sessions").json()
    assert [(s["path"], s["kernel"]["id"]) for s in sessions] == [("work.ipynb", kernel_id)]
    state = hub.as_user(ALICE, "GET", f"/api/gpucr/kernels/{kernel_id}").json()
    assert state["state"] == "suspended" and state["engine"] == "criu", state
    # bob's token opens nothing on her server
    for method, path in [("GET", "/api/gpucr/checkpoints"), ("POST", f"/api/gpucr/kernels/{kernel_id}/resume"),
                         ("DELETE", f"/api/gpucr/checkpoints/{cid}")]:
        assert hub.as_user(ALICE, method, path, token_of=BOB).status_code == 403
    assert execute(hub, ALICE, kernel_id, CHECK) == EXPECTED  # restored on first use
    state = hub.as_user(ALICE, "GET", f"/api/gpucr/kernels/{kernel_id}").json()
    assert state["state"] == "running" and state["engine"] == "criu"

    # -- suspended, then the server is killed with SIGKILL: nothing already on disk is lost -------
    r = hub.as_user(ALICE, "POST", f"/api/gpucr/kernels/{kernel_id}/suspend")
    assert r.status_code == 200 and r.json()["state"] == "suspended", r.text
    pid = hub.api("GET", f"/users/{ALICE}").json()["servers"][""]["state"]["pid"]
    os.kill(pid, signal.SIGKILL)
    hub.wait_stopped(ALICE, timeout=60)
    hub.start_server(ALICE)
    state = hub.as_user(ALICE, "GET", f"/api/gpucr/kernels/{kernel_id}").json()
    assert state["state"] == "suspended" and state["engine"] == "criu", state
    assert execute(hub, ALICE, kernel_id, CHECK) == EXPECTED

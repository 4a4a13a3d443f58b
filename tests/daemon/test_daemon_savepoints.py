"""Save points through the gpucr daemon: a real root daemon and a real jupyter server of an
ordinary user (no checkpoint privileges), real ipykernels and CRIU. alice takes a save point of a
running kernel, changes a variable and goes back under the same kernel id; takes one of a
suspended kernel; a file changed since a save point is named and nothing is done. The images stay
root's in the daemon; bob, at the daemon's socket, can neither copy nor read alice's. The store
quota counts a copy's hard links once and refuses copies once it is full. The state a kernel leaves
when it goes back stays in the daemon while the server's trash holds it, through the kernel's next
suspend, and comes back from the trash."""
from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import stat
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests

from jupyter_gpucr.core.errors import PreconditionError
from jupyter_gpucr.core.storage.store import read_record
from jupyter_gpucr.daemon.quotas import Quotas, QuotaSettings, disk_usage
from tests import hub as H
from tests.conftest import criu_or_skip
from tests.daemon.test_daemon_limits import call_as
from tests.kernel_ws import run_at

pytestmark = [pytest.mark.timeout(300), pytest.mark.skipif(H.missing_requirement() is not None,
                                                             reason=H.missing_requirement() or "")]
ALICE, BOB = "alice", "bob"
STORE = ".local/share/gpucr-savepoints-test"


@dataclass
class Server:
    url: str
    token: str
    proc: subprocess.Popen
    log: Path
    store: Path

    def call(self, method: str, path: str, **kw: Any) -> requests.Response:
        return requests.request(method, f"{self.url}{path}", headers={"Authorization": f"token {self.token}"},
                                timeout=120, **kw)

    def ok(self, method: str, path: str, **kw: Any) -> Any:
        r = self.call(method, path, **kw)
        assert r.status_code in (200, 201), r.text
        return r.json()

    def run(self, kernel_id: str, code: str) -> str:
        return run_at(f"{self.url.replace('http', 'ws')}/api/kernels/{kernel_id}/channels", self.token, code)


def start_server(user: str, socket: Path) -> Server:
    """``user``'s jupyter-server, which checkpoints through the daemon at ``socket``."""
    pw = pwd.getpwnam(user)
    store = Path(pw.pw_dir) / STORE
    shutil.rmtree(store, ignore_errors=True)
    port, token = H.free_port(), secrets.token_hex(16)
    log = socket.parent.parent / f"server-{user}.log"  # the daemon's test folder, removed with it
    proc = subprocess.Popen(
        ["runuser", "-u", user, "--", str(H.VENV_BIN / "jupyter-server"), f"--port={port}", "--ip=127.0.0.1",
         "--no-browser", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={pw.pw_dir}",
         f"--GPUCR.daemon_socket={socket}", f"--GPUCR.store={store}"],
        stdout=open(log, "wb"), stderr=subprocess.STDOUT, env=H.user_env(user))
    server = Server(f"http://127.0.0.1:{port}", token, proc, log, store)

    H.wait_answering(f"{user}'s server", proc, log, lambda: server.call("GET", "/api/status").status_code == 200)
    return server


@pytest.fixture(scope="module")
def world() -> Iterator[tuple[Server, H.Daemon]]:
    criu_or_skip()
    with H.daemon_for([ALICE, BOB], "gpucr-savepoints-") as daemon:
        server = start_server(ALICE, daemon.socket)
        try:
            yield server, daemon
        finally:
            server.proc.terminate()
            server.proc.wait(90)
            print(f"server log:\n{server.log.read_text()[-4000:]}\ndaemon log:\n{daemon.log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def kernel(world: tuple[Server, H.Daemon]) -> str:
    server, _ = world
    kid = server.ok("POST", "/api/kernels", json={"name": "python3"})["id"]
    server.run(kid, "x = 1")
    return kid


def savepoints(kid: str, *rest: str) -> str:
    return "/".join(["/api/gpucr/kernels", kid, "savepoints", *rest])


def root_only(folder: Path) -> None:
    """Root's, folders 0700 and files 0600: out of the user's reach."""
    assert folder.stat().st_uid == 0 and stat.S_IMODE(folder.stat().st_mode) == 0o700
    for p in folder.rglob("*"):
        st = p.lstat()
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) in ((0o700,) if p.is_dir() else (0o600,)), p


def test_go_back_under_the_same_kernel_id(world: tuple[Server, H.Daemon], kernel: str) -> None:
    server, daemon = world
    alice = pwd.getpwnam(ALICE)
    sp = server.ok("POST", savepoints(kernel), json={"name": "x is 1"})
    assert sp["name"] == "x is 1" and sp["kernel_state"] == "running" and sp["size"] > 0, sp
    assert sp["memory"]["dump"] == "full" and "gpucr daemon" in sp["memory"]["why_full"], sp
    assert sp["shared"] is None, sp
    # dumped by the daemon, into alice's store there, root's; her server holds the manifest only
    images = daemon.user_store(alice.pw_uid) / "checkpoints" / sp["id"]
    root_only(images)
    assert json.loads((images / "manifest.json").read_text())["savepoint"]["name"] == "x is 1"
    assert not (server.store / "checkpoints" / sp["id"] / "images").exists()
    assert server.run(kernel, "x = 2\nprint(x)") == "2"

    back = server.ok("POST", savepoints(kernel, sp["id"], "restore"), json={})
    assert back["kernel_id"] == kernel and back["state"] == "running" and back["trash_id"], back
    assert server.run(kernel, "print(x)") == "1"
    rec = read_record(daemon.user_store(alice.pw_uid) / "procs" / kernel)
    assert f"Uid:\t{alice.pw_uid}\t" in Path(f"/proc/{rec['pid']}/status").read_text()  # alice's, restored by root
    # the save point stays, to go back to again; forks from it are not made through the daemon
    assert [s["id"] for s in server.ok("GET", savepoints(kernel))] == [sp["id"]]
    refused = server.call("POST", savepoints(kernel, sp["id"], "fork"), json={})
    assert refused.status_code >= 400 and "does not fork" in refused.json()["message"], refused.text


def test_a_changed_file_is_named(world: tuple[Server, H.Daemon]) -> None:
    server, _ = world
    alice = pwd.getpwnam(ALICE)
    data = Path(alice.pw_dir) / "gpucr-savepoint-data.txt"
    data.write_text("0123456789")
    os.chown(data, alice.pw_uid, alice.pw_gid)
    kid = server.ok("POST", "/api/kernels", json={"name": "python3"})["id"]
    server.run(kid, f"f = open({str(data)!r})\nz = 1")
    sp = server.ok("POST", savepoints(kid), json={})
    server.run(kid, "z = 2")
    data.write_text("longer than it was")
    r = server.call("POST", savepoints(kid, sp["id"], "restore"), json={})
    assert r.status_code == 409 and str(data) in r.json()["message"] and "Nothing was done" in r.json()["message"], r.text
    assert server.run(kid, "print(z)") == "2"
    data.unlink()


def test_save_point_of_a_suspended_kernel_and_bob(world: tuple[Server, H.Daemon], kernel: str) -> None:
    server, daemon = world
    alice = pwd.getpwnam(ALICE)
    server.run(kernel, "y = 'kept'")
    assert server.ok("POST", f"/api/gpucr/kernels/{kernel}/suspend", json={})["state"] == "suspended"
    sp = server.ok("POST", savepoints(kernel), json={"name": "on disk"})
    assert sp["kernel_state"] == "suspended" and sp["memory"] is not None, sp
    dstore = daemon.user_store(alice.pw_uid)
    root_only(dstore / "checkpoints" / sp["id"])
    suspended_in = read_record(dstore / "procs" / kernel)["checkpoint"]
    assert os.path.samefile(dstore / "checkpoints" / sp["id"] / "images" / "inventory.img",
                            dstore / "checkpoints" / suspended_in / "images" / "inventory.img")  # hard links

    # bob, at the daemon's socket with alice's ids, copies and reads nothing of hers
    for op, args in [("copy", {"checkpoint_id": sp["id"], "reason": "savepoint"}), ("files", {"checkpoint_id": sp["id"]}),
                     ("files", {"checkpoint_id": f"../../{alice.pw_uid}/checkpoints/{sp['id']}"})]:
        out = call_as(BOB, daemon, op, **args)
        assert out.get("error") in ("NotFoundError", "InvalidNameError"), (op, out)
    before = sorted(p.name for p in (dstore / "checkpoints").iterdir())
    # alice may not write what the daemon reads (an owner, a parent) into a copy's manifest
    out = call_as(ALICE, daemon, "copy", checkpoint_id=sp["id"], reason="savepoint",
                  extra={"owner": {"uid": 0}, "parent": suspended_in, "savepoint": {"name": "mine"}}, drop=["owner", "files"])
    made = out["result"]["manifest"]
    assert made["owner"]["uid"] == alice.pw_uid and "parent" not in made and made["files"], made
    assert made["savepoint"] == {"name": "mine"}
    call_as(ALICE, daemon, "remove", target=out["result"]["id"])
    assert sorted(p.name for p in (dstore / "checkpoints").iterdir()) == before

    # going back from suspended; then deleting the save point deletes it in the daemon too
    server.run(kernel, "y = 'changed'")
    server.ok("POST", savepoints(kernel, sp["id"], "restore"), json={})
    assert server.run(kernel, "print(y)") == "kept"
    assert server.call("DELETE", savepoints(kernel, sp["id"])).status_code == 204
    assert not (dstore / "checkpoints" / sp["id"]).exists()


def test_the_state_left_behind_comes_back_from_the_trash(world: tuple[Server, H.Daemon]) -> None:
    """The left state's images stay in the daemon, held there while the server's trash has its
    manifest: the kernel's next suspend (the daemon's retention) leaves them, and restoring the trash
    entry in place of the kernel brings the variable back."""
    server, daemon = world
    dstore = daemon.user_store(pwd.getpwnam(ALICE).pw_uid)
    kid = server.ok("POST", "/api/kernels", json={"name": "python3"})["id"]
    server.run(kid, "v = 'saved'")
    sp = server.ok("POST", savepoints(kid), json={})
    server.run(kid, "v = 'left behind'")
    trash_id = server.ok("POST", savepoints(kid, sp["id"], "restore"), json={})["trash_id"]
    [left] = next(t for t in server.ok("GET", "/api/gpucr/trash") if t["id"] == trash_id)["checkpoints"]
    assert "in_trash" in daemon_manifest(dstore, left)

    assert server.ok("POST", f"/api/gpucr/kernels/{kid}/suspend", json={})["state"] == "suspended"
    assert server.ok("POST", f"/api/gpucr/kernels/{kid}/resume", json={})["state"] == "running"
    assert server.run(kid, "print(v)") == "saved"
    assert (dstore / "checkpoints" / left).is_dir()  # the daemon's retention spared it

    server.ok("POST", f"/api/gpucr/trash/{trash_id}/restore", json={"replace": True})
    assert server.run(kid, "print(v)") == "left behind"
    assert "in_trash" not in daemon_manifest(dstore, left)
    # the kernel it replaced went to the trash in turn: held in the daemon as well
    for entry in server.ok("GET", "/api/gpucr/trash"):
        assert all("in_trash" in daemon_manifest(dstore, cid) for cid in entry["checkpoints"]), entry


def daemon_manifest(dstore: Path, cid: str) -> dict[str, Any]:
    return json.loads((dstore / "checkpoints" / cid / "manifest.json").read_text())


def test_copies_count_once_and_stop_at_the_quota(tmp_path: Path) -> None:
    store = tmp_path / "users" / "1000"
    (store / "checkpoints" / "a").mkdir(parents=True)
    (store / "checkpoints" / "a" / "pages.img").write_bytes(os.urandom(1 << 20))
    alone = disk_usage(store)
    (store / "checkpoints" / "b").mkdir()
    os.link(store / "checkpoints" / "a" / "pages.img", store / "checkpoints" / "b" / "pages.img")
    assert disk_usage(store) - alone < 64 << 10  # the copy's folder only
    with Quotas(tmp_path, QuotaSettings(store_bytes=4 << 20, log_bytes=None)).around("copy", 1000, {}):
        pass
    with pytest.raises(PreconditionError, match="no checkpoint can be copied"):
        with Quotas(tmp_path, QuotaSettings(store_bytes=1 << 20, log_bytes=None)).around("copy", 1000, {}):
            pass

"""Attacks on the root daemon through what a checkpoint and a restore open, bind and create, run as
an ordinary user against a real daemon and real CRIU: files swapped for links to root-only files
(held open, mapped, or only in flight in a socket's queue), deleted files, an image with root's
credentials, a manifest's entries sent by the client, a victim's port taken, a root service's
SO_REUSEPORT group, a process in namespaces of its own, kernel objects that count against a uid,
the user's signals to the CRIU that works as them. Each must fail or be the user's own, say why,
keep the checkpoint, and leave the daemon serving others.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import pwd
import secrets
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_gpucr.core.checkpointer import Checkpointer
from jupyter_gpucr.core.errors import AccessRefusedError
from jupyter_gpucr.core.storage.store import Store
from jupyter_gpucr.daemon.guard import Owner, RestoreGuard
from tests import hub as H
from tests.conftest import AGENTS, ask, criu_or_skip, wait_for_line

pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(H.missing_requirement() is not None,
                                                             reason=H.missing_requirement() or "")]
ATTACKER, VICTIM = "crmal", "crvic"
AGENT = str(AGENTS / "file_agent.py")


@pytest.fixture(scope="module")
def daemon() -> Iterator[H.Daemon]:
    criu_or_skip()
    for user in (ATTACKER, VICTIM):
        subprocess.run(["pkill", "-KILL", "-u", user], check=False)  # an earlier run's processes
        for leftover in Path(H.ensure_user(user).pw_dir).iterdir():  # an earlier run's files and links
            subprocess.run(["rm", "-rf", "--", str(leftover)], check=True)
    with H.daemon_for([ATTACKER, VICTIM], "gpucr-daemon-files-") as d:
        yield d


def home(user: str) -> Path:
    return Path(pwd.getpwnam(user).pw_dir)


def call(daemon: H.Daemon, user: str, op: str, **args: Any) -> dict[str, Any]:
    """One daemon request as ``user``: {"result": ...} or {"error": class, "message": ..., "seconds": ...}."""
    return H.as_user(user, f"""
import json, time
from jupyter_gpucr.daemon.client import DaemonClient
from jupyter_gpucr.core.errors import GPUCRError
t0 = time.monotonic()
try:
    out = {{"result": DaemonClient({str(daemon.socket)!r}).call({op!r}, **{args!r})}}
except GPUCRError as e:
    out = {{"error": type(e).__name__, "message": str(e)}}
out["seconds"] = time.monotonic() - t0
print(json.dumps(out, default=str))
""", timeout=200)


def run_agent(daemon: H.Daemon, user: str, name: str, *args: str) -> dict[str, Any]:
    started = call(daemon, user, "run", name=name, command=[sys.executable, AGENT, *args], cwd=str(home(user)),
                   env={"PATH": H.CLEAN_PATH, "HOME": str(home(user))})
    assert "result" in started, started
    return wait_for_line(daemon.user_store(pwd.getpwnam(user).pw_uid) / "procs" / name / "stdout.log")


def assert_victim_served(daemon: H.Daemon) -> None:
    """The daemon answers another user at once, whatever the attacker just did."""
    victim = call(daemon, VICTIM, "hello")
    assert "result" in victim and victim["seconds"] < 1.0, victim


def port_of(daemon: H.Daemon, user: str, name: str) -> int:
    """The TCP port the agent ``name`` said it listens on (its first line)."""
    log = daemon.user_store(pwd.getpwnam(user).pw_uid) / "procs" / name / "stdout.log"
    return int(json.loads(next(line for line in log.read_text().splitlines() if line.startswith("{")))["port"])


def as_attacker(code: str) -> None:
    subprocess.run(["runuser", "-u", ATTACKER, "--", "sh", "-c", code], check=True, cwd="/")


def agents_holding(path: Path) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if {AGENT, str(path)} <= set(p.info["cmdline"] or [])]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def secret() -> Iterator[Path]:
    """A root-only file (0600) with a secret in it."""
    path = Path(f"/var/tmp/gpucr-secret-{secrets.token_hex(4)}")
    path.write_text("TOP SECRET " + secrets.token_hex(16))
    os.chmod(path, 0o600)
    yield path
    path.unlink()


@pytest.mark.parametrize("how", ["held file", "mapped file", "folder above it", "/etc/shadow"])
def test_a_path_swapped_for_a_link_to_a_root_only_file_is_never_reopened(daemon: H.Daemon, secret: Path, how: str) -> None:
    name = f"swap-{how.replace(' ', '-').replace('/', '')}"
    work = home(ATTACKER) / name
    target = Path("/etc/shadow") if how in ("folder above it", "/etc/shadow") else secret
    before = digest(target)
    # The attacker's own file: same size and mode as the target (all CRIU compares).
    held = work / "d" / "shadow" if how == "folder above it" else work / "f"
    as_attacker(f"mkdir -p {held.parent} && head -c {target.stat().st_size} /dev/zero | tr '\\0' A > {held} && "
                f"chmod {oct(target.stat().st_mode & 0o777)[2:]} {held}")
    run_agent(daemon, ATTACKER, name, "--map" if how == "mapped file" else "--hold", str(held))
    assert "result" in call(daemon, ATTACKER, "checkpoint", name=name)
    swapped, link_to = (held.parent, target.parent) if how == "folder above it" else (held, target)
    as_attacker(f"mv {swapped} {swapped}.orig && ln -s {link_to} {swapped}")

    answer = call(daemon, ATTACKER, "restore", name=name)
    assert answer.get("error") == "AccessRefusedError", answer
    assert f"The process had {held} open, but its owner {ATTACKER} may not open it now" in answer["message"]
    assert "The checkpoint is kept" in answer["message"]
    assert digest(target) == before and not agents_holding(held)
    assert_victim_served(daemon)

    as_attacker(f"rm {swapped} && mv {swapped}.orig {swapped}")  # the file as it was: the restore goes through
    assert "result" in call(daemon, ATTACKER, "restore", name=name)
    reply = ask(port_of(daemon, ATTACKER, name))
    assert set(reply["held" if how != "mapped file" else "mapped"]) == {"A"}
    assert "result" in call(daemon, ATTACKER, "remove", target=name, kill=True)


@pytest.mark.parametrize("how", ["held", "mapped", "held, linked elsewhere"])
def test_a_deleted_file_is_refused_at_the_checkpoint_and_the_process_keeps_running(daemon: H.Daemon, how: str) -> None:
    """CRIU would recreate it as root (a ghost file) or link it back (a link remap) in a folder the
    user can redirect: refused while the process still runs."""
    name = f"deleted-{how.split(',')[0]}-{'linked' if 'linked' in how else 'ghost'}"
    held = home(ATTACKER) / name
    as_attacker(f"echo scratch > {held}" + (f" && ln {held} {held}.link" if "linked" in how else ""))
    hello = run_agent(daemon, ATTACKER, name, "--map" if how == "mapped" else "--hold", str(held))
    held.unlink()
    answer = call(daemon, ATTACKER, "checkpoint", name=name)
    assert answer.get("error") == "PreconditionError", answer
    assert f"holds files that have been deleted: {held}" in answer["message"] and "left running" in answer["message"]
    assert ask(hello["port"])["held" if how != "mapped" else "mapped"].startswith("scratch")
    assert_victim_served(daemon)
    assert "result" in call(daemon, ATTACKER, "remove", target=name, kill=True)


def test_a_file_held_only_in_flight_and_swapped_for_a_link_is_never_reopened(daemon: H.Daemon, secret: Path) -> None:
    """The file is held only as a descriptor in a unix socket's queue (SCM_RIGHTS, not received), and
    its path is flipped to a link to a root-only file between restores: CRIU, which works as the
    owner, cannot open it, whenever the flip happens."""
    name = "in-flight"
    held = home(ATTACKER) / name
    as_attacker(f"head -c {secret.stat().st_size} /dev/zero | tr '\\0' A > {held} && chmod 600 {held}")
    run_agent(daemon, ATTACKER, name, "--in-flight", str(held))
    assert "result" in call(daemon, ATTACKER, "checkpoint", name=name)
    as_attacker(f"mv {held} {held}.orig && ln -s {secret} {held}")
    before = digest(secret)
    for _ in range(3):
        answer = call(daemon, ATTACKER, "restore", name=name)
        assert answer.get("error") == "AccessRefusedError", answer
        assert f"The process had {held} open, but its owner {ATTACKER} may not open it now" in answer["message"]
    assert digest(secret) == before and not agents_holding(held)
    assert_victim_served(daemon)

    as_attacker(f"rm {held} && mv {held}.orig {held}")
    assert "result" in call(daemon, ATTACKER, "restore", name=name)
    reply = ask(port_of(daemon, ATTACKER, name))
    assert set(reply["in_flight"]) == {"A"}
    assert "result" in call(daemon, ATTACKER, "remove", target=name, kill=True)


def test_an_image_with_root_credentials_is_never_restored_for_a_user(daemon: H.Daemon, tmp_path: Path) -> None:
    attacker = Owner.of(pwd.getpwnam(ATTACKER).pw_uid)
    store = Store(tmp_path / "store")
    cr = Checkpointer(store, restore_check=RestoreGuard(attacker, store.root))
    cr.run("rootproc", [sys.executable, AGENT], cwd="/")
    wait_for_line(store.proc_dir("rootproc") / "stdout.log")
    cr.checkpoint("rootproc")
    with pytest.raises(AccessRefusedError) as refused:
        cr.restore("rootproc")
    assert "with uid 0, gid 0" in refused.value.message and f"which {ATTACKER} (uid {attacker.uid})" in refused.value.message
    assert store.latest("rootproc") is not None


def test_a_victims_port_taken_by_another_user_is_named_and_the_checkpoint_kept(daemon: H.Daemon) -> None:
    hello = run_agent(daemon, VICTIM, "listener")
    port = hello["port"]
    assert "result" in call(daemon, VICTIM, "checkpoint", name="listener")
    squatter = subprocess.Popen(["runuser", "-u", ATTACKER, "--", sys.executable, "-c",
                                 f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1', {port})); s.listen(); "
                                 "print('bound', flush=True); time.sleep(300)"], stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    try:
        assert squatter.stdout is not None and squatter.stdout.readline().strip() == "bound"
        answer = call(daemon, VICTIM, "restore", name="listener")
        assert answer.get("error") == "AddressInUseError", answer
        assert f"Port {port} (127.0.0.1), which the process had bound, is now held by PID" in answer["message"]
        assert f"of {ATTACKER} (uid {pwd.getpwnam(ATTACKER).pw_uid})" in answer["message"]
        assert "The checkpoint is kept" in answer["message"]
        assert_victim_served(daemon)
    finally:
        os.killpg(squatter.pid, 9)  # runuser and the user's process under it
        squatter.wait()
    assert "result" in call(daemon, VICTIM, "restore", name="listener")
    assert ask(port)["pid"] == hello["pid"]
    assert "result" in call(daemon, VICTIM, "remove", target="listener", kill=True)


def test_stopping_the_criu_that_dumps_as_the_user_fails_the_dump_not_the_daemon(daemon: H.Daemon) -> None:
    """CRIU dumps as the process's owner, who can signal it: a SIGSTOP to it must end the dump at
    once, the process running on."""
    uid = pwd.getpwnam(ATTACKER).pw_uid
    started = call(daemon, ATTACKER, "run", name="stopped-criu", command=[sys.executable, str(AGENTS / "cpu_agent.py"), "500"],
                   cwd=str(home(ATTACKER)), env={"PATH": H.CLEAN_PATH, "HOME": str(home(ATTACKER)),
                                                 "AGENT_FILE": str(home(ATTACKER) / "agent.txt")})
    assert "result" in started, started
    hello = wait_for_line(daemon.user_store(uid) / "procs" / "stopped-criu" / "stdout.log")
    stopper = subprocess.Popen(["runuser", "-u", ATTACKER, "--", sys.executable, "-c", f"""
import os, signal, time, psutil
deadline = time.monotonic() + 120
while time.monotonic() < deadline:
    for p in psutil.process_iter(["uids", "cmdline"]):
        argv = p.info["cmdline"] or []
        if p.info["uids"] and p.info["uids"].real == {uid} and "dump" in argv and any("criu" in a for a in argv):
            os.kill(p.pid, signal.SIGSTOP); print("stopped", p.pid, flush=True)
    time.sleep(0.005)
"""], stdout=subprocess.PIPE, text=True, env={"PATH": H.CLEAN_PATH, **H._pythonpath()}, start_new_session=True)
    try:
        t0 = time.monotonic()
        answer = call(daemon, ATTACKER, "checkpoint", name="stopped-criu")
        assert time.monotonic() - t0 < 60
    finally:
        os.killpg(stopper.pid, 9)
        stopper.wait()
    assert_victim_served(daemon)
    assert "was stopped by a signal; the dump was abandoned" in answer.get("message", ""), answer
    assert "The process was left running" in answer["message"]
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    call(daemon, ATTACKER, "remove", target="stopped-criu", kill=True)


def test_what_a_client_sends_as_extra_never_steers_a_restore(daemon: H.Daemon) -> None:
    """A checkpoint request's ``extra`` naming scratch files to put back (a root-only file copied
    into the user's home, a setuid copy of python) and another owner: the manifest keeps only what
    the Jupyter server records of its kernel, and the restore copies nothing."""
    name = "extra"
    loot = home(ATTACKER) / "loot"
    run_agent(daemon, ATTACKER, name)
    forged = {"open_files": {"node": "elsewhere", "files": [
                  {"path": str(loot), "scratch": True, "uid": 0, "gid": 0, "mode": 0o104755, "size": 1,
                   "size_checked": False}]},
              "owner": {"uid": 0, "user": "root"}, "kernel": {"id": "k1", "name": "python3"}}
    answer = call(daemon, ATTACKER, "checkpoint", name=name, extra=forged)
    assert "result" in answer, answer
    manifest = answer["result"]["manifest"]
    assert "open_files" not in manifest and manifest["kernel"] == forged["kernel"]
    assert manifest["owner"] == {"uid": pwd.getpwnam(ATTACKER).pw_uid, "user": ATTACKER}
    assert "result" in call(daemon, ATTACKER, "restore", name=name)
    assert not loot.exists()
    assert "result" in call(daemon, ATTACKER, "remove", target=name, kill=True)


def socket_owner(table: str, port: int) -> int:
    """The uid that owns the socket on 127.0.0.1:``port`` in /proc/net/``table`` (what
    netfilter's owner match and uid routing see)."""
    for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == port:
            return int(fields[7])
    raise AssertionError(f"no {table} socket on port {port}")


def peer_uid(path: Path) -> int:
    """What a client of the unix listener at ``path`` sees as its uid (SO_PEERCRED)."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))[1]


def test_restored_sockets_and_kernel_objects_are_the_owners(daemon: H.Daemon) -> None:
    """CRIU creates a restored process's sockets and inotify instances with its own credentials: as
    the owner, they are the owner's (not root's: SO_PEERCRED uid 0, root's limits used up), so two
    cycles of 120 inotify instances leave root's count as it was and another user's restore works."""
    uid = pwd.getpwnam(ATTACKER).pw_uid
    sock = home(ATTACKER) / "listener.sock"
    hello = run_agent(daemon, ATTACKER, "sockets", "--unix", str(sock), "--udp", "--inotify", "120")
    for _ in range(2):
        assert "result" in call(daemon, ATTACKER, "checkpoint", name="sockets")
        assert "result" in call(daemon, ATTACKER, "restore", name="sockets")
    reply = ask(hello["port"])
    assert reply["inotify"] == 120
    assert socket_owner("tcp", hello["port"]) == uid
    assert socket_owner("udp", hello["udp_port"]) == uid
    assert peer_uid(sock) == uid
    libc = ctypes.CDLL(None, use_errno=True)
    mine = [libc.inotify_init1(os.O_CLOEXEC) for _ in range(16)]  # root's own: not used up by the user's
    try:
        assert all(fd >= 0 for fd in mine), os.strerror(ctypes.get_errno())
    finally:
        for fd in mine:
            if fd >= 0:
                os.close(fd)
    run_agent(daemon, VICTIM, "watcher", "--inotify", "8")
    assert "result" in call(daemon, VICTIM, "checkpoint", name="watcher")
    restored = call(daemon, VICTIM, "restore", name="watcher")
    assert "result" in restored, restored
    for user, name in ((ATTACKER, "sockets"), (VICTIM, "watcher")):
        assert "result" in call(daemon, user, "remove", target=name, kill=True)


def test_a_restore_never_joins_a_root_services_reuseport_group(daemon: H.Daemon) -> None:
    """The user's process had its port with SO_REUSEPORT; while it is on disk a root service binds
    the same port with SO_REUSEPORT. Restored as root, the process would take half of the service's
    connections; as its owner, the bind is refused and the service keeps them all."""
    hello = run_agent(daemon, ATTACKER, "reuse", "--reuseport")
    port = hello["port"]
    assert "result" in call(daemon, ATTACKER, "checkpoint", name="reuse")
    service = socket.socket()
    service.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    service.bind(("127.0.0.1", port))
    service.listen(64)
    try:
        answer = call(daemon, ATTACKER, "restore", name="reuse")
        assert answer.get("error") == "AddressInUseError", answer
        assert f"Port {port} (127.0.0.1), which the process had bound, is now held by PID {os.getpid()}" in answer["message"]
        assert "of root (uid 0)" in answer["message"] and "The checkpoint is kept" in answer["message"]
        clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        service.settimeout(5)
        accepted = [service.accept()[0] for _ in clients]  # every one of them reached the service
        for s in clients + accepted:
            s.close()
    finally:
        service.close()
    assert_victim_served(daemon)
    assert "result" in call(daemon, ATTACKER, "restore", name="reuse")
    assert ask(port)["pid"] == hello["pid"]
    assert "result" in call(daemon, ATTACKER, "remove", target="reuse", kill=True)


def test_a_process_in_namespaces_of_its_own_is_not_checkpointed(daemon: H.Daemon) -> None:
    """The process makes a user and a mount namespace (allowed to ordinary users) and bind-mounts a
    folder of its own over the daemon's state folder, where its criu is: the daemon refuses the
    checkpoint, runs nothing of the user's, and the process runs on."""
    evil = home(ATTACKER) / "evil-state"
    pwned = Path(f"/var/tmp/gpucr-pwned-{secrets.token_hex(4)}")
    as_attacker(f"mkdir -p {evil} && printf '#!/bin/sh\\nid > {pwned}\\n' > {evil}/criu && chmod 755 {evil}/criu")
    started = call(daemon, ATTACKER, "run", name="unshared", command=[
        sys.executable, str(AGENTS / "unshare_agent.py"), str(evil), str(daemon.state)],
        cwd=str(home(ATTACKER)), env={"PATH": H.CLEAN_PATH, "HOME": str(home(ATTACKER))})
    assert "result" in started, started
    hello = wait_for_line(daemon.user_store(pwd.getpwnam(ATTACKER).pw_uid) / "procs" / "unshared" / "stdout.log")
    answer = call(daemon, ATTACKER, "checkpoint", name="unshared")
    assert answer.get("error") == "AccessRefusedError", answer
    assert "runs in a user and a mount namespace of its own" in answer["message"]
    assert "The process was left running" in answer["message"]
    assert not pwned.exists()
    assert ask(hello["port"])["pid"] == hello["pid"]
    assert_victim_served(daemon)
    assert "result" in call(daemon, ATTACKER, "remove", target="unshared", kill=True)

"""Attacks on the root daemon through what a restore reopens and binds, run as an ordinary user
against a real daemon and real CRIU: files swapped for links to root-only files (held open or
mapped, the file itself or a folder above it), deleted files, a path changed after the daemon's
check, an image with root's credentials, a victim's port taken, the user's signals to the CRIU
that dumps as them. Each must fail, say why, keep the checkpoint, and leave the daemon serving."""
from __future__ import annotations

import hashlib
import json
import os
import pwd
import secrets
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
from jupyter_gpucr.core.store import Store
from jupyter_gpucr.daemon.guard import Approved, Owner, RestoreGuard
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


def as_attacker(code: str) -> None:
    subprocess.run(["runuser", "-u", ATTACKER, "--", "sh", "-c", code], check=True, cwd="/")


def agents_holding(path: Path) -> list[int]:
    return [p.pid for p in psutil.process_iter(["cmdline"]) if {AGENT, str(path)} <= set(p.info["cmdline"] or [])]


def root_has_cap_sys_resource() -> bool:
    """Whether the daemon's CRIU dumps as root (else as the process's owner: see criu_as_owner)."""
    effective = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("CapEff:"))
    return bool(int(effective.split()[1], 16) & (1 << 24))


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
    assert f"{swapped} is a symbolic link now" in answer["message"] and "The checkpoint is kept" in answer["message"]
    assert digest(target) == before and not agents_holding(held)
    assert_victim_served(daemon)

    as_attacker(f"rm {swapped} && mv {swapped}.orig {swapped}")  # the file as it was: the restore goes through
    assert "result" in call(daemon, ATTACKER, "restore", name=name)
    port = json.loads(next(line for line in (daemon.user_store(pwd.getpwnam(ATTACKER).pw_uid) / "procs" / name
                                             / "stdout.log").read_text().splitlines() if line.startswith("{")))["port"]
    reply = ask(port)
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


def test_a_path_changed_after_the_check_is_caught_before_the_process_runs(daemon: H.Daemon, secret: Path,
                                                                         tmp_path: Path) -> None:
    """The link appears between the daemon's check and CRIU's open (the timing arranged, the rest
    real): CRIU's restored tree holds the root-only file, and is killed inside CRIU, before it has
    its owner's credentials (so the owner cannot reach the file through /proc/PID/fd either)."""
    owner = Owner.of(pwd.getpwnam(ATTACKER).pw_uid)
    held = home(ATTACKER) / "late-swap"
    as_attacker(f"head -c {secret.stat().st_size} /dev/zero | tr '\\0' A > {held} && chmod 600 {held}")

    class SwapAfterTheCheck(RestoreGuard):
        def approved(self, images: Path) -> Approved:
            approved = super().approved(images)
            as_attacker(f"mv {held} {held}.orig && ln -s {secret} {held}")
            return approved

    store = Store(tmp_path / "store")
    cr = Checkpointer(store, criu_path=str(daemon.state / "criu"),  # the daemon's CRIU: dumps another uid's process
                      restore_check=SwapAfterTheCheck(owner, store.root))
    cr.run("late", ["setpriv", f"--reuid={owner.uid}", f"--regid={owner.gid}", "--init-groups", "--",
                    sys.executable, AGENT, "--hold", str(held)], cwd="/")
    wait_for_line(store.proc_dir("late") / "stdout.log")
    ckpt = cr.checkpoint("late")
    before = digest(secret)
    with pytest.raises(AccessRefusedError) as refused:
        cr.restore("late")
    assert f"came back holding {secret}" in refused.value.message and "ended before it ran" in refused.value.message
    assert digest(secret) == before and not agents_holding(held)
    assert store.latest("late").id == ckpt.id  # kept


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
        assert answer.get("error") == "EngineError", answer
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
    """Where root lacks CAP_SYS_RESOURCE (containers, this CI machine) CRIU dumps as the process's
    owner, who can signal it: a SIGSTOP to it must end the dump at once, the process running on."""
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
    if "error" in answer:  # CRIU ran as the user and was stopped: the dump ended, the process runs on
        assert "was stopped by a signal; the dump was abandoned" in answer["message"], answer
        assert "The process was left running" in answer["message"]
        assert ask(hello["port"])["checksum"] == hello["checksum"]
    else:  # CRIU ran as root, out of the user's reach: the checkpoint is complete
        assert root_has_cap_sys_resource(), f"CRIU dumped as {ATTACKER}, who could stop it, and the dump went through"
        assert answer["result"]["id"]
    call(daemon, ATTACKER, "remove", target="stopped-criu", kill=True)

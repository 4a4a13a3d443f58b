"""The gpucr daemon knows its processes by PID and start time, checks credentials on the frozen tree,
and keeps its caller's confinement: attacks by one ordinary user (idatt) against another (idvic), with
a real daemon as root, real users and real CRIU. Each must fail, the daemon still serving the victim
within a second.

- an argv decoy: a process of the attacker, in user and PID namespaces of its own, that shows the
  victim's holder arguments and runs a child under the victim's PID in its namespace: the victim's
  recovery still records the victim's process, and its checkpoint, restore and removal work;
- a second decoy, of a restore holder and of CRIU at work on the victim's checkpoint: the victim's
  recovery does not wait for it;
- a set-group-ID child at checkpoint time: the checkpoint is refused, naming the PID and the check,
  and the process keeps running (not left stopped);
- a caller with no_new_privs, fewer groups than the database gives and a cgroup of its own starts a
  process through the daemon: the process has the flag, those groups and that cgroup, also once
  checkpointed and restored.

The freeze that the checkpoint's second credential check runs on is tested on its own at the end.
"""
from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jupyter_gpucr.core.errors import AccessRefusedError
from jupyter_gpucr.core.process.holder import first_workload_pid
from jupyter_gpucr.core.process.identity import ProcId
from jupyter_gpucr.core.process.launcher import HOLDER
from jupyter_gpucr.daemon.guard import Owner
from jupyter_gpucr.daemon.ownership import freeze_checked
from tests import hub as H
from tests.conftest import criu_or_skip


def missing_requirement() -> str | None:
    if os.geteuid() != 0:
        return "the daemon runs as root and the test creates Unix users"
    return next((f"{tool} is not installed" for tool in ("useradd", "setpriv", "unshare", "nsenter", "pgrep")
                 if not shutil.which(tool)), None)


pytestmark = [pytest.mark.timeout(240), pytest.mark.skipif(missing_requirement() is not None,
                                                             reason=missing_requirement() or "")]
ATTACKER, VICTIM = "idatt", "idvic"
SERVED_WITHIN = 1.0  # seconds: the daemon answers the victim while an attack is under way

# Run as a user: each call of CALLS through the daemon, with its outcome and how long it took.
CLIENT = """
import json, sys, time
from jupyter_gpucr.daemon.client import DaemonClient
from jupyter_gpucr.core.errors import GPUCRError
c = DaemonClient(sys.argv[1])
out = []
for op, args in json.loads(sys.argv[2]):
    t = time.monotonic()
    try:
        out.append({"ok": True, "result": c.call(op, **args)})
    except GPUCRError as e:
        out.append({"ok": False, "error": type(e).__name__, "message": e.message})
    out[-1]["seconds"] = time.monotonic() - t
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def daemon() -> Iterator[H.Daemon]:
    criu_or_skip()
    with H.daemon_for([ATTACKER, VICTIM], 'gpucr-identity-') as d:
        yield d


def as_user_argv(user: str, *, no_new_privs: bool = False, clear_groups: bool = False) -> list[str]:
    pw = pwd.getpwnam(user)
    return ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}",
            "--clear-groups" if clear_groups else "--init-groups", *(["--no-new-privs"] if no_new_privs else []), "--"]


def env_of(user: str) -> dict[str, str]:
    return {"PATH": H.CLEAN_PATH, "HOME": pwd.getpwnam(user).pw_dir, "LANG": "C.UTF-8", **H._pythonpath()}


def calls(d: H.Daemon, user: str, *ops: tuple[str, dict[str, Any]], prefix: list[str] | None = None,
          timeout: float = 120) -> list[dict[str, Any]]:
    """Each request of ``ops`` as ``user`` (``prefix``: how to become them)."""
    argv = [*(prefix or as_user_argv(user)), sys.executable, "-c", CLIENT, str(d.socket), json.dumps(ops)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env_of(user), cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def call(d: H.Daemon, user: str, op: str, **args: Any) -> dict[str, Any]:
    [outcome] = calls(d, user, (op, args))
    assert outcome["ok"], outcome
    return outcome["result"]


def run_args(name: str, command: list[str]) -> dict[str, Any]:
    return {"name": name, "command": command, "cwd": "/", "env": {"PATH": H.CLEAN_PATH}}


def start_decoy(user: str, script: str, *argv: str) -> subprocess.Popen:
    """``python -c script argv...`` as ``user`` in user and PID namespaces of its own (its own
    session, so that the whole of it can be killed at once)."""
    return subprocess.Popen([*as_user_argv(user), "unshare", "-Urpf", "--kill-child", "--mount-proc",
                             sys.executable, "-I", "-c", script, *argv],
                            env=env_of(user), cwd="/", start_new_session=True, stderr=subprocess.DEVNULL)


def kill_decoy(p: subprocess.Popen) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait(10)


def state_of(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def gone(pid: int) -> bool:
    try:
        return state_of(pid) in ("Z", "X")
    except FileNotFoundError:
        return True


def runs(pid: int) -> bool:
    """Alive and not stopped (a task just continued may show R for a moment)."""
    return state_of(pid) in ("S", "R")


def status_of(pid: int) -> dict[str, str]:
    return {k: v.strip() for k, _, v in (line.partition(":") for line in Path(f"/proc/{pid}/status").read_text().splitlines())}


# A decoy holder: PID 1 of its namespace, with a child under the PID the victim's process has in its own.
FAKE_WORKLOAD = """
import os, sys, time
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(int(sys.argv[1]) - 1))
if os.fork() == 0:
    time.sleep(600)
    os._exit(0)
time.sleep(600)
"""
SLEEP = "import time; time.sleep(600)"


def holder_status_arg(d: H.Daemon, name: str) -> str:
    """What the victim's namespace holders show in ``ps`` for ``name``."""
    return f"--status={d.user_store(pwd.getpwnam(VICTIM).pw_uid) / 'procs' / name / '.status'}"


def test_an_argv_decoy_is_not_taken_for_the_victims_process(daemon: H.Daemon) -> None:
    # what the victim's process is in its namespace (checked below)
    ns_pid = first_workload_pid(holder_status_arg(daemon, "work").removeprefix("--status=")) + 1
    # started before the victim's holder, so that a search by command line meets it first
    decoy = start_decoy(ATTACKER, FAKE_WORKLOAD, str(ns_pid), str(HOLDER), holder_status_arg(daemon, "work"), "run")
    try:
        H.wait_until("the decoy's child", lambda: len(subprocess.run(["pgrep", "-g", str(decoy.pid)],
                                                                     capture_output=True).stdout.split()) >= 3, 10, 0.05)
        started = call(daemon, VICTIM, "run", **run_args("work", ["sleep", "600"]))
        pid = started["pid"]
        assert started["ns_pid"] == ns_pid

        [recovered, listed] = calls(daemon, VICTIM, ("recover_all", {}), ("list", {}))
        assert recovered["ok"] and listed["ok"], recovered
        assert recovered["result"]["recovered"]["work"]["outcome"] == "running"
        assert recovered["result"]["recovered"]["work"]["pid"] == pid  # not the decoy's child
        assert recovered["result"]["procs"]["work"]["pid"] == pid
        assert listed["seconds"] < SERVED_WITHIN

        # the victim's own verbs work on the victim's process
        [suspended, restored, again, removed] = calls(
            daemon, VICTIM, ("checkpoint", {"name": "work"}), ("restore", {"name": "work"}),
            ("checkpoint", {"name": "work", "leave_running": True}), ("remove", {"target": "work", "kill": True}))
        assert suspended["ok"] and restored["ok"] and again["ok"] and removed["ok"], (suspended, restored, again, removed)
        assert gone(pid)
        H.wait_until("the removed process to be gone", lambda: gone(restored["result"]["pid"]), 10, 0.05)
        assert decoy.poll() is None  # the decoy was there all along
    finally:
        kill_decoy(decoy)


def test_decoys_of_a_restore_and_of_criu_at_work_do_not_stall_the_victims_recovery(daemon: H.Daemon) -> None:
    [started, suspended] = calls(daemon, VICTIM, ("run", run_args("idle", ["sleep", "600"])), ("checkpoint", {"name": "idle"}))
    assert started["ok"] and suspended["ok"], (started, suspended)
    checkpoint_dir = daemon.user_store(pwd.getpwnam(VICTIM).pw_uid) / "checkpoints" / suspended["result"]["id"]
    # a restore holder that never reports, and CRIU at work on the checkpoint (its -W shows in ps)
    decoys = [start_decoy(ATTACKER, SLEEP, str(HOLDER), holder_status_arg(daemon, "idle"), "restore"),
              start_decoy(ATTACKER, SLEEP, "dump", "-W", str(checkpoint_dir))]
    try:
        time.sleep(0.3)
        [recovered, listed] = calls(daemon, VICTIM, ("recover_all", {}), ("list", {}), timeout=60)
        assert recovered["ok"] and recovered["result"]["recovered"]["idle"]["outcome"] == "suspended", recovered
        assert recovered["seconds"] < 5, recovered  # it waited for nothing (600 s before)
        assert listed["seconds"] < SERVED_WITHIN
        [restored, removed] = calls(daemon, VICTIM, ("restore", {"name": "idle"}), ("remove", {"target": "idle", "kill": True}))
        assert restored["ok"] and removed["ok"], (restored, removed)
        assert all(d.poll() is None for d in decoys)
    finally:
        for d in decoys:
            kill_decoy(d)


def setgid_copy_of_sleep(folder: Path) -> tuple[Path, grp.struct_group]:
    """A copy of sleep that is set-group-ID to a group the attacker is not in."""
    group = next(g for g in grp.getgrall() if g.gr_gid not in os.getgrouplist(ATTACKER, pwd.getpwnam(ATTACKER).pw_gid)
                 and g.gr_name in ("shadow", "tty", "disk", "kmem", "adm"))
    path = folder / "sleep-sgid"
    shutil.copy("/bin/sleep", path)
    os.chown(path, 0, group.gr_gid)
    os.chmod(path, 0o2755)
    return path, group


def test_a_setgid_child_refuses_the_checkpoint_and_the_process_runs_on(daemon: H.Daemon, tmp_path: Path) -> None:
    folder = Path(tempfile.mkdtemp(prefix="gpucr-sgid-"))
    os.chmod(folder, 0o755)
    try:
        sgid, group = setgid_copy_of_sleep(folder)
        started = call(daemon, ATTACKER, "run", **run_args("sgid", ["sh", "-c", f"{sgid} 600; :"]))
        shell = started["pid"]
        child = H.wait_until("the set-group-ID child", lambda: [int(p) for p in Path(f"/proc/{shell}/task/{shell}/children")
                                                                 .read_text().split()], 10, 0.05)[0]
        assert status_of(child)["Gid"].split()[1] == str(group.gr_gid)  # its effective gid

        [refused, again, listed] = calls(daemon, ATTACKER, ("checkpoint", {"name": "sgid"}),
                                         ("checkpoint", {"name": "sgid", "leave_running": True}), ("list", {}))
        for outcome in (refused, again):
            assert not outcome["ok"] and outcome["error"] == "AccessRefusedError", outcome
            assert f"Process {child} of 'sgid' has effective gid {group.gr_gid}, saved gid {group.gr_gid}" in outcome["message"]
            assert "The process was left running." in outcome["message"]
        assert runs(shell) and runs(child)  # not left stopped
        assert listed["ok"] and listed["result"]["procs"]["sgid"]["state"] == "running"
        assert not list((daemon.user_store(pwd.getpwnam(ATTACKER).pw_uid) / "checkpoints").iterdir())
        [served] = calls(daemon, VICTIM, ("list", {}))
        assert served["ok"] and served["seconds"] < SERVED_WITHIN
        assert call(daemon, ATTACKER, "kill", name="sgid") == {"killed": True}  # ending it is the user's right
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def cgroup2_mount() -> Path | None:
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        dash = fields.index("-")
        if fields[dash + 1] == "cgroup2" and fields[3] == "/":
            return Path(fields[4])
    return None


def cgroup_of(pid: int) -> str:
    return next(line[3:] for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if line.startswith("0::"))


def test_run_keeps_the_callers_no_new_privs_groups_and_cgroup(daemon: H.Daemon) -> None:
    att = pwd.getpwnam(ATTACKER)
    mount = cgroup2_mount()
    cgroup = mount / f"gpucr-identity-{os.getpid()}" if mount else None
    prefix = as_user_argv(ATTACKER, no_new_privs=True, clear_groups=True)
    if cgroup is not None:  # the caller joins a cgroup of its own (as root), then becomes the user
        cgroup.mkdir()
        prefix = ["sh", "-c", f'echo $$ > {cgroup}/cgroup.procs && exec "$@"', "sh", *prefix]
    try:
        [started] = calls(daemon, ATTACKER, ("run", run_args("confined", ["sleep", "600"])), prefix=prefix)
        assert started["ok"], started
        status = status_of(started["result"]["pid"])
        assert status["NoNewPrivs"] == "1"
        assert status["Groups"] == ""  # the caller had none; the database gives the user its own group
        assert status["Uid"].split() == [str(att.pw_uid)] * 4 and status["Gid"].split() == [str(att.pw_gid)] * 4
        if cgroup is not None:
            assert cgroup_of(started["result"]["pid"]) == f"/{cgroup.name}"
        # a checkpoint and a restore do not shed any of it
        [suspended, restored] = calls(daemon, ATTACKER, ("checkpoint", {"name": "confined"}), ("restore", {"name": "confined"}),
                                      prefix=prefix)
        assert suspended["ok"] and restored["ok"], (suspended, restored)
        status = status_of(restored["result"]["pid"])
        assert (status["NoNewPrivs"], status["Groups"]) == ("1", "")
        assert [status[c] for c in ("CapInh", "CapPrm", "CapEff", "CapAmb")] == ["0000000000000000"] * 4
        if cgroup is not None:
            assert cgroup_of(restored["result"]["pid"]) == f"/{cgroup.name}"
            # asked from elsewhere (a client in another cgroup): the tree goes where it was started
            [suspended, restored] = calls(daemon, ATTACKER, ("checkpoint", {"name": "confined"}),
                                          ("restore", {"name": "confined"}))
            assert suspended["ok"] and restored["ok"], (suspended, restored)
            assert cgroup_of(restored["result"]["pid"]) == f"/{cgroup.name}"
        [plain] = calls(daemon, ATTACKER, ("run", run_args("plain", ["sleep", "600"])))
        assert status_of(plain["result"]["pid"])["NoNewPrivs"] == "0"  # a caller without it: as before
        assert str(att.pw_gid) in status_of(plain["result"]["pid"])["Groups"].split()
    finally:
        for name in ("confined", "plain"):
            calls(daemon, ATTACKER, ("remove", {"target": name, "kill": True}))
        if cgroup is not None:
            H.wait_until("the cgroup to empty", lambda: not (cgroup / "cgroup.procs").read_text().strip(), 10, 0.05)
            cgroup.rmdir()


def test_the_freeze_stops_the_whole_tree_checks_it_and_continues_only_what_it_stopped(tmp_path: Path) -> None:
    """The freeze itself (no daemon): a set-group-ID child is refused on the frozen tree and the
    tree runs on; a clean tree is stopped, then continued, but for a task the user had stopped."""
    H.ensure_user(ATTACKER)
    att = pwd.getpwnam(ATTACKER)
    folder = Path(tempfile.mkdtemp(prefix="gpucr-sgid-"))
    os.chmod(folder, 0o755)
    trees = []
    try:
        sgid, group = setgid_copy_of_sleep(folder)
        for program in (str(sgid), "sleep"):
            trees.append(subprocess.Popen([*as_user_argv(ATTACKER), "sh", "-c", f"{program} 600; :"], cwd="/"))
        children = [H.wait_until("the child", lambda p=p: Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text().split(),
                                 10, 0.05) for p in trees]
        [sgid_shell, shell], [sgid_child, child] = [p.pid for p in trees], [int(c[0]) for c in children]
        owner = Owner.of(att.pw_uid)

        with pytest.raises(AccessRefusedError, match=f"Process {sgid_child} of 'x' has effective gid {group.gr_gid}"):
            freeze_checked(ProcId.of(sgid_shell), owner, "x", ProcId.of(os.getpid()))  # type: ignore[arg-type]
        assert runs(sgid_shell) and runs(sgid_child)

        os.kill(child, signal.SIGSTOP)  # the user's own stop
        H.wait_until("the child to stop", lambda: state_of(child) == "T", 10, 0.01)
        thaw = freeze_checked(ProcId.of(shell), owner, "x", ProcId.of(os.getpid()))  # type: ignore[arg-type]
        assert (state_of(shell), state_of(child)) == ("T", "T")
        thaw()
        assert runs(shell)
        assert state_of(child) == "T"
    finally:
        for p in trees:
            subprocess.run(["pkill", "-KILL", "-P", str(p.pid)])
            p.kill()
            p.wait(10)
        shutil.rmtree(folder, ignore_errors=True)

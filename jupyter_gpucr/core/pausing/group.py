"""Sessions of several processes: ``gpucr run --group SESSION --name NAME -- CMD``.

A session is one name in the store whose process is a small leader (``groupleader.py``) and whose
members are the leader's children: one process tree, so one checkpoint holds them all, taken with
every member frozen before any is dumped, and one restore brings them all back before any runs,
with the pipes, UNIX sockets and localhost TCP connections between them intact (CRIU restores both
ends of each). The first member starts the session; the session is checkpointed, restored, paused
and woken under its own name; ``gpucr ls`` lists the members under it.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

from ..errors import EngineError, GPUCRError, StateError
from ..jsonfile import read_json, write_json_atomic
from ..process.procs import find_descendant_by_ns_pid, is_alive, wait_gone
from ..process.record import ProcRecord
from ..process.running import Running
from ..storage.locks import exclusive
from ..storage.names import validate_name
from ..storage.store import Store
from .activation import WakeOn
from .groupleader import READY
from .waker import read_status, start_waker

LEADER = Path(__file__).with_name("groupleader.py")
ANSWER_WAIT = 30.0


class SessionHost(Protocol):
    """What a session needs of the checkpointer (``Checkpointer`` is one): its store, starting
    the leader, and the CRIU its waker uses."""

    @property
    def store(self) -> Store: ...

    @property
    def criu_path(self) -> str | None: ...

    def run(self, name: str, command: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
            detach: bool = True) -> Running: ...


def members_dir(cr: SessionHost, group: str) -> Path:
    return cr.store.proc_dir(group) / "members"


def join(cr: SessionHost, group: str, name: str, command: list[str], cwd: str | None = None,
         env: dict[str, str] | None = None, wake_on: list[WakeOn] | None = None, idle_timeout: float | None = None) -> Running:
    """Start ``command`` as member ``name`` of ``group`` (started first when it does not run);
    ``wake_on``: the session is paused after ``idle_timeout`` and woken on these addresses too."""
    validate_name(name, "member name")
    if not command:
        raise StateError("No command given.", "Usage: gpucr run --group SESSION --name NAME -- CMD ARGS...")
    if wake_on and idle_timeout is None:
        raise StateError("A wake address needs an idle timeout.", "Give both, or neither.")
    _start_unless_running(cr, group)
    d = cr.store.proc_dir(group)
    with exclusive(d, group, f"adding {name!r} to the session"):
        rec = dict(cr.store.read_proc(group))
        if any(m["name"] == name and m["state"] == "running" for m in members(cr, group, rec)):
            raise StateError(f"The session {group!r} already has a member {name!r} running.", "Pick another name.")
        ns_pid = _ask_leader(cr, group, cast(int, rec["pid"]), name, command, cwd or os.getcwd(), env)
        member = {"name": name, "command": command, "cwd": cwd or os.getcwd(), "ns_pid": ns_pid, "created": time.time()}
        others = [m for m in cast(list[dict[str, Any]], rec.get("members", [])) if m["name"] != name]
        rec = {**rec, "members": [*others, member]}
        cr.store.write_proc(group, cast(ProcRecord, rec))  # "members" is a session's own key
        if wake_on:
            _wake_on_too(cr, group, wake_on, cast(float, idle_timeout))
    host_pid = find_descendant_by_ns_pid(cast(int, rec["pid"]), ns_pid) or 0
    return Running(name, host_pid, ns_pid, None, cast(ProcRecord, rec))


def _start_unless_running(cr: SessionHost, group: str) -> None:
    """Start the session ``group`` if it has no record or its leader exited."""
    try:
        rec: dict[str, Any] = dict(cr.store.read_proc(group))
    except GPUCRError:
        rec = {}
    if rec and "members" not in rec:
        raise StateError(f"{group!r} is a process, not a session of several.", "Name the session differently.")
    if rec.get("state") == "checkpointed":
        raise StateError(f"The session {group!r} is checkpointed.",
                         f"Restore it first ('gpucr restore {group}'), or connect to it to wake it, then add the member.")
    if rec.get("state") == "running" and is_alive(rec.get("pid")):
        return
    for stale in members_dir(cr, group).glob("*") if rec else ():
        stale.unlink()  # an ended session's answers and logs start afresh
    os.makedirs(members_dir(cr, group), mode=0o700, exist_ok=True)
    running = cr.run(group, [sys.executable, "-I", "-S", str(LEADER), str(cr.store.proc_dir(group))], cwd="/")
    cr.store.write_proc(group, cast(ProcRecord, {**running.record, "members": []}))
    _await(lambda: (members_dir(cr, group) / READY).exists(), running.pid, group, "get ready",
           cr.store.proc_dir(group) / "stderr.log")


def _await(done: Callable[[], object], leader: int, group: str, what: str, log: Path) -> None:
    """Wait until ``done()``; raise if the leader exits or takes too long."""
    deadline = time.monotonic() + ANSWER_WAIT
    while not done():
        if not is_alive(leader) or time.monotonic() > deadline:
            raise EngineError(f"The leader of the session {group!r} did not {what}: it "
                              f"{'exited' if not is_alive(leader) else f'took more than {ANSWER_WAIT:.0f} s'}.",
                              f"See {log}; 'gpucr rm --kill {group}' ends the session.")
        time.sleep(0.01)


def _ask_leader(cr: SessionHost, group: str, leader: int, name: str, command: list[str], cwd: str,
                env: dict[str, str] | None) -> int:
    """Have the leader start the member; its PID in the session's namespace."""
    folder = members_dir(cr, group)
    answer = folder / f"{name}.json"
    answer.unlink(missing_ok=True)
    write_json_atomic(folder / f"{name}.request.json",
                      {"command": command, "cwd": cwd, "env": dict(os.environ if env is None else env)}, durable=False)
    os.kill(leader, signal.SIGUSR1)
    try:
        _await(answer.exists, leader, group, f"start {name!r}", cr.store.proc_dir(group) / "stderr.log")
    finally:
        (folder / f"{name}.request.json").unlink(missing_ok=True)
    said = read_json(answer) or {}
    if "error" in said:
        raise EngineError(f"{name!r} could not be started in the session {group!r}: {said['error']}.",
                          "Check the command and its working directory.")
    return int(said["ns_pid"])


def _wake_on_too(cr: SessionHost, group: str, wake_on: list[WakeOn], idle_timeout: float) -> None:
    """One waker per session: a member's addresses are added to those of the running waker, which
    is started again with all of them (it cannot be pausing: the caller holds the session's lock)."""
    status = read_status(cr.store, group)
    known = [WakeOn.parse(w) for w in status["wake_on"]] if status and status["alive"] else []
    if known and all(w in known for w in wake_on):
        return
    if status and known:
        os.kill(status["pid"], signal.SIGTERM)
        wait_gone(status["pid"], 5)
    start_waker(cr.store, group, [*known, *(w for w in wake_on if w not in known)], idle_timeout, cr.criu_path)


def members(cr: SessionHost, group: str, rec: dict[str, Any]) -> list[dict[str, Any]]:
    """Each member of a session with its state now: its host PID while it runs, its exit code once it
    exited, the session's state otherwise."""
    out = []
    for m in rec.get("members", []):
        said = read_json(members_dir(cr, group) / f"{m['name']}.json") or {}
        pid = find_descendant_by_ns_pid(rec["pid"], m["ns_pid"]) if rec.get("state") == "running" and rec.get("pid") else None
        state = "running" if pid else f"exited ({said['exit']})" if "exit" in said else rec.get("state", "unknown")
        out.append({**m, "pid": pid, "state": state})
    return out


def member_log(cr: SessionHost, group: str, name: str, stream: str = "stdout") -> Path:
    """Where a member's output goes."""
    return members_dir(cr, group) / f"{name}.{stream}.log"


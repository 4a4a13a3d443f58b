"""Start a holder (PID 1 of a fresh PID + mount namespace) and wait until it reports.

Each holder is recorded beside its status file (``.holder-PID.json``: its PID and start time, then
the workload's) before it may run (``identity.spawn_recorded``): recovery and the daemon find
holders and workloads by these records only, never by command line.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import EngineError, PreconditionError
from ..jsonfile import read_json, write_json_atomic
from .identity import ProcId, spawn_recorded
from .procs import find_descendant_by_ns_pid

# jupyter_client sets this so ipykernel exits when its parent changes; inside a holder the
# parent is PID 1 and, after a restore, a different process: it must not be inherited.
_DROP_ENV = ("JPY_PARENT_PID",)


HOLDER = Path(__file__).with_name("holder.py")
# The workload exists once the holder reports it started; if it is not in the process table within
# this, it has already exited (a kernel that dies at start must not be waited on for minutes).
FIND_GRACE = 5.0
TAIL_LINES = 12
HOLDER_RECORD_PREFIX = ".holder-"


class ExitedAtStart(EngineError):
    """The command started and exited before it could be tracked. ``popen`` is the (reaped) holder:
    a caller that treats this as a start followed by an exit, as jupyter_client does, keeps it."""

    def __init__(self, message: str, hint: str, popen: subprocess.Popen) -> None:
        super().__init__(message, hint)
        self.popen = popen


@dataclass(frozen=True)
class Started:
    """A process running inside its own namespaces."""

    popen: subprocess.Popen
    holder_pid: int  # host PID of the ``unshare`` process that owns the namespace
    pid: int  # host PID of the workload (what signals and the CUDA driver take)
    ns_pid: int  # its PID inside the namespace (what CRIU records)


@dataclass(frozen=True)
class HolderRecord:
    """What :func:`start_holder` recorded about one holder: the holder itself as soon as it
    exists, ``ns_pid`` once it reported the workload's PID in its namespace, ``workload`` once that
    was found on the host."""

    path: Path
    holder: ProcId
    mode: str  # "run" or "restore"
    ns_pid: int | None = None
    workload: ProcId | None = None

    def write(self) -> None:
        write_json_atomic(self.path, {"holder": self.holder.to_dict(), "mode": self.mode, "ns_pid": self.ns_pid,
                                      "workload": self.workload.to_dict() if self.workload else None},
                          durable=False)  # the processes it names do not survive a power loss either

    @classmethod
    def read(cls, path: Path) -> HolderRecord | None:
        data = read_json(path) or {}
        holder = ProcId.from_dict(data.get("holder"))
        if holder is None:
            return None
        ns_pid = data.get("ns_pid")
        return cls(path, holder, str(data.get("mode")), ns_pid if isinstance(ns_pid, int) else None,
                   ProcId.from_dict(data.get("workload")))


def holder_records(directory: Path) -> list[HolderRecord]:
    """The holders recorded in ``directory`` (a process's folder in the store), newest first."""
    found = [HolderRecord.read(p) for p in directory.glob(f"{HOLDER_RECORD_PREFIX}*.json")]
    return sorted((r for r in found if r is not None), key=lambda r: r.holder.start, reverse=True)


def live_holders(directory: Path) -> list[HolderRecord]:
    """The recorded holders that still run, newest first; the records of the others are removed."""
    live = []
    for record in holder_records(directory):
        if record.holder.alive():
            live.append(record)
        else:
            record.path.unlink(missing_ok=True)
    return live


def unshare_argv(holder_args: list[str], net: bool = False) -> list[str]:
    """``net``: a network namespace of its own too (a fork's: see ``relay.py``)."""
    unshare = shutil.which("unshare")
    if not unshare:
        raise PreconditionError("The 'unshare' command (util-linux) is missing.", "Install util-linux.")
    return [
        unshare, "--pid", "--fork", "--mount-proc", "--propagation", "slave", "--kill-child", *(["--net"] if net else []),
        # Run as a plain script in isolated mode: the holder needs only the standard library,
        # and importing the package would add ~0.3 s to every start and restore.
        sys.executable, "-I", "-S", str(HOLDER), *holder_args,
    ]


def clean_env(env: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    for key in _DROP_ENV:
        env.pop(key, None)
    return env


def start_holder(
    holder_args: list[str],
    status_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    detach: bool = False,
    log_path: Path | None = None,
    pass_fds: tuple[int, ...] = (),
    net: bool = False,
) -> Started | None:
    """Start a holder; return where the workload runs, or None when a restore failed (CRIU's log
    says why). A command that cannot start, or exits at once, raises EngineError saying why.
    The holder is recorded in ``status_path``'s folder (see :class:`HolderRecord`). It inherits
    ``pass_fds`` (a fork's relay sockets); ``net``: see :func:`unshare_argv`."""
    status_path.unlink(missing_ok=True)
    live_holders(status_path.parent)  # drops the records of holders that are gone
    stderr = _option(holder_args, "--stderr")
    stderr_log = Path(stderr) if stderr else None
    stderr_start, log_start = _size(stderr_log), _size(log_path)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL

    def record(holder: ProcId) -> HolderRecord:
        found = HolderRecord(status_path.parent / f"{HOLDER_RECORD_PREFIX}{holder.pid}.json", holder, holder_args[0])
        found.write()
        return found

    try:
        popen, recorded = spawn_recorded(unshare_argv([f"--status={status_path}", *holder_args], net), record,
                                         stdout=log, stderr=log, env=clean_env(env), start_new_session=detach,
                                         close_fds=True, pass_fds=pass_fds)
    except OSError as e:
        raise EngineError(f"Could not start and record the namespace holder in {status_path.parent}: {e.strerror or e}.",
                          "Free disk space in the checkpoint store and retry.") from None
    finally:
        if not isinstance(log, int):
            log.close()
    status = _await_status(popen, status_path, timeout, log_path, log_start)
    if not status.get("ok"):
        status_path.unlink(missing_ok=True)
        popen.wait(timeout=10)
        if "error" in status:
            raise _cannot_start(holder_args, status["error"])
        return None
    ns_pid = int(status["ns_pid"])
    recorded = replace(recorded, ns_pid=ns_pid)
    recorded.write()  # before the report is gone: recovery reads one or the other
    status_path.unlink(missing_ok=True)
    host_pid = _find_workload(popen, ns_pid, time.monotonic() + FIND_GRACE)
    workload = ProcId.of(host_pid) if host_pid is not None else None
    if workload is None:
        raise _exited_at_start(popen, holder_args, stderr_log, stderr_start)
    replace(recorded, workload=workload).write()
    return Started(popen, popen.pid, workload.pid, ns_pid)


def _await_status(popen: subprocess.Popen, status_path: Path, timeout: float, log_path: Path | None, log_start: int) -> dict:
    """The holder's report (left in place for the caller to remove once recorded); fails at once
    when the holder exits without one."""
    deadline = time.monotonic() + timeout
    while not status_path.exists():
        if popen.poll() is not None and not status_path.exists():
            raise EngineError(
                f"The namespace holder exited with code {popen.returncode} before reporting.{_tail_of(log_path, log_start)}",
                f"See {log_path}." if log_path else "Check that unshare works: 'gpucr doctor'.",
            )
        if time.monotonic() > deadline:
            popen.kill()
            popen.wait()
            raise EngineError(f"The namespace holder did not report within {timeout:.0f} s.",
                              f"See {log_path}." if log_path else "Check that unshare works: 'gpucr doctor'.")
        time.sleep(0.01)
    return json.loads(status_path.read_text())


def _find_workload(popen: subprocess.Popen, ns_pid: int, deadline: float) -> int | None:
    """Host PID of the workload; None as soon as it is gone (the holder exits with it, or it is not
    in the process table although the holder reported it started)."""
    while True:
        host_pid = find_descendant_by_ns_pid(popen.pid, ns_pid)
        if host_pid is not None or popen.poll() is not None or time.monotonic() > deadline:
            return host_pid
        time.sleep(0.01)


def _cannot_start(holder_args: list[str], why: str) -> EngineError:
    return EngineError(f"{shlex.join(_command(holder_args))} could not be started: {why}.",
                       "Check the command and its working directory.")


def _command(holder_args: list[str]) -> list[str]:
    return holder_args[holder_args.index("--") + 1:] if "--" in holder_args else []


def _exited_at_start(popen: subprocess.Popen, holder_args: list[str], stderr_log: Path | None, start: int) -> ExitedAtStart:
    """Take the namespace down (leftover children included) and say what died and why,
    with what it wrote to stderr during this start."""
    code = popen.poll()
    if code is None:  # its children still run: --kill-child takes the namespace's init, and all inside, down
        popen.kill()
        popen.wait()
    what = shlex.join(_command(holder_args)) if holder_args[:1] == ["run"] else "The restored process"
    how = f" with code {code}" if code is not None else ""
    tail = _tail_of(stderr_log, start)
    return ExitedAtStart(
        f"{what} exited{how} right after it started.{tail}",
        f"Its whole output is in {stderr_log}. Check the command, its working directory and its environment."
        if tail else "It wrote nothing to stderr. Check the command, its working directory and its environment.",
        popen,
    )


def _option(args: list[str], name: str) -> str | None:
    prefix = f"{name}="
    return next((a[len(prefix):] for a in args if a.startswith(prefix)), None)


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path else 0
    except OSError:
        return 0


def _tail_of(path: Path | None, start: int = 0, lines: int = TAIL_LINES) -> str:
    """The last lines a log got from ``start`` on, as a paragraph for an error message ('' if none)."""
    if path is None:
        return ""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            text = f.read().decode(errors="replace").strip()
    except OSError:
        return ""
    return f"\nLast lines of {path}:\n" + "\n".join(text.splitlines()[-lines:]) + "\n" if text else ""

"""Which process a record means: its PID and its start time, written into the store by whoever
started it, at the start.

A PID alone names whatever runs under it now (PIDs are reused), and a command line names whatever
anyone chose to show in ``ps``: a process of another user, even in namespaces of its own, can show
the argv of a gpucr holder or of CRIU. A PID whose start time (``/proc/PID/stat``, clock ticks after
boot) is still the recorded one is the process that was recorded. The records live in the store,
which only its owner (root, in the daemon) can write.
"""
from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..jsonfile import read_json

#: In a checkpoint's work directory while CRIU dumps into it: the PID and start time of the CRIU run.
CRIU_RECORD = "criu.json"
T = TypeVar("T")
# Waits for a line on stdin, then becomes the command (same PID, same start time) with stdin from
# /dev/null; at end of file (whoever started it died before recording it) it exits, having done nothing.
_GATE = 'read -r go && exec "$@" </dev/null'


def stat_fields(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` after the command name (state first); None when gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].decode().split()


def start_time(pid: int | str) -> int | None:
    """When ``pid`` started, in clock ticks after boot; None when it is gone or a zombie."""
    fields = stat_fields(pid)
    if not fields or fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


@dataclass(frozen=True)
class ProcId:
    """One process: a PID and when it started."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcId | None:
        """The process running as ``pid`` now; None when there is none."""
        start = start_time(pid)
        return None if start is None else cls(pid, start)

    @classmethod
    def from_dict(cls, data: Any) -> ProcId | None:
        if isinstance(data, dict) and isinstance(data.get("pid"), int) and isinstance(data.get("start"), int):
            return cls(data["pid"], data["start"])
        return None

    def to_dict(self) -> dict[str, int]:
        return {"pid": self.pid, "start": self.start}

    def alive(self) -> bool:
        """Whether this very process still runs (not a zombie, not a later one with its PID)."""
        return start_time(self.pid) == self.start


def spawn_recorded(argv: list[str], record: Callable[[ProcId], T], **popen_args: Any) -> tuple[subprocess.Popen, T]:
    """Start ``argv`` (``subprocess.Popen`` with ``popen_args``, never ``stdin``), but let it run
    only once ``record`` has recorded it (what ``record`` returns comes back with it), so that no
    run of it is ever unrecorded: if this process dies, or ``record`` raises, before that, it ends
    without having started."""
    read, write = os.pipe()
    try:
        popen = subprocess.Popen(["/bin/sh", "-c", _GATE, "gpucr-gate", *argv], stdin=read, **popen_args)
    except BaseException:
        os.close(write)
        raise
    finally:
        os.close(read)
    try:
        me = ProcId.of(popen.pid)
        if me is None:  # it waits for us: only a kill from outside ends it
            raise ProcessLookupError(f"process {popen.pid} ended before it was let go")
        recorded = record(me)
    except BaseException:
        os.close(write)
        popen.wait()
        raise
    os.write(write, b"go\n")
    os.close(write)
    return popen, recorded


def criu_at_work(workdir: Path) -> ProcId | None:
    """The CRIU run recorded in ``workdir`` if it still runs."""
    proc = ProcId.from_dict(read_json(workdir / CRIU_RECORD))
    return proc if proc is not None and proc.alive() else None

"""Which program owns a process gpucr runs for it: the jupyter_client program (nbconvert, papermill,
a Jupyter server) whose gpucr provisioner launched a kernel and talks to it.

A process started by ``gpucr run`` is the user's: ``gpucr checkpoint`` may stop it, ``gpucr restore``
bring it back. A kernel has an owner that keeps the other end: its KernelManager polls the process
and declares the kernel dead when it goes, and only it shuts the kernel down. So the CLI leaves a
kernel whose owner runs on running when it checkpoints it, and does not restore one whose owner has
ended (or let it go): nothing would connect to it or ever end it. The record, ``owner.json`` in
the process's folder, names the owner by PID and start time (:class:`~.identity.ProcId`), its
command line for people, and when it let the kernel go (shut it down).
"""
from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..jsonfile import read_json, write_json_atomic
from .identity import ProcId

OWNER_RECORD = "owner.json"
# How much of the owner's command line a message shows.
COMMAND_CHARS = 80


@dataclass(frozen=True)
class Owner:
    proc: ProcId
    command: list[str]
    released_at: float | None = None

    @property
    def state(self) -> str:
        """``running`` (with the kernel), ``released`` (it runs, but shut the kernel down) or ``ended``."""
        if not self.proc.alive():
            return "ended"
        return "running" if self.released_at is None else "released"

    @property
    def alive(self) -> bool:
        """The owner runs and still has the kernel (it did not shut it down)."""
        return self.state == "running"

    def describe(self) -> str:
        """``PID 1234 (jupyter-nbconvert --execute nb.ipynb)``, for messages."""
        command = shlex.join([os.path.basename(self.command[0]), *self.command[1:]]) if self.command else "?"
        if len(command) > COMMAND_CHARS:
            command = command[:COMMAND_CHARS - 3] + "..."
        return f"PID {self.proc.pid} ({command})"

    def to_dict(self) -> dict[str, Any]:
        return {**self.proc.to_dict(), "command": self.command, "released_at": self.released_at, "state": self.state,
                "description": self.describe()}


def record_owner(proc_dir: Path) -> None:
    """Record this process as the owner of the process in ``proc_dir``."""
    me = ProcId.of(os.getpid())
    assert me is not None
    try:
        command = psutil.Process().cmdline()
    except psutil.Error:
        command = []
    write_json_atomic(proc_dir / OWNER_RECORD, {**me.to_dict(), "command": command, "released_at": None},
                      durable=False)


def release_owner(proc_dir: Path) -> None:
    """The owner let the process go (shut the kernel down): from now on nobody owns it."""
    data = read_json(proc_dir / OWNER_RECORD)
    if data is not None and ProcId.from_dict(data) == ProcId.of(os.getpid()):
        write_json_atomic(proc_dir / OWNER_RECORD, {**data, "released_at": time.time()}, durable=False)


def owner_of(proc_dir: Path) -> Owner | None:
    """The recorded owner; None for a process that has none (``gpucr run``'s)."""
    data = read_json(proc_dir / OWNER_RECORD)
    proc = ProcId.from_dict(data)
    if data is None or proc is None:
        return None
    released = data.get("released_at")
    return Owner(proc, [str(c) for c in data.get("command") or []],
                 float(released) if isinstance(released, int | float) else None)

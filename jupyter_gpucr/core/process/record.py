"""A process's record (``procs/NAME/run.json``): what was started, where it is now; the store
keeps it (``Store.read_proc``, ``Store.write_proc``)."""
from __future__ import annotations

from typing import Any, TypedDict


class Restoring(TypedDict, total=False):
    """A restore under way: in the process record from before CRIU reads the images until the
    restored process is recorded as running, for recovery if the restoring process dies."""

    checkpoint: str
    ns_pid: int | None
    gpu_map: dict[str, str]
    since: float
    by: int


class ProcRecord(TypedDict, total=False):
    """A process's record (``procs/NAME/run.json``): what was started, where it is now."""

    name: str
    command: list[str] | None
    cwd: str | None
    created: float | None
    state: str  # "running", "checkpointed" or "lost"
    pid: int | None
    ns_pid: int | None
    checkpoint: str | None  # the latest checkpoint's id
    uid: int
    user: str
    adopted: bool  # a process gpucr did not start ('gpucr checkpoint PID')
    via: str  # "daemon": started through the gpucr daemon
    groups: list[int]  # the supplementary groups the daemon started it with
    cgroup: str | None  # the cgroup (v2) folder it belongs in, the caller's when the daemon started it
    engine: str | None  # "snapshot": suspended by the server's snapshot engine
    suspended_at: float
    restored_at: float
    restored_from: str
    gpu_map: dict[str, str]
    restoring: Restoring
    lost_reason: str
    lost_at: float
    forked_from: dict[str, str]  # a fork's source: its name and the checkpoint the fork was made from
    netns: dict[str, Any]  # a fork's own network namespace: its relay's host ports (core/forks/netns.py)
    files: dict[str, str]  # a fork's own copies of the files its source had open for writing
    copied_files: list[str]  # files of its folder that are copies of those its image had open (a trash entry's)
    moved_from: str  # the process's folder on the node whose checkpoint was downloaded here (core/objectstore/transfer.py)
    memory_tracked: dict[str, Any]  # its last dump that tracked written pages: checkpoint, pid, start (core/steps/incremental.py)

"""Which processes the daemon acts on for a user, and which credentials it lets into a checkpoint.

Identity: a name in a user's store means the workload that a namespace holder runs, both as their
launch recorded them (PID and start time, ``launcher.HolderRecord``) in the user's root-only store;
never a process found by its name or command line, which anyone can imitate.

Credentials: the images keep each task's credentials and ``criu restore`` (root) hands them back.
So the daemon checkpoints a tree only while every task (thread) of it has the owner's uid (real,
effective, saved, fs), the owner's gid (all four), no supplementary group outside the owner's
groups in the group database, and no capability (permitted, effective, inheritable, ambient). The
check runs on the live tree, and again once the tree is frozen, right before CRIU seizes it: in
between, a task could have run a set-user-ID or set-group-ID program.

Freezing: every process of the tree gets SIGSTOP through a pidfd (a PID reused meanwhile is never
signalled) and the tree is walked again until no process is new and every thread is stopped. A
stopped task cannot fork, exec or change its credentials; CRIU seizes stopped tasks as they are.
The images therefore record the tasks as stopped: every restore by the daemon continues the tree
(it leaves it stopped for its checks first). After a dump that leaves the tree running, or one that
failed, the tree is continued, except tasks that were stopped before the freeze.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from ..core.errors import AccessRefusedError, EngineError, StateError
from ..core.process.identity import ProcId, stat_fields
from ..core.process.launcher import HolderRecord, holder_records
from ..core.process.procs import in_own_pidns, innermost_pid, tree
from ..core.process.record import ProcRecord
from .guard import Owner

#: How long the tasks of a tree get to stop (one in an uninterruptible wait stops when it ends).
FREEZE_WAIT = 5.0
_CAPS = ("CapInh", "CapPrm", "CapEff", "CapAmb")
_WHICH = ("real", "effective", "saved", "fs")


def launched(proc_dir: Path, rec: ProcRecord) -> HolderRecord:
    """The record of the holder whose recorded workload is ``rec``'s process, both still running;
    StateError when there is none (the process is not one the daemon started or restored here)."""
    pid = rec.get("pid")
    for holder in holder_records(proc_dir):
        work = holder.workload
        if (work is not None and work.pid == pid and holder.ns_pid == rec.get("ns_pid") and work.alive()
                and holder.holder.alive() and in_own_pidns(work.pid) and innermost_pid(work.pid) == holder.ns_pid):
            return holder
    raise StateError(f"{rec.get('name')!r} (PID {pid}) is not a process the gpucr daemon started or restored for you.",
                     "The daemon acts only on the processes it launched for the user who asks; "
                     "'gpucr recover' makes the record true again.")


def check_credentials(pid: int, owner: Owner, name: str) -> None:
    """Every thread of the tree rooted at ``pid`` has only ``owner``'s credentials (see the module
    docstring); AccessRefusedError naming the first process and check that fails."""
    for p in tree(pid):
        for tid, status in _threads(p):
            wrong = _wrong_credentials(status, owner)
            if wrong:
                thread = f" (thread {tid})" if tid != p else ""
                raise AccessRefusedError(
                    f"Process {p}{thread} of {name!r} has {', '.join(wrong)}, which {owner.name} (uid {owner.uid}) "
                    "does not have: a set-user-ID or set-group-ID program, or one with file capabilities, runs in it. "
                    "The gpucr daemon did not checkpoint it.",
                    "Let that program end, then suspend again; the daemon checkpoints only processes with their "
                    "owner's own credentials.")


def _threads(pid: int) -> list[tuple[int, dict[str, list[str]]]]:
    try:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return []
    found = []
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                found.append((tid, {k: v.split() for k, _, v in (line.partition(":") for line in f)}))
        except OSError:
            continue  # it ended
    return found


def _wrong_credentials(status: dict[str, list[str]], owner: Owner) -> list[str]:
    wrong = [f"{which} uid {u}" for which, u in zip(_WHICH, map(int, status["Uid"]), strict=True) if u != owner.uid]
    wrong += [f"{which} gid {g}" for which, g in zip(_WHICH, map(int, status["Gid"]), strict=True) if g != owner.gid]
    wrong += [f"group {g}" for g in map(int, status.get("Groups", [])) if g not in owner.groups]
    if owner.uid != 0:
        wrong += [f"capabilities {key} {status[key][0]}" for key in _CAPS if key in status and int(status[key][0], 16)]
    return wrong


def check_namespaces(pid: int, holder: ProcId, name: str) -> None:
    """Every process of the tree rooted at ``pid`` is in the host's user namespace and in the mount
    namespace its holder was given (the daemon made it, as root): a process that made namespaces of
    its own (``unshare``) could show CRIU, or anything root runs for it, mounts of its choosing."""
    expected = {("user", "user"): _ns("self", "user"), ("mnt", "mount"): _ns(holder.pid, "mnt")}
    if not holder.alive():
        raise StateError(f"The namespace of {name!r} ended before it could be checkpointed.")
    for p in tree(pid):
        made = [said for (ns, said), inode in expected.items() if _ns(p, ns) not in (inode, None)]
        if made:
            raise AccessRefusedError(
                f"Process {p} of {name!r} runs in a {' and a '.join(made)} namespace of its own. The gpucr daemon "
                "checkpoints only processes in the namespaces it made for them; it did not checkpoint it. The "
                "process was left running.",
                "Let the process that made them end (or run it without unshare), then suspend again.")


def _ns(pid: int | str, kind: str) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/{kind}").st_ino
    except OSError:
        return None


def freeze_checked(root: ProcId, owner: Owner, name: str, holder: ProcId) -> Callable[[], None]:
    """Stop the tree rooted at ``root`` (see the module docstring), check its credentials and
    namespaces, and return what continues it; a failed check continues it and raises."""
    frozen = _Frozen(root)
    try:
        frozen.stop()
        check_credentials(root.pid, owner, name)
        check_namespaces(root.pid, holder, name)
    except BaseException:
        frozen.thaw()
        raise
    return frozen.thaw


class _Frozen:
    """The processes of one tree stopped through their pidfds."""

    def __init__(self, root: ProcId) -> None:
        self.root = root
        self.pidfds: dict[int, int] = {}
        self.stopped_before: set[int] = set()

    def stop(self) -> None:
        deadline = time.monotonic() + FREEZE_WAIT
        while True:
            members = tree(self.root.pid)
            if not members or self.root.pid not in self.pidfds and not self._pin(self.root.pid, members):
                raise StateError(f"{self.root.pid} ended before it could be checkpointed.")
            new = [p for p in members if p not in self.pidfds and self._pin(p, members)]  # zombies are not
            running = [p for p in members if not _all_stopped(p)]
            if not new and not running:
                return
            if time.monotonic() > deadline:
                raise EngineError(f"Process {(running or new)[0]} did not stop within {FREEZE_WAIT:.0f} s, "
                                  "so it could not be checked before the dump. The process was left running.",
                                  "It may wait on a device or a disk; retry when it is idle.")
            time.sleep(0.002)

    def _pin(self, pid: int, members: list[int]) -> bool:
        """Open a pidfd for ``pid``, make sure it is the process the walk found (the root by its
        start time, any other by a parent in the tree) and stop it; False when it is gone."""
        if pid in self.pidfds:
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        fields = stat_fields(pid)
        ours = fields is not None and fields[0] not in ("Z", "X") and (
            int(fields[19]) == self.root.start if pid == self.root.pid else int(fields[1]) in members)
        try:
            if not ours:
                raise ProcessLookupError
            if fields is not None and fields[0] in ("T", "t"):
                self.stopped_before.add(pid)
            signal.pidfd_send_signal(fd, signal.SIGSTOP)
        except ProcessLookupError:
            os.close(fd)
            return False
        self.pidfds[pid] = fd
        return True

    def thaw(self) -> None:
        for pid, fd in self.pidfds.items():
            if pid not in self.stopped_before:
                try:
                    signal.pidfd_send_signal(fd, signal.SIGCONT)
                except ProcessLookupError:
                    pass
            os.close(fd)
        self.pidfds.clear()


def _all_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped (or gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tids:
        fields = stat_fields(f"{pid}/task/{tid}")
        if fields is not None and fields[0] not in ("T", "t", "Z", "X"):
            return False
    return True

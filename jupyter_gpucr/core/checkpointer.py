"""Suspend and restore one process tree, GPU memory included; the core every front end uses.

The rule every path keeps: when an operation fails, the user has either the running process
or a complete checkpoint, never neither. Suspend puts the process back (GPU restored and
unlocked, CRIU resumes it) on any failure before the checkpoint is complete; restore keeps
the checkpoint on any failure.
"""
from __future__ import annotations

import builtins
import getpass
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import psutil

from .backend import BesideDump, CheckpointBackend
from .criu import nodecompat
from .criu.commands import Criu
from .criu.images import RunningAgain
from .errors import CheckpointDamagedError, GPUCRError, StateError
from .files import private_files
from .forks.copies import fork as fork_copies
from .objectstore.transfer import relocated_files
from .process.launcher import start_holder
from .process.privileges import check_privileges
from .process.procs import innermost_pid, is_alive, namespace_init_of, wait_gone
from .process.record import ProcRecord
from .process.running import Running
from .recovery import RECOVER_WAIT, CrashRecovery, Recovery
from .steps import netlocks
from .steps.compatibility import check_compatible
from .steps.contract import Progress, RestoreCheck, no_progress
from .steps.dump import write_checkpoint
from .steps.pages import PAGES_WAIT, wait_for_pages
from .steps.restore import ChangedWhileFilled, restore_locked
from .storage import chain
from .storage.locks import exclusive
from .storage.openfiles import OpenFiles
from .storage.store import Checkpoint, Store

#: How long a remove waits for the operation under way on the process (an idle checkpoint, a
#: restore) to finish: about the longest a checkpoint of a large GPU process takes.
REMOVE_WAIT = 600.0


class Checkpointer(CheckpointBackend):
    """Start, checkpoint, restore, list and remove checkpointable processes in one store."""

    def __init__(
        self,
        store: Store | str | Path | None = None,
        criu_path: str | None = None,
        keep_last: int = 1,
        max_bytes: int | None = None,
        lock_timeout_ms: int = 10_000,
        check_space: bool = True,
        verify: bool = True,
        lazy_restore: bool = True,
        network_lock_hold: float | None = netlocks.NETWORK_LOCK_HOLD,
        restore_check: RestoreCheck | None = None,
        open_files: OpenFiles | None = None,
    ) -> None:
        self.store = store if isinstance(store, Store) else Store(store)
        self.criu_path = criu_path
        self.keep_last = keep_last
        self.max_bytes = max_bytes
        self.lock_timeout_ms = lock_timeout_ms
        self.check_space = check_space
        self.verify = verify
        self.lazy_restore = lazy_restore
        self.network_lock_hold = network_lock_hold
        self.restore_check = restore_check
        #: Where checkpoints are uploaded for other nodes: what the process holds open is recorded
        #: and its scratch files kept with each checkpoint that stops it (see ``openfiles``).
        self.open_files = open_files
        #: Entered with (name, checkpoint id, images folder) while CRIU writes the images: an
        #: upload to object storage that starts at once (``streamup``); its exit learns whether
        #: the dump succeeded. Not for a dump that leaves the process running (a fork's): that one
        #: is never uploaded.
        self.beside_dump: BesideDump | None = None
        #: Why every dump holds all its pages, a save point's too (the gpucr daemon's: it shares none
        #: between its images); None: save points are incremental where the kernel allows.
        self.full_dumps: str | None = None
        self._criu: Criu | None = None

    @property
    def criu(self) -> Criu:
        if self._criu is None:
            self._criu = Criu(self.criu_path)
        return self._criu

    def unavailable_reason(self) -> str | None:
        """None when this process can checkpoint (CRIU found; root or CRIU's capabilities); else why not."""
        try:
            self.criu  # noqa: B018  # finding the binary is the check
        except GPUCRError as e:
            return e.message
        if os.geteuid() != 0:
            check = check_privileges()
            if not check.ok:
                return f"no checkpoint privileges ({check.detail})"
        return None

    @property
    def recovery(self) -> CrashRecovery:
        return CrashRecovery(self.store, self.keep_last, self.max_bytes)

    def recover_all(self, wait_s: float = RECOVER_WAIT) -> dict[str, Recovery]:
        """See :meth:`CrashRecovery.recover_all`."""
        return self.recovery.recover_all(wait_s)

    def recover(self, name: str, wait_s: float = RECOVER_WAIT, lock_wait_s: float = 10.0) -> Recovery:
        """See :meth:`CrashRecovery.recover`."""
        return self.recovery.recover(name, wait_s, lock_wait_s)

    # -- start ---------------------------------------------------------------------------
    def run(self, name: str, command: list[str], cwd: str | None = None, env: dict[str, str] | None = None,
            detach: bool = True) -> Running:
        """Start ``command`` in its own namespaces, output to log files in the store (as a member
        of a session: ``group.join``)."""
        if not command:
            raise StateError("No command given.", "Usage: gpucr run --name NAME -- CMD ARGS...")
        d = self.store.proc_dir(name)
        with exclusive(d, name, "start"):
            self._refuse_if_running(name)
            private_files(d, "stdout.log", "stderr.log", "holder.log")
            started = start_holder(
                ["run", f"--stdout={d / 'stdout.log'}", f"--stderr={d / 'stderr.log'}",
                 f"--cwd={cwd or os.getcwd()}", "--", *command],
                d / ".status", env=env, detach=detach, log_path=d / "holder.log",
            )
            assert started is not None  # run mode reports failure by exiting
            record: ProcRecord = {
                "name": name, "command": command, "cwd": cwd or os.getcwd(), "created": time.time(),
                "state": "running", "pid": started.pid, "ns_pid": started.ns_pid, "checkpoint": None,
                "uid": os.getuid(), "user": getpass.getuser(),
            }
            self.store.write_proc(name, record)
        return Running(name, started.pid, started.ns_pid, started, record)

    def _refuse_if_running(self, name: str) -> None:
        try:
            rec = self.store.read_proc(name)
        except GPUCRError:
            return
        if rec.get("state") == "running" and is_alive(rec.get("pid")):
            raise StateError(f"{name!r} is already running as PID {rec['pid']}.",
                             f"Checkpoint it first ('gpucr checkpoint {name}') or pick another name.")

    # -- resolve -------------------------------------------------------------------------
    def resolve(self, target: str | int) -> tuple[str, ProcRecord]:
        """A name, or the host PID of a gpucr process, or of any process (adopted as pid-N)."""
        text = str(target)
        if not (text.isascii() and text.isdigit()):
            return text, self.store.read_proc(text)
        pid = int(text)
        for name in self.store.proc_names():
            rec = self.store.read_proc(name)
            if rec.get("pid") == pid and rec.get("state") == "running":
                return name, rec
        if not is_alive(pid):
            raise StateError(f"No process with PID {pid} is running.", "Run 'gpucr ls' to see what gpucr manages.")
        proc = psutil.Process(pid)
        name = f"pid-{pid}"
        adopted: ProcRecord = {"name": name, "command": proc.cmdline(), "cwd": proc.cwd(), "created": proc.create_time(),
                               "state": "running", "pid": pid, "ns_pid": innermost_pid(pid), "checkpoint": None,
                               "uid": os.getuid(), "user": getpass.getuser(), "adopted": True}
        self.store.write_proc(name, adopted)
        return name, adopted

    # -- checkpoint ----------------------------------------------------------------------
    def checkpoint(self, target: str | int, leave_running: bool = False, reason: str = "manual",
                   extra: dict[str, Any] | None = None, progress: Progress = no_progress,
                   before_dump: Callable[[], None] | None = None, also_durable: Sequence[Path] = (),
                   incremental: bool = False, running_again: RunningAgain | None = None,
                   before_commit: Callable[[], None] | None = None) -> Checkpoint:
        """Write a verified checkpoint of the process; without ``leave_running`` it is gone
        afterwards and its GPU memory is free. ``incremental`` (with ``leave_running``: a save
        point): only the pages written since the process's last such checkpoint, where the kernel
        tracks them (``steps/incremental.py``; the manifest's ``memory`` says what was done). ``before_dump`` runs once the GPU is released and
        before CRIU freezes the process (a process finishing work it started before the
        checkpoint, without the GPU); if it raises, the process runs on as before.
        ``also_durable``: folders beside the image that the checkpoint needs (a kernel's offloaded
        tensors); they are flushed to disk while the driver and CRIU work. ``running_again``: see
        ``criu.images.RunningAgain``. ``before_commit`` runs once the images are written and
        verified, before the checkpoint is committed; if it raises, the checkpoint is not kept and
        the process runs again (put back from its images where the dump stopped it).

        CRIU leaves the dumped process stopped, not killed: it is stopped for good only once the
        image and ``also_durable`` are on disk, so a power loss never finds it gone and its
        checkpoint incomplete."""
        name, rec = self.resolve(target)
        d = self.store.proc_dir(name)
        with exclusive(d, name, "checkpoint"):
            self.recovery.settle_if_interrupted(name)
            rec = self.store.read_proc(name)
            pid = rec.get("pid")
            if rec.get("state") != "running" or not is_alive(pid):
                raise StateError(f"{name!r} is not running (state: {self._state(rec)}).",
                                 f"Restore it with 'gpucr restore {name}'." if rec.get("checkpoint") else "")
            lost = wait_for_pages(self.store, name)
            if lost is not None:
                self.recovery.recover_locked(name)
                raise lost
            self.release_network_locks()  # each dump adds one; the host has room for 1024
            return write_checkpoint(self, name, rec, cast(int, pid), leave_running, reason, extra or {}, progress,
                                    before_dump, list(also_durable), incremental, running_again, before_commit)

    # -- fork ----------------------------------------------------------------------------
    def fork(self, name: str, count: int = 1, names: Sequence[str] | None = None, gpu: str | int | None = "auto",
             detach: bool = True, gpu_bytes_beside: Mapping[str, int] | None = None,
             checkpoint_id: str | None = None) -> builtins.list[Running]:
        """``count`` copies of ``name`` (``names``, else NAME-fork-1...), each in its own namespaces;
        see :mod:`.forks.copies`. A running ``name`` runs on; a checkpointed one stays on disk.
        ``gpu_bytes_beside``: as for :meth:`restore`, for each copy. ``checkpoint_id``: a checkpoint
        of ``name`` the caller just took to fork from (the server's, with the tensors moved out)."""
        return fork_copies(self, name, count, names, gpu, detach, gpu_bytes_beside or {}, checkpoint_id)

    # -- restore -------------------------------------------------------------------------
    def restore(self, name: str, gpu: str | int | None = "auto", checkpoint_id: str | None = None,
                progress: Progress = no_progress, detach: bool = True,
                gpu_bytes_beside: Mapping[str, int] | None = None, files: Mapping[str, str] | None = None) -> Running:
        """Bring the process back from its latest (or the given) checkpoint onto a fitting GPU.
        ``gpu_bytes_beside``: GPU memory (by the checkpoint's GPU UUIDs) the process takes back
        itself after the driver's restore (a kernel's offloaded tensors); the GPU picked must
        have room for it too. ``files``: a fork's first restore (see ``forks/copies.py``): the path of each
        file the image had open for writing, and the fork's own copy, which the fork gets instead."""
        d = self.store.proc_dir(name)
        asked = time.perf_counter()
        with exclusive(d, name, "restore"):
            self.recovery.settle_if_interrupted(name)
            rec = self.store.read_proc(name)
            if rec.get("state") == "running" and is_alive(rec.get("pid")):
                raise StateError(f"{name!r} is already running as PID {rec['pid']}.",
                                 f"Checkpoint it first ('gpucr checkpoint {name}').")
            ckpt = self.store.get(checkpoint_id) if checkpoint_id else self.store.latest(name)
            if ckpt is None:
                raise StateError(f"{name!r} has no checkpoint.", f"Create one with 'gpucr checkpoint {name}'.")
            if files is None and rec.get("moved_from"):  # made on another node: its files are in this folder now
                files = relocated_files(ckpt.images, cast(str, rec["moved_from"]), d)
            beside = gpu_bytes_beside or {}
            t0 = time.perf_counter()
            try:
                running = restore_locked(self, name, rec, ckpt, gpu, progress, detach, beside, files=files)
            except ChangedWhileFilled:  # it forked or moved memory while it ran and was filled
                running = restore_locked(self, name, rec, ckpt, gpu, progress, detach, beside, run_while_filled=False,
                                         files=files)
                running.timings["first_attempt"] = time.perf_counter() - t0 - running.timings["total"]
            # files of its folder copied since its checkpoint (put aside in the trash): the same path,
            # another file, which IPython's history (SQLite) is told to open anew, as after a move
            copied = rec.get("copied_files") or []
            running.relocated = {**{p: p for p in copied}, **(files or {})}
            if copied:
                self.store.write_proc(name, cast(ProcRecord, {k: v for k, v in self.store.read_proc(name).items()
                                                              if k != "copied_files"}))
            # the lock and the records read before: part of what the user waits for
            running.timings["records"] = t0 - asked
            running.timings["total"] += t0 - asked
            return running

    def release_network_locks(self) -> list[str]:
        """Release the network locks of this store's checkpoints older than ``network_lock_hold``
        (their TCP peers have given up retransmitting by then); the names of the tables deleted."""
        return netlocks.release_old_network_locks(self.store, self.network_lock_hold)

    def check_compatible(self, ckpt: Checkpoint) -> None:
        """Refuse checkpoints this machine cannot restore, before touching anything."""
        check_compatible(ckpt, self.criu.path)

    # -- the optional abilities of a CheckpointBackend: this one has them all ------------------
    def cannot_fork(self) -> str | None:
        return None

    def stream_dumps_to(self, beside: BesideDump) -> bool:
        self.beside_dump = beside
        return True

    def image_problem(self, ckpt: Checkpoint) -> str | None:
        why = self.unavailable_reason()
        if why is None:
            facts = cast(dict[str, Any], ckpt.manifest)
            found = nodecompat.problems(ckpt.path, facts, self.criu.path)
            why = "; ".join(found + nodecompat.differences(facts)) if found else None
        return why

    def await_pages(self, name: str, timeout: float = PAGES_WAIT) -> None:
        """Return once no lazy restore of ``name`` is still bringing memory in (at once for an
        eager one): a dump must see the whole memory. Raises when its daemon failed: the holder
        stopped the process then, and ``name`` is recorded as suspended in the checkpoint it came
        from (intact)."""
        lost = wait_for_pages(self.store, name, timeout)
        if lost is not None:
            self.recover(name)
            raise lost

    # -- listing and removal -------------------------------------------------------------
    @staticmethod
    def _state(rec: ProcRecord) -> str:
        if rec.get("state") == "running" and not is_alive(rec.get("pid")):
            return "exited"
        return rec.get("state", "unknown")

    def status(self, name: str) -> dict[str, Any]:
        """The record, its state checked against the process table, its checkpoints, and the
        damaged ones (listed so that they never silently disappear)."""
        rec = self.store.read_proc(name)
        try:
            latest = self.store.latest(name)
        except CheckpointDamagedError:
            latest = None
        return {**rec, "state": self._state(rec), "checkpoints": [c.summary() for c in self.store.list_checkpoints(name)],
                "latest": latest.summary() if latest else None,
                "damaged": [f"{e.message} {e.hint}" for e in self.store.damaged(name)]}

    def list(self) -> list[dict[str, Any]]:
        return [self.status(n) for n in self.store.proc_names()]

    def remove(self, target: str, kill: bool = False, wait_s: float = REMOVE_WAIT) -> builtins.list[str]:
        """Remove a checkpoint id, or a name with all its checkpoints (a running one only with ``kill``).
        An operation under way on the process (an idle checkpoint) is waited for, up to ``wait_s``."""
        if not self.store.has_proc(target) and (self.store.checkpoints_root / target).exists():
            self.store.delete(target)
            return [target]
        name = target
        self.store.read_proc(name)  # no such name: NotFoundError before anything else
        d = self.store.proc_dir(name)
        with exclusive(d, name, "remove", wait_s=wait_s):
            rec = self.store.read_proc(name)  # as the operation waited for left it (checkpointed: no process)
            if self._state(rec) == "running":
                if not kill:
                    raise StateError(f"{name!r} is running as PID {rec['pid']}.",
                                     "Checkpoint it first, or pass --kill to stop it and remove everything.")
                # the namespace's init: the tree's children go with it (the root alone would leave
                # them to the init, which then lives on)
                pid = cast(int, rec["pid"])
                os.kill(namespace_init_of(pid) or pid, signal.SIGKILL)
                wait_gone(pid, 10)
            removed = self.store.checkpoint_ids(name)  # damaged ones too: the user asked for all of it
            for cid in chain.takers_first(self.store, removed):  # none copies in the pages of one going too
                self.store.delete(cid)
        self.store.remove_proc(name)
        return removed

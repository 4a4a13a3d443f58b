"""Crash recovery: make the records of a store true again after an operation whose process died.

A checkpoint or restore killed at any point (kill -9 included) leaves the user, once recovery has
run, with the running process or a complete checkpoint: a live process is resumed (GPU state put
back, stopped tasks continued, CRIU's network lock dropped) and recorded as running; a finished
dump is committed; an unfinished one is removed. The ``Checkpointer`` runs it at the start of
every operation on a name whose last operation was interrupted, and at a server's start.
"""
from __future__ import annotations

import os
import signal
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, cast

import psutil

from .criu.commands import at_work_in, drop_network_lock
from .criu.nodecompat import drop_unfinished_record
from .errors import BusyError, CheckpointDamagedError, InvalidNameError
from .gpu import cuda
from .process.identity import ProcId
from .process.launcher import HolderRecord, live_holders
from .process.procs import find_descendant_by_ns_pid, innermost_pid, is_alive, stop_for_good, tree
from .process.record import ProcRecord
from .storage.checksums import digest_tree
from .storage.locks import exclusive
from .storage.store import INTENT, MANIFEST, SAVE_POINT, Checkpoint, Manifest, Store, name_of_id, read_json, read_record

# How long recovery waits for a CRIU that an interrupted operation left running, or for another
# operation's lock on the same name.
RECOVER_WAIT = 600.0
PAGES = ".pages"  # in the process's folder: how far the holder's lazy-pages daemon is


def read_pages(store: Store, name: str) -> dict[str, Any]:
    """What the page daemon of the latest restore of ``name`` last reported ({} when none runs)."""
    return read_json(store.proc_dir(name) / PAGES) or {}


@dataclass(frozen=True)
class Recovery:
    """What recovery found for one name and what it did: ``outcome`` is "running" (the process
    runs, ``pid`` is its host PID), "suspended" (``checkpoint_id`` is complete and restorable)
    or "lost" (``message`` says why)."""

    name: str
    outcome: str
    checkpoint_id: str | None
    pid: int | None
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class CrashRecovery:
    """Recovery for the names of one store; ``keep_last`` and ``max_bytes`` are the retention a
    checkpoint it commits is subject to."""

    def __init__(self, store: Store, keep_last: int, max_bytes: int | None) -> None:
        self.store = store
        self.keep_last = keep_last
        self.max_bytes = max_bytes

    def recover_all(self, wait_s: float = RECOVER_WAIT) -> dict[str, Recovery]:
        """Recover every name of the store (see :meth:`recover`); run it at start, while nothing
        else works on the store. Names another live operation holds right now are left to it."""
        self.store.remove_leftover_deletions()
        names = set(self.store.proc_names()) | {n for n in (name_of_id(t.name) for t in self.store.tmp_dirs()) if n}
        results = {}
        for name in sorted(names):
            try:
                results[name] = self.recover(name, wait_s, lock_wait_s=0)
            except (BusyError, InvalidNameError):
                continue
        return results

    def recover(self, name: str, wait_s: float = RECOVER_WAIT, lock_wait_s: float = 10.0) -> Recovery:
        """Make the record of ``name`` true again (see the module docstring). Idempotent.
        ``wait_s`` bounds the wait for a CRIU that the interrupted operation left running;
        ``lock_wait_s`` the wait for a live operation on the same name."""
        d = self.store.proc_dir(name)
        with ExitStack() as stack:
            _lock_waiting(stack, d, name, lock_wait_s)
            self._wait_for_criu(name, wait_s)
            result = self.recover_locked(name)
        if set(os.listdir(d)) <= {".lock", ".status"}:
            self.store.remove_proc(name)  # only what recovery itself made: nothing of it remains
        return result

    def settle_if_interrupted(self, name: str) -> None:
        """Under the lock of a new operation: recover first if an earlier one was interrupted, so
        that, say, a restore never starts a second copy of a process whose restore was cut short."""
        rec = read_record(self.store.proc_dir(name))
        if (self.store.tmp_dirs(name) or rec.get("restoring")
                or (rec.get("state") == "running" and not rec.get("adopted") and not is_alive(rec.get("pid")))):
            self._wait_for_criu(name, RECOVER_WAIT)
            self.recover_locked(name)

    def recover_locked(self, name: str) -> Recovery:
        """:meth:`recover` for a caller that holds the lock of ``name`` and knows CRIU is done."""
        rec = read_record(self.store.procs_root / name)
        pid = self._find_workload(name, rec)
        held = bool(pid) and self._dumped_to_stop(name)  # dumped, stopped until its checkpoint is durable
        notes = self._resume(name, rec, pid) if pid and not held else []
        committed = []
        for tmp in self.store.tmp_dirs(name):
            ckpt, note = self._settle_tmp(tmp)
            notes.append(note)
            if ckpt:
                committed.append(ckpt.id)
        if held and committed:  # the checkpoint is complete now: finish the suspend
            stop_for_good(cast(int, pid))
            pid = None
        if committed:
            self.store.apply_retention(name, self.keep_last, self.max_bytes)
        ns_pid = _ns_pid(pid) if pid else None  # None too when it exited meanwhile (its pages were lost)
        if pid and ns_pid is not None:
            return self._record_running(name, rec, pid, ns_pid, notes)
        try:
            latest = self.store.latest(name)
        except CheckpointDamagedError as e:
            self._write_if_changed(name, rec, {**_without_op(rec), "state": "checkpointed", "pid": None})
            return Recovery(name, "suspended", None, None, " ".join([*notes, e.message, e.hint]))
        if latest:
            return self._record_suspended(name, rec, latest, committed, notes)
        return self._record_lost(name, rec, notes)

    # -- what still works on a name ------------------------------------------------------
    def _holders(self, name: str) -> list[HolderRecord]:
        """The namespace holders started for ``name`` that still run, newest first: those whose PID
        and start time were recorded when they started (see ``launcher``), never a process found
        by its command line (anyone can show a holder's arguments in ``ps``)."""
        return live_holders(self.store.proc_dir(name))

    def _find_workload(self, name: str, rec: ProcRecord) -> int | None:
        """Host PID of the live process of ``name``: the one a recorded holder runs under the
        recorded PID in its namespace, or, for an adopted process never restored, the recorded
        PID itself while it has the recorded start time."""
        ns_pids = {rec.get("ns_pid"), (rec.get("restoring") or {}).get("ns_pid")} - {None}
        for holder in self._holders(name):
            if holder.workload is not None:  # a later process under its PID is not it
                if holder.ns_pid in ns_pids and holder.workload.alive():
                    return holder.workload.pid
                continue
            for ns_pid in ns_pids:  # its launcher died before recording it
                pid = find_descendant_by_ns_pid(holder.holder.pid, cast(int, ns_pid))
                found = ProcId.of(pid) if pid else None
                if found is not None:
                    replace(holder, ns_pid=ns_pid, workload=found).write()  # for the daemon's owner checks
                    return found.pid
        pid = rec.get("pid")
        if rec.get("adopted") and is_alive(pid) and abs(psutil.Process(pid).create_time() - (rec.get("created") or 0)) < 1:
            return pid
        return None

    def _wait_for_criu(self, name: str, wait_s: float) -> None:
        """Wait while CRIU works on a checkpoint of ``name`` (a dump or restore whose caller died
        goes on) or a restore holder of it has not produced the process yet."""
        deadline = time.monotonic() + wait_s
        while True:
            busy = self._in_flight(name)
            if not busy:
                return
            if time.monotonic() > deadline:
                raise BusyError(f"{busy} for {name!r} after {wait_s:.0f} s.", "Wait for it to end, then run recovery again.")
            time.sleep(0.05)

    def _in_flight(self, name: str) -> str | None:
        """What still works on ``name``, by the records only: a recorded CRIU dump that runs, or a
        recorded restore holder that has not reported its process yet or whose page daemon is
        still bringing the memory back."""
        pids = at_work_in(self.store.tmp_dirs(name))
        if pids:
            return f"CRIU (PID {pids[0]}) is still working"
        status = self.store.proc_dir(name) / ".status"
        for holder in self._holders(name):
            if holder.mode != "restore":
                continue
            if holder.ns_pid is None and not status.exists():
                return f"A restore (holder PID {holder.holder.pid}) is still starting"
            if read_pages(self.store, name).get("pages") == "lazy":
                return f"A restore (holder PID {holder.holder.pid}) is still bringing the memory back"
        return None

    # -- putting things right ------------------------------------------------------------
    def _dumped_to_stop(self, name: str) -> bool:
        """Whether a finished dump of ``name`` was to stop the process (not --leave-running)."""
        return any(self.store.completable(t) and not (read_json(t / INTENT) or {}).get("leave_running")
                   for t in self.store.tmp_dirs(name))

    def _resume(self, name: str, rec: ProcRecord, pid: int) -> list[str]:
        """Make a live process run normally whatever point its suspend or restore reached."""
        notes = []
        for p in tree(pid):  # first, as a restore does: the driver restores a running process
            try:
                if psutil.Process(p).status() == psutil.STATUS_STOPPED:
                    os.kill(p, signal.SIGCONT)
                    notes.append(f"Continued its stopped task {p}.")
            except (psutil.Error, OSError):
                continue
        problems = cuda.put_back(tree(pid), (rec.get("restoring") or {}).get("gpu_map") or None)
        if problems:
            notes.append(f"Putting its GPU state back failed: {'; '.join(problems)}; check it with nvidia-smi.")
        restoring = (rec.get("restoring") or {}).get("checkpoint")
        image_dirs = [t / "images" for t in self.store.tmp_dirs(name)]
        image_dirs += [self.store.checkpoints_root / restoring / "images"] if restoring else []
        for images in image_dirs:
            table = drop_network_lock(images)
            if table:
                notes.append(f"Removed CRIU's network lock {table}.")
        return notes

    def _settle_tmp(self, tmp: Path) -> tuple[Checkpoint | None, str]:
        """Commit a temporary checkpoint whose dump finished; remove one whose dump did not."""
        cid = tmp.name.removeprefix(".tmp-")
        if at_work_in([tmp]):
            return None, f"Left {tmp} alone: CRIU started working in it again."
        intent = read_json(tmp / INTENT) or {}
        if intent.get("reason") == SAVE_POINT:  # its request was cut short before its files and tensors were kept
            self.store.discard(tmp)
            return None, "Removed a save point whose request was cut short (half made: the kernel runs on without it)."
        manifest = cast("Manifest | None", read_json(tmp / MANIFEST))
        if manifest is None and self.store.completable(tmp):
            files = digest_tree(tmp / "images")
            manifest = cast(Manifest, {**intent, "created": (tmp / "dump.log").stat().st_mtime,
                                       "size": sum(f["size"] for f in files.values()), "files": files, "timings": {},
                                       "recovered": True})
        if manifest is None:
            self.store.discard(tmp)
            return None, "Removed an unfinished checkpoint (its dump had not completed)."
        drop_unfinished_record(tmp)
        ckpt = self.store.commit_checkpoint(cid, tmp, manifest)
        return ckpt, f"Finished checkpoint {cid}, which an interrupted suspend had written completely."

    # -- the record ----------------------------------------------------------------------
    def _write_if_changed(self, name: str, old: ProcRecord, new: ProcRecord) -> None:
        if new != old:
            self.store.write_proc(name, new)

    def _latest_id(self, name: str) -> str | None:
        try:
            latest = self.store.latest(name)
        except CheckpointDamagedError:
            return None
        return latest.id if latest else None

    def _record_running(self, name: str, rec: ProcRecord, pid: int, ns_pid: int, notes: list[str]) -> Recovery:
        new: ProcRecord = {**_without_op(rec), "state": "running", "pid": pid, "ns_pid": ns_pid}
        restoring = rec.get("restoring")
        if restoring:
            new.update({"restored_at": time.time(), "restored_from": restoring["checkpoint"], "gpu_map": restoring.get("gpu_map") or {}})
            notes.insert(0, f"Its restore from {restoring['checkpoint']} was interrupted after the process came back.")
        elif rec.get("state") != "running" or rec.get("pid") != pid:
            notes.insert(0, "The process survived an interrupted operation.")
        self._write_if_changed(name, rec, new)
        return Recovery(name, "running", self._latest_id(name), pid, " ".join([f"{name!r} runs as PID {pid}.", *notes]))

    def _record_suspended(self, name: str, rec: ProcRecord, latest: Checkpoint, committed: list[str],
                          notes: list[str]) -> Recovery:
        new: ProcRecord = {**_without_op(rec), "state": "checkpointed", "pid": None, "checkpoint": latest.id}
        if not rec:
            new.update({"name": name, "command": latest.manifest.get("command"), "cwd": latest.manifest.get("cwd"), "uid": os.getuid()})
        new.setdefault("suspended_at", latest.created)
        if rec.get("state") == "running":
            new["suspended_at"] = latest.created
            if not committed:
                notes.append(f"The process is gone; its checkpoint {latest.id} is kept.")
        self._write_if_changed(name, rec, new)
        return Recovery(name, "suspended", latest.id, None,
                        " ".join([f"{name!r} is suspended in {latest.id}.", *notes, f"Restore it with 'gpucr restore {name}'."]))

    def _record_lost(self, name: str, rec: ProcRecord, notes: list[str]) -> Recovery:
        if rec.get("state") == "lost":
            reason = rec.get("lost_reason", "it was lost earlier")
        else:
            reason = "the process is gone and no checkpoint of it exists"
        if rec:
            self._write_if_changed(name, rec, {**_without_op(rec), "state": "lost", "pid": None,
                                               "lost_reason": reason, "lost_at": rec.get("lost_at", time.time())})
        logs = f" Its logs are kept in {self.store.procs_root / name}." if rec else ""
        return Recovery(name, "lost", None, None, " ".join([f"{name!r} is lost: {reason}.", *notes]) + logs)


def _lock_waiting(stack: ExitStack, d: Path, name: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while True:
        try:
            stack.enter_context(exclusive(d, name, "recovery"))
            return
        except BusyError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _without_op(rec: ProcRecord) -> ProcRecord:
    """The record without the operation in progress it names."""
    new = rec.copy()
    new.pop("restoring", None)
    return new


def _ns_pid(pid: int) -> int | None:
    """The PID of ``pid`` in its own namespace; None once it is gone."""
    try:
        return innermost_pid(pid)
    except OSError:
        return None

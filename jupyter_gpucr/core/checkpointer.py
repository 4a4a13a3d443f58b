"""Suspend and restore one process tree, GPU memory included; the core every front end uses.

The rule every path keeps: when an operation fails, the user has either the running process
or a complete checkpoint, never neither. Suspend puts the process back (GPU restored and
unlocked, CRIU resumes it) on any failure before the checkpoint is complete; restore keeps
the checkpoint on any failure.
"""
from __future__ import annotations

import builtins
import contextlib
import getpass
import json
import os
import platform
import re
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, Protocol, cast

import psutil

from .._version import __version__
from .criu import hugepages, nodecompat, pagefill
from .criu.commands import LAZY_LOG, LAZY_SOCKET, UNIX_NAME_TAKEN, Criu, drop_network_locks, dump_stats, explain_log
from .criu.images import read_image
from .errors import (
    AddressInUseError,
    BusyError,
    CheckpointDamagedError,
    EngineError,
    GPUCRError,
    IncompatibleCheckpointError,
    PreconditionError,
    PutBackError,
    StateError,
)
from .files import copy_data, dir_size, fsync_trees, make_private_dir, private_files
from .forks import netns
from .forks.copies import fork as fork_copies
from .forks.copies import inherit_args
from .gpu import cuda, gpus
from .objectstore.leases import node_id
from .objectstore.transfer import relocated_files
from .process.launcher import Started, start_holder
from .process.portholders import sockets_on
from .process.privileges import check_privileges
from .process.procs import find_descendant_by_ns_pid, in_own_pidns, innermost_pid, is_alive, namespace_init_of, stop_for_good, tree, tree_rss, wait_gone
from .process.record import ProcRecord
from .process.running import Running
from .recovery import PAGES, RECOVER_WAIT, CrashRecovery, Recovery, read_pages
from .storage import openfiles
from .storage.checksums import DigestWhileWriting
from .storage.locks import exclusive
from .storage.store import Checkpoint, Manifest, Store

Progress = Callable[[str, int, int], None]

# A restore reads the whole image (CRIU restored ~2 GB/s here); the wait also ends as soon as the
# holder exits, so a generous bound only matters for a hung CRIU.
RESTORE_TIMEOUT = 3600.0
#: What a restore keeps of a log that grew after a --leave-running checkpoint (see _rewind_grown_log).
KEPT_GROWTH = 64 << 20
# How long a checkpoint waits for the memory of a lazy restore of the same process to be all in.
PAGES_WAIT = 300.0
#: How long a remove waits for the operation under way on the process (an idle checkpoint, a
#: restore) to finish: about the longest a checkpoint of a large GPU process takes.
REMOVE_WAIT = 600.0
# How long a suspended process keeps CRIU's network lock: its TCP peers' packets are dropped, not
# answered with a reset, so a peer retransmits until the restore. Linux gives up retransmitting
# after about 15 min (tcp_retries2), and a host holds at most 1024 locks (criu.NETWORK_LOCKS_MAX).
NETWORK_LOCK_HOLD = 900.0
# Where a fork's own copies of its source's written files are handed to CRIU (``--inherit-fd``).
FIRST_INHERITED_FD = 200


def _no_progress(phase: str, done: int, total: int) -> None:
    pass


class RestoreCheck(Protocol):
    """Checks around every restore for someone CRIU's root must not trust (the daemon's users).
    ``approve`` reads the images before CRIU starts and refuses by raising; what it returns are
    options for ``criu restore``; ``handed``: files of the image that the holder opens itself and
    hands to CRIU (image path -> path to open); ``refused`` says why a failed restore was refused."""

    def approve(self, images: Path, workdir: Path) -> list[str]: ...

    def handed(self, images: Path, proc_dir: Path) -> dict[str, str]: ...

    def refused(self, workdir: Path) -> GPUCRError | None: ...


class Checkpointer:
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
        network_lock_hold: float | None = NETWORK_LOCK_HOLD,
        restore_check: RestoreCheck | None = None,
        open_files: openfiles.OpenFiles | None = None,
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
        self.beside_dump: Callable[[str, str, Path], AbstractContextManager[Any]] | None = None
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
                   extra: dict[str, Any] | None = None, progress: Progress = _no_progress,
                   before_dump: Callable[[], None] | None = None, also_durable: Sequence[Path] = ()) -> Checkpoint:
        """Write a verified checkpoint of the process; without ``leave_running`` it is gone
        afterwards and its GPU memory is free. ``before_dump`` runs once the GPU is released and
        before CRIU freezes the process (a process finishing work it started before the
        checkpoint, without the GPU); if it raises, the process runs on as before.
        ``also_durable``: folders beside the image that the checkpoint needs (a kernel's offloaded
        tensors); they are flushed to disk while the driver and CRIU work.

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
            lost = self._wait_for_pages(name)
            if lost is not None:
                self.recovery.recover_locked(name)
                raise lost
            self.release_network_locks()  # each dump adds one; the host has room for 1024
            return self._checkpoint_locked(name, rec, cast(int, pid), leave_running, reason, extra or {}, progress,
                                           before_dump, list(also_durable))

    def _checkpoint_locked(self, name: str, rec: ProcRecord, pid: int, leave_running: bool, reason: str,
                           extra: dict[str, Any], progress: Progress,
                           before_dump: Callable[[], None] | None, also_durable: list[Path]) -> Checkpoint:
        t0 = time.perf_counter()
        hugepages.stop(pid)  # a suspend never waits for the huge pages of the last restore
        criu = self.criu
        pids = tree(pid)
        ns_pid = innermost_pid(pid) if in_own_pidns(pid) else pid
        cuda_pids = [p for p in pids if cuda.uses_cuda(p)]
        machine_gpus = gpus.list_gpus() if cuda_pids else []
        used = gpus.gpus_of(pids, machine_gpus)
        gpu_bytes = sum(u["memory_used"] for u in used)
        estimate = tree_rss(pid) + gpu_bytes
        self._check_resources(estimate, gpu_bytes)
        kept_files = None if leave_running else self.open_files  # a source left running writes on: none kept
        if kept_files is not None:
            kept_files.check_size(pids, rec.get("cwd"))
        cuda_ns_pids = [innermost_pid(p) for p in cuda_pids]
        cid, tmp = self.store.new_checkpoint_dir(name)
        nodecompat.warm(criu.path)  # this node's cpuinfo image, kept with the checkpoint
        timings: dict[str, float] = {}
        locked: list[int] = []
        try:
            intent = self._intent(name, rec, pid, ns_pid, cuda_ns_pids, used, machine_gpus, reason, leave_running, extra)
            self.store.write_intent(tmp, intent)
            progress("gpu-checkpoint", 0, estimate)
            timings["checks"] = time.perf_counter() - t0  # what runs before the GPU is touched
            # The disk starts on what is already written while the driver and CRIU work (from this
            # process: a fsync inside the kernel had slowed the driver's checkpoint beside it 7x).
            flushing = _in_background(fsync_trees, also_durable) if also_durable else None
            for p in cuda_pids:
                cuda.lock(p, self.lock_timeout_ms)
                locked.append(p)
            for p in cuda_pids:
                cuda.checkpoint(p)
            if cuda_pids:
                timings["gpu_free"] = time.perf_counter() - t0
            if before_dump is not None:
                t1 = time.perf_counter()
                before_dump()
                timings["before_dump"] = time.perf_counter() - t1
            progress("dumping", 0, estimate)
            beside = self.beside_dump(name, cid, tmp / "images") if self.beside_dump and not leave_running \
                else contextlib.nullcontext()
            with _DirProgress(tmp / "images", estimate, progress), DigestWhileWriting(tmp / "images") as digests, beside:
                timings["dump"] = criu.dump(pid, tmp / "images", tmp, leave_running=leave_running,
                                            leave_stopped=not leave_running,
                                            keep_log=self.store.proc_dir(name) / "dump-failed.log")
            timings.update(dump_stats(tmp))
        except BaseException as e:
            problems = cuda.put_back(locked)
            self.store.discard(tmp)
            if problems:
                raise EngineError(f"{e} Putting the GPU state back also failed: {'; '.join(problems)}",
                                  "The process may be stuck; check it with nvidia-smi.") from e
            if isinstance(e, GPUCRError):  # say what became of the process, checked, not assumed
                e.message = e.message.rstrip(". ") + (". The process was left running." if is_alive(pid)
                                                      else ". The process did not survive it; its in-memory state is lost.")
            raise
        if leave_running:
            cuda.put_back(locked)
        try:
            progress("verifying", estimate, estimate)
            t1 = time.perf_counter()
            files = digests.result()
            timings["checksum"] = time.perf_counter() - t1
            if flushing is not None:
                t1 = time.perf_counter()
                flushing.result()
                timings["flush_wait"] = time.perf_counter() - t1
            if kept_files is not None:
                t1 = time.perf_counter()
                intent["open_files"] = openfiles.record(tmp / "images", tmp, kept_files, rec.get("cwd"),
                                                        self.store.proc_dir(name), node_id(self.store))
                timings["open_files"] = time.perf_counter() - t1
            timings["total"] = time.perf_counter() - t0
            host = {**intent["host"], **nodecompat.record(criu.path, tmp)}
            manifest: Manifest = {**intent, "created": time.time(), "size": sum(int(f["size"]) for f in files.values()),
                                  "files": files, "timings": timings, "host": host}
            ckpt = self.store.commit_checkpoint(cid, tmp, manifest)
        except BaseException as e:
            if leave_running:
                self.store.discard(tmp)
                raise EngineError(f"Finishing the checkpoint failed: {e}. The process kept running.") from e
            raise self._put_back_from(tmp, name, rec, cuda_ns_pids, e, pid) from e
        rec = {**rec, "checkpoint": cid}
        if not leave_running:
            stop_for_good(pid)
            rec.update({"state": "checkpointed", "pid": None, "suspended_at": time.time()})
        self.store.write_proc(name, rec)
        self.store.apply_retention(name, self.keep_last, self.max_bytes)
        progress("done", estimate, estimate)
        return ckpt

    def _check_resources(self, estimate: int, gpu_bytes: int) -> None:
        if not self.check_space:
            return
        free = self.store.free_bytes()
        if free < estimate * 1.05 + (64 << 20):
            raise PreconditionError(
                f"Not enough disk for the checkpoint: about {estimate >> 20} MiB needed, "
                f"{free >> 20} MiB free in {self.store.root}. The process was left running.",
                "Free disk space or point the store elsewhere (GPUCR_STORE / --store).")
        avail = psutil.virtual_memory().available
        if gpu_bytes and avail < gpu_bytes:
            raise PreconditionError(
                f"Not enough host memory to stage {gpu_bytes >> 20} MiB of GPU memory ({avail >> 20} MiB available). "
                "The process was left running.", "Free host memory and try again.")

    def _intent(self, name: str, rec: ProcRecord, pid: int, ns_pid: int, cuda_ns_pids: list[int], used: list[gpus.GpuUse],
                machine_gpus: list[gpus.Gpu], reason: str, leave_running: bool, extra: dict[str, Any]) -> Manifest:
        """Everything the manifest holds that is known before the dump (all but files, size, timings)."""
        return cast(Manifest, {
            **extra,
            "name": name, "started": time.time(), "reason": reason, "engine": "criu",
            "pid": pid, "ns_pid": ns_pid,
            "command": rec.get("command"), "cwd": rec.get("cwd"),
            "leave_running": leave_running,
            "criu": {"version": self.criu.version_string},
            "gpu": {
                "used": used, "all": [g.uuid for g in machine_gpus],
                "cuda_ns_pids": cuda_ns_pids,
                "driver_version": gpus.driver_version() if cuda_ns_pids else None,
                "cuda_driver_version": gpus.cuda_driver_version() if cuda_ns_pids else None,
            },
            # the boot in the intent too: a checkpoint recovery completes restores here without a CPU check
            "host": {"hostname": platform.node(), "kernel": platform.release(), "python": platform.python_version(),
                     "uid": os.getuid(), "user": getpass.getuser(), "boot_id": nodecompat.boot_id()},
            "gpucr_version": __version__,
        })

    def _put_back_from(self, tmp: Path, name: str, rec: ProcRecord, cuda_ns_pids: list[int],
                       cause: BaseException, stopped: int) -> GPUCRError:
        """The dump finished but the checkpoint could not be committed: restore from the
        temporary images (GPU state onto the same GPUs) so the process is not lost; keep the images
        if even that fails. The process CRIU left ``stopped`` cannot simply continue (its TCP
        connections stay in CRIU's repair mode), so it goes first. The error carries ``started``:
        whoever tracked the process (the server's provisioner) must adopt the restored one."""
        stop_for_good(stopped)
        try:
            started = self._spawn_restore(name, tmp / "images", tmp)
            _continue(started)  # a tree frozen for its dump (the daemon's) comes back stopped; the driver needs it running
            self._restore_gpu(started, cuda_ns_pids, {})
        except GPUCRError as e:
            return EngineError(f"Finishing the checkpoint failed ({cause}) and putting the process back failed "
                               f"too ({e.message}).", f"The complete CRIU images are kept in {tmp}.")
        self.store.write_proc(name, {**rec, "state": "running", "pid": started.pid, "ns_pid": started.ns_pid})
        self.store.discard(tmp)
        return PutBackError(f"Finishing the checkpoint failed: {cause}. The process was put back and runs again.",
                            "Free disk space in the checkpoint store, then suspend again.", started)

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
                progress: Progress = _no_progress, detach: bool = True,
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
                running = self._restore_locked(name, rec, ckpt, gpu, progress, detach, beside, files=files)
            except _ChangedWhileFilled:  # it forked or moved memory while it ran and was filled
                running = self._restore_locked(name, rec, ckpt, gpu, progress, detach, beside, run_while_filled=False,
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

    def _restore_locked(self, name: str, rec: ProcRecord, ckpt: Checkpoint, gpu: str | int | None,
                        progress: Progress, detach: bool, beside: Mapping[str, int],
                        run_while_filled: bool = True, files: Mapping[str, str] | None = None) -> Running:
        t0 = time.perf_counter()
        self.check_compatible(ckpt)
        if self.open_files is not None:  # made on another node: its scratch files back, the others checked
            openfiles.prepare(ckpt, node_id(self.store))  # (one that keeps none, the daemon's, puts none back)
        gpu_info = ckpt.manifest.get("gpu", {})
        used = gpu_info.get("used", [])
        needs = [{**u, "memory_used": u["memory_used"] + beside.get(u["uuid"], 0)} for u in used]
        gpu_map = gpus.plan_placement(needs, gpu_info.get("all", []), gpu, gpus.list_gpus()) if used else {}
        if used:
            need = sum(u["memory_used"] for u in used)
            if psutil.virtual_memory().available < need:
                raise PreconditionError(f"Not enough host memory to stage {need >> 20} MiB of GPU memory.",
                                        "Free host memory and try again. The checkpoint is kept.")
        if self.verify:
            progress("verifying", 0, ckpt.size)
            ckpt.verify("images", contents=False)  # a missing or cut-short file is refused before anything starts
        # What recovery needs if this process dies before the restored one is recorded as running;
        # written (and fsynced) before the images are read, which would make it wait behind them.
        self.store.write_proc(name, {**rec, "restoring": {"checkpoint": ckpt.id, "ns_pid": ckpt.manifest.get("ns_pid"),
                                                          "gpu_map": gpu_map, "since": time.time(), "by": os.getpid()}})
        progress("restoring", 0, ckpt.size)
        verifying = _in_background(_verify_images, ckpt, progress) if self.verify else None  # while CRIU reads them
        timings = {"checks": time.perf_counter() - t0}
        # How the memory comes back. A process without GPU state runs at once, CRIU's lazy-pages
        # daemon streaming its memory in behind (``lazy_restore``). Every other restore is handed
        # back with all of it in place: gpucr's daemon (``pagefill``) copies it in with many
        # threads, where CRIU reads it with one. An eager restore leaves the tree stopped until
        # then. A GPU process runs meanwhile, for the driver's restore, whose faults the daemon
        # serves a 4 MiB span at a time (through CRIU's daemon, page by page, that restore took
        # 11.4-11.9 s instead of 0.29 s, W2 on the H200); the restore returns once all is in.
        paged = self.criu.lazy_pages_supported
        # A fork's images are its source's, which the source's next checkpoint may delete: all of
        # its memory comes in before the restore is handed back, and CRIU works in its own folder.
        own = ckpt.name == name
        workdir = ckpt.path if own else make_private_dir(self.store.proc_dir(name) / "restore")
        lazy = not used and self.lazy_restore and paged and own
        fill = paged and not lazy
        running_while_filled = fill and run_while_filled and self._runs_while_filled(used)
        t1 = time.perf_counter()
        started: Started | None = None
        try:
            try:
                started = self._spawn_restore(name, ckpt.images, workdir, detach=detach,
                                              leave_stopped=verifying is not None or fill, lazy=lazy, fill=fill,
                                              files=files or {})
            except GPUCRError:
                if verifying is not None:
                    verifying.result()  # CRIU failed on a damaged image: say that, not what CRIU tripped over
                raise
            timings["criu_restore"] = time.perf_counter() - t1
            if fill and not running_while_filled:
                self._await_fill(name, timings, "page_fill")
            t_checked = time.perf_counter()
            if verifying is not None:
                self._continue_if_intact(started, verifying)
                timings["verify_wait"] = time.perf_counter() - t_checked
            elif fill:
                _continue(started)
            if used:
                progress("gpu-restore", 0, ckpt.size)
                t2 = time.perf_counter()
                self._restore_gpu(started, gpu_info.get("cuda_ns_pids", []), gpu_map)
                timings["gpu_restore"] = time.perf_counter() - t2
            if running_while_filled:
                self._await_fill(name, timings, "page_fill_behind")
        except BaseException as e:
            self.store.write_proc(name, rec)  # nothing runs: the record is what it was
            report = self._pages(name)
            if running_while_filled and report.get("exit") == pagefill.LAYOUT_CHANGED and started is not None:
                wait_gone(started.holder_pid, 10)  # its namespace is gone with it
                raise _ChangedWhileFilled() from e
            lost = self._pages_lost(name, report)
            if lost is not None:  # the process died of that, whatever tripped over its death
                raise lost from e
            raise
        timings["total"] = time.perf_counter() - t0
        rec = {**rec, "state": "running", "pid": started.pid, "ns_pid": started.ns_pid, "restored_at": time.time(),
               "restored_from": ckpt.id, "gpu_map": gpu_map}
        self.store.write_proc(name, rec)
        if not used:  # not yet run against a restored CUDA process (its pinned memory) on a GPU machine
            hugepages.start(tree(started.pid), after=lambda: self._wait_for_pages(name) is None)
        progress("done", ckpt.size, ckpt.size)
        return Running(name, started.pid, started.ns_pid, started, rec, timings)

    def release_network_locks(self) -> list[str]:
        """Release the network locks of this store's checkpoints older than ``network_lock_hold``
        (their TCP peers have given up retransmitting by then); the names of the tables deleted.
        A dump that stopped its process leaves its lock until the restore (``criu.commands.drop_network_locks``)."""
        if self.network_lock_hold is None:
            return []
        old = time.time() - self.network_lock_hold
        return drop_network_locks([c.images for c in self.store.list_checkpoints() if c.created < old])

    def check_compatible(self, ckpt: Checkpoint) -> None:
        """Refuse checkpoints this machine cannot restore, before touching anything."""
        m = ckpt.manifest
        if m.get("engine") != "criu":
            raise IncompatibleCheckpointError(f"Checkpoint {ckpt.id} was made by the {m.get('engine')} engine.",
                                              "Restore it through the Jupyter server, which runs that engine.")
        facts = cast(dict[str, Any], m)
        found = nodecompat.problems(ckpt.path, facts, self.criu.path)
        if found:
            raise IncompatibleCheckpointError(
                f"Checkpoint {ckpt.id} cannot run on this node: {'; '.join(found + nodecompat.differences(facts))}.",
                "Restore it on a node like the one that made it (same CPU features, NVIDIA driver and GPU model); a "
                "Jupyter server with c.GPUCR.portable_fallback restores the kernel's variables instead. The checkpoint "
                "is kept.")

    @staticmethod
    def _continue_if_intact(started: Started, verifying: Future[None]) -> None:
        """CRIU left the restored tree stopped while its images were hashed: continue it when they
        were intact; otherwise stop it for good (the whole namespace) and report the damage."""
        try:
            verifying.result()
        except BaseException:
            os.kill(started.holder_pid, signal.SIGKILL)  # unshare --kill-child takes the namespace with it
            wait_gone(started.pid, 10)
            raise
        _continue(started)

    def _spawn_restore(self, name: str, images: Path, workdir: Path, detach: bool = True,
                       leave_stopped: bool = False, lazy: bool = False, fill: bool = False,
                       files: Mapping[str, str] | None = None) -> Started:
        """Restore under a new holder. ``lazy``: the tree starts before its memory is back, CRIU's
        lazy-pages daemon (run by the holder) brings it in behind (see :meth:`await_pages`);
        ``fill``: gpucr's daemon copies it all in while the tree is left stopped. A fork (its record
        names host ports for its relay) is restored into a network namespace of its own; ``files``:
        see :meth:`restore`."""
        d = self.store.proc_dir(name)
        pidfile = d / ".restore.pid"
        argv = self.criu.page_fill_argv(images, workdir) if fill else self.criu.lazy_pages_argv(images, workdir)
        daemon = ([f"--lazy-pages={json.dumps(argv)}", f"--lazy-socket={workdir / LAZY_SOCKET}",
                   f"--pages={d / PAGES}"] if lazy or fill else [])
        check = self.restore_check
        checked = check.approve(images, workdir) if check is not None else []
        handed = {**(check.handed(images, d) if check is not None else {}), **(files or {})}
        inherit, keep = inherit_args(images, handed, FIRST_INHERITED_FD)
        routes = netns.routes_of(cast(dict[str, Any], self.store.read_proc(name)))
        addresses = netns.connected_addresses(read_image(images)) if routes is not None else []
        (d / PAGES).unlink(missing_ok=True)
        for attempt in range(2):
            pidfile.unlink(missing_ok=True)
            argv = [*self.criu.restore_argv(images, workdir, pidfile, leave_stopped, lazy or fill), *checked, *inherit]
            _, relay = netns.bind(routes) if routes is not None else ([], [])
            try:  # the holder keeps the relay's sockets; ours close either way
                started = start_holder(["restore", f"--pidfile={pidfile}", *daemon, *keep,
                                        *(netns.holder_args(routes, relay, addresses) if routes is not None else []), "--", *argv],
                                       d / ".status", detach=detach, log_path=d / "holder.log", timeout=RESTORE_TIMEOUT,
                                       pass_fds=tuple(s.fileno() for s in relay), net=routes is not None)
            finally:
                for s in relay:
                    s.close()
            if started is not None:
                return started
            refused = check.refused(workdir) if check is not None else None
            if refused is not None:
                raise refused
            failure = explain_log(workdir / "restore.log")
            if attempt == 0 and (_rewind_grown_log(failure.raw, d) or _unix_name_still_held(failure.raw)):
                continue
            holders = _port_holders(images, failure.raw)
            # an address taken is a conflict a retry resolves once its holder let it go
            error = AddressInUseError if "Address already in use" in failure.raw else EngineError
            raise error(f"CRIU could not restore {name!r}: {failure.line}"
                        + "".join(f" Port {port} ({ip}), which the process had bound, is now held by {who}." if who
                                  else f" A recent connection on port {port} is still closing (TIME_WAIT); retry in a minute."
                                  for port, ip, who, _pid in holders),
                        _port_hint(holders) or f"{failure.hint} The checkpoint is kept; you can retry.",
                        summary=_restore_summary(failure.summary, holders))
        raise AssertionError("unreachable")

    def await_pages(self, name: str, timeout: float = PAGES_WAIT) -> None:
        """Return once no lazy restore of ``name`` is still bringing memory in (at once for an
        eager one): a dump must see the whole memory. Raises when its daemon failed: the holder
        stopped the process then, and ``name`` is recorded as suspended in the checkpoint it came
        from (intact)."""
        lost = self._wait_for_pages(name, timeout)
        if lost is not None:
            self.recover(name)
            raise lost

    @staticmethod
    def _runs_while_filled(used: list[dict[str, Any]]) -> bool:
        """Whether the restored tree is continued before its memory is all in: a GPU process
        is, for the driver's restore (see ``_restore_locked``)."""
        return bool(used)

    def _await_fill(self, name: str, timings: dict[str, float], key: str) -> None:
        """Wait until the page daemon has copied every page in (``timings[key]``: how long)."""
        t0 = time.perf_counter()
        lost = self._wait_for_pages(name, RESTORE_TIMEOUT)
        if lost is not None:
            raise lost
        timings[key] = time.perf_counter() - t0

    def _wait_for_pages(self, name: str, timeout: float = PAGES_WAIT) -> EngineError | None:
        deadline = time.monotonic() + timeout
        while (report := self._pages(name)).get("pages") == "lazy":
            if time.monotonic() > deadline:
                raise BusyError(f"The memory of {name!r} is still being restored after {timeout:.0f} s.",
                                "Wait, then retry.")
            time.sleep(0.005)
        return self._pages_lost(name, report)

    def _pages(self, name: str) -> dict[str, Any]:
        return read_pages(self.store, name)

    @staticmethod
    def _pages_lost(name: str, report: dict[str, Any]) -> EngineError | None:
        if report.get("pages") != "lost":
            return None
        return EngineError(f"The restored {name!r} lost its memory before all of it was back "
                           f"({report.get('error', 'the lazy-pages daemon failed')}); it was stopped.",
                           f"Restore it again: its checkpoint is intact ('gpucr restore {name}'). The page "
                           f"daemon's log: {LAZY_LOG} in the checkpoint's folder.")

    def _restore_gpu(self, started: Started, cuda_ns_pids: list[int], gpu_map: dict[str, str]) -> None:
        host_pids = [find_descendant_by_ns_pid(started.holder_pid, p) for p in cuda_ns_pids]
        try:
            for p in host_pids:
                if p is None:
                    raise EngineError("A restored CUDA process is missing.")
                cuda.restore(p, gpu_map or None)
            for p in host_pids:
                cuda.unlock(p)  # type: ignore[arg-type]  # None was refused in the loop above
        except GPUCRError as e:
            os.kill(started.pid, signal.SIGKILL)
            e.message += " The restored process was stopped; the checkpoint is kept."
            raise

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
            for cid in removed:
                self.store.delete(cid)
        self.store.remove_proc(name)
        return removed


def _continue(started: Started) -> None:
    """Let a tree that its restore left stopped run."""
    for p in tree(started.pid):
        os.kill(p, signal.SIGCONT)


def _port_holders(images: Path, line: str) -> list[tuple[int, str, str, int | None]]:
    """For a restore that found a port of the process taken: which (port, address), by whom (in
    words, and the PID when known); root sees every process's sockets, a user's server its own.

    Any socket whose own port is one the process had counts, in any state: listening, bound only,
    connected (``portholders``). A closed connection's TIME_WAIT leftover has no process: it is
    named (``who`` "") only for a port nothing else holds. This process's own sockets are left
    out: a server holds a suspended kernel's ports with SO_REUSEPORT, beside which CRIU binds."""
    if "Address already in use" not in line:
        return []
    try:
        ports = {s.port for s in read_image(images).inet if s.port}
        holders = [h for h in sockets_on(ports) if h.pid != os.getpid()]
    except (GPUCRError, psutil.Error, OSError):
        return []
    said = set()
    closing = {}
    for h in holders:
        if h.state == "TIME_WAIT":
            closing[h.port] = h.ip
            continue
        try:
            proc = psutil.Process(h.pid) if h.pid else None
            who = f"PID {proc.pid} of {proc.username()} (uid {proc.uids().real})" if proc else "a process not visible here"
        except psutil.Error:
            who = f"PID {h.pid}"
        if h.state == "LISTEN":
            what = ""
        elif h.peer:
            what = f", in its connection to {h.peer[0]}:{h.peer[1]}"
        else:
            what = ", bound, not listening"
        said.add((h.port, h.ip, who + what, h.pid))
    taken = {h[0] for h in said}
    said |= {(port, ip, "", None) for port, ip in closing.items() if port not in taken}
    return sorted(said, key=lambda h: (h[0], h[1], h[2]))


def _port_hint(holders: list[tuple[int, str, str, int | None]]) -> str:
    """What to do about the holders :func:`_port_holders` found ("" for none)."""
    if not holders:
        return ""
    if all(not who for _port, _ip, who, _pid in holders):
        return "Retry in a minute, once the closed connection is gone. The checkpoint is kept."
    return "Stop that process, or wait until it lets the port go, then retry. The checkpoint is kept."


def _restore_summary(summary: str, holders: list[tuple[int, str, str, int | None]]) -> str:
    """A failed restore's cause in plain words: the port and its holder when a port was taken
    ("Port 43463 is used by PID 22484"), else what the CRIU log said, else that it failed."""
    if holders:
        port, _ip, who, pid = holders[0]
        more = f" (and {len(holders) - 1} more)" if len(holders) > 1 else ""
        if not who:
            return f"A recent connection on port {port} is still closing" + more
        return f"Port {port} is used by " + (f"PID {pid}" if pid else "another process") + more
    return summary or "The kernel's process could not be recreated"


class _ChangedWhileFilled(Exception):
    """A restored tree forked or moved memory while it ran and its memory was filled (which the
    page daemon does not follow): the restore is done again, the tree stopped until filled."""


def _verify_images(ckpt: Checkpoint, progress: Progress) -> None:
    """Hash the images against the manifest; once they match, the whole image has been read (what
    else the restore reads, from a cold disk, can start: see ``CriuEngine.resume``)."""
    ckpt.verify("images")
    progress("restoring", ckpt.size, ckpt.size)


def _in_background(fn: Callable[..., None], *args: Any) -> Future[None]:
    """``fn(*args)`` on a thread of its own; the future carries its outcome."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="gpucr-background")
    try:
        return pool.submit(fn, *args)
    finally:
        pool.shutdown(wait=False)


def _unix_name_still_held(line: str) -> bool:
    """A UNIX socket name the process had bound is still taken. Seen once on the H200,
    restoring right after the dumped process was killed; not understood yet (a socket whose last
    reference is in flight lingers until the kernel's unix garbage collector frees it). Wait a
    moment and say retry; a second failure is reported."""
    if not re.search(UNIX_NAME_TAKEN, line):
        return False
    time.sleep(1.0)
    return True


def _rewind_grown_log(line: str, proc_dir: Path) -> bool:
    """A log the process writes grew after a --leave-running checkpoint: keep the newer output
    beside it (what it holds past the recorded size, the newest ``KEPT_GROWTH`` bytes of it: the
    process can have grown it to any size, with holes) and cut the file back to the size CRIU
    recorded, so the restore can proceed."""
    m = re.search(r"File (\S+) has bad size (\d+) \(expect (\d+)\)", line)
    if not m:
        return False
    path = Path("/" + m.group(1).lstrip("/"))
    if path.parent != proc_dir or not path.exists():
        return False
    expect = int(m.group(3))
    if path.stat().st_size > expect:
        copy_data(path, Path(f"{path}.{time.time_ns()}"), expect, KEPT_GROWTH)
    os.truncate(path, expect)
    return True


class _DirProgress:
    """Reports bytes written into a directory while CRIU dumps into it."""

    def __init__(self, path: Path, total: int, progress: Progress) -> None:
        self.path, self.total, self.progress = path, total, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self.progress("dumping", dir_size(self.path), self.total)
            except OSError:
                pass

    def __enter__(self) -> _DirProgress:
        if self.progress is not _no_progress:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

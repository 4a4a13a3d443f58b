"""A checkpoint's dump, under the name's lock: the checks before anything is touched, the GPU
let go through the driver, CRIU writing the images while they are hashed, the manifest, and the
process stopped for good only once its checkpoint is on disk (a failure before that puts it back).
"""
from __future__ import annotations

import contextlib
import getpass
import os
import platform
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import psutil

from ..._version import __version__
from ..criu import hugepages, nodecompat
from ..criu.commands import dump_stats
from ..criu.images import RunningAgain, read_image
from ..errors import EngineError, GPUCRError, PreconditionError
from ..files import dir_size, fsync_trees
from ..gpu import cuda, gpus
from ..objectstore.leases import node_id
from ..process.procs import in_own_pidns, innermost_pid, is_alive, stop_for_good, tree, tree_rss
from ..process.record import ProcRecord
from ..storage import openfiles
from ..storage.checksums import DigestWhileWriting
from ..storage.store import Checkpoint, Manifest
from . import incremental as incremental_dumps
from .background import in_background
from .contract import CheckpointerParts, Progress, no_progress
from .putback import put_back_from


def write_checkpoint(cr: CheckpointerParts, name: str, rec: ProcRecord, pid: int, leave_running: bool, reason: str,
                     extra: dict[str, Any], progress: Progress,
                     before_dump: Callable[[], None] | None, also_durable: list[Path],
                     incremental: bool = False, running_again: RunningAgain | None = None,
                     before_commit: Callable[[], None] | None = None) -> Checkpoint:
    """Checkpoint the running ``pid`` of ``name`` (the name's lock held; see
    :meth:`~jupyter_gpucr.core.checkpointer.Checkpointer.checkpoint`)."""
    t0 = time.perf_counter()
    hugepages.stop(pid)  # a suspend never waits for the huge pages of the last restore
    criu = cr.criu
    pids = tree(pid)
    ns_pid = innermost_pid(pid) if in_own_pidns(pid) else pid
    cuda_pids = [p for p in pids if cuda.uses_cuda(p)]
    machine_gpus = gpus.list_gpus() if cuda_pids else []
    used = gpus.gpus_of(pids, machine_gpus)
    gpu_bytes = sum(u["memory_used"] for u in used)
    estimate = tree_rss(pid) + gpu_bytes
    _check_resources(cr, estimate, gpu_bytes)
    kept_files = None if leave_running else cr.open_files  # a source left running writes on: none kept
    if kept_files is not None:
        kept_files.check_size(pids, rec.get("cwd"))
    cuda_ns_pids = [innermost_pid(p) for p in cuda_pids]
    memory = incremental_dumps.plan(cr, rec, pid, incremental and leave_running)
    cid, tmp = cr.store.new_checkpoint_dir(name)
    nodecompat.warm(criu.path)  # this node's cpuinfo image, kept with the checkpoint
    timings: dict[str, float] = {}
    locked: list[int] = []
    try:
        intent = _intent(cr, name, rec, pid, ns_pid, cuda_ns_pids, used, machine_gpus, reason, leave_running,
                         {**extra, "memory": memory.record(), **({"parent": memory.parent.id} if memory.parent else {})})
        cr.store.write_intent(tmp, intent)
        progress("gpu-checkpoint", 0, estimate)
        timings["checks"] = time.perf_counter() - t0  # what runs before the GPU is touched
        # The disk starts on what is already written while the driver and CRIU work (from this
        # process: a fsync inside the kernel had slowed the driver's checkpoint beside it 7x).
        flushing = in_background(fsync_trees, also_durable) if also_durable else None
        for p in cuda_pids:
            cuda.lock(p, cr.lock_timeout_ms)
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
        beside = cr.beside_dump(name, cid, tmp / "images") if cr.beside_dump and not leave_running \
            else contextlib.nullcontext()
        with _DirProgress(tmp / "images", estimate, progress), DigestWhileWriting(tmp / "images") as digests, beside:
            timings["dump"] = criu.dump(pid, tmp / "images", tmp, leave_running=leave_running,
                                        leave_stopped=not leave_running,
                                        keep_log=cr.store.proc_dir(name) / "dump-failed.log",
                                        track_mem=memory.track, prev_images=memory.prev_images)
        timings.update(dump_stats(tmp))
    except BaseException as e:
        problems = cuda.put_back(locked)
        cr.store.discard(tmp)
        _forget_tracking(cr, name, rec, memory, pid)
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
        if leave_running and running_again is not None:
            running_again(cid, read_image(tmp / "images").files)
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
                                                    cr.store.proc_dir(name), node_id(cr.store))
            timings["open_files"] = time.perf_counter() - t1
        timings["total"] = time.perf_counter() - t0
        host = {**intent["host"], **nodecompat.record(criu.path, tmp)}
        manifest: Manifest = {**intent, "created": time.time(), "size": sum(int(f["size"]) for f in files.values()),
                              "files": files, "timings": timings, "host": host}
        if before_commit is not None:
            before_commit()
        ckpt = cr.store.commit_checkpoint(cid, tmp, manifest)
    except BaseException as e:
        if leave_running:
            cr.store.discard(tmp)
            _forget_tracking(cr, name, rec, memory, pid)
            raise EngineError(f"Finishing the checkpoint failed: {e}. The process kept running.") from e
        raise put_back_from(cr, tmp, name, rec, cuda_ns_pids, e, pid) from e
    rec = {**incremental_dumps.recorded(rec, memory, cid, pid), "checkpoint": cid}
    if not leave_running:
        stop_for_good(pid)
        rec.update({"state": "checkpointed", "pid": None, "suspended_at": time.time()})
    cr.store.write_proc(name, rec)
    cr.store.apply_retention(name, cr.keep_last, cr.max_bytes)
    progress("done", estimate, estimate)
    return ckpt


def _forget_tracking(cr: CheckpointerParts, name: str, rec: ProcRecord, memory: incremental_dumps.MemoryPlan,
                     pid: int) -> None:
    """After a dump that wrote no checkpoint: the kernel may have started tracking written pages
    anew, so the last tracked dump is no parent for the next."""
    if rec.get("memory_tracked"):
        cr.store.write_proc(name, incremental_dumps.recorded(rec, memory, None, pid))


def _check_resources(cr: CheckpointerParts, estimate: int, gpu_bytes: int) -> None:
    if not cr.check_space:
        return
    free = cr.store.free_bytes()
    if free < estimate * 1.05 + (64 << 20):
        raise PreconditionError(
            f"Not enough disk for the checkpoint: about {estimate >> 20} MiB needed, "
            f"{free >> 20} MiB free in {cr.store.root}. The process was left running.",
            "Free disk space or point the store elsewhere (GPUCR_STORE / --store).")
    avail = psutil.virtual_memory().available
    if gpu_bytes and avail < gpu_bytes:
        raise PreconditionError(
            f"Not enough host memory to stage {gpu_bytes >> 20} MiB of GPU memory ({avail >> 20} MiB available). "
            "The process was left running.", "Free host memory and try again.")


def _intent(cr: CheckpointerParts, name: str, rec: ProcRecord, pid: int, ns_pid: int, cuda_ns_pids: list[int], used: list[gpus.GpuUse],
            machine_gpus: list[gpus.Gpu], reason: str, leave_running: bool, extra: dict[str, Any]) -> Manifest:
    """Everything the manifest holds that is known before the dump (all but files, size, timings)."""
    return cast(Manifest, {
        **extra,
        "name": name, "started": time.time(), "reason": reason, "engine": "criu",
        "pid": pid, "ns_pid": ns_pid,
        "command": rec.get("command"), "cwd": rec.get("cwd"),
        "leave_running": leave_running,
        "criu": {"version": cr.criu.version_string},
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
        if self.progress is not no_progress:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

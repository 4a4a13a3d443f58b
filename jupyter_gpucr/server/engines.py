"""The two ways a server kernel goes to disk, behind one interface.

- :class:`CriuEngine`: the whole process (CRIU + the CUDA driver's checkpoint API), through a
  :class:`~jupyter_gpucr.core.backend.CheckpointBackend` (this server's own checkpointer or the
  gpucr daemon). Needs the gpucr provisioner and checkpoint privileges.
- :class:`SnapshotEngine`: the kernel saves its own namespace (``gpucr_hooks``); restoring starts
  a fresh kernel under the same id and loads it (or loads it into the kernel started when a client
  opened it, ``warm.py``). No privileges; reports what it could not keep.

The service picks one per suspend (:func:`choose_engine`) and never branches on which it got.
"""
from __future__ import annotations

import asyncio
import os
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import psutil

from ..core.backend import CheckpointBackend
from ..core.errors import EngineError, PreconditionError, PutBackError
from ..core.storage import pagecache
from ..core.storage.checksums import digest_tree
from ..core.storage.store import Checkpoint, Manifest, dir_size
from . import kernel_rpc
from .backend_choice import Backend
from .kernel_rpc import SNAPSHOT_PAYLOAD
from .loopstep import LoopStep
from .ports import HeldPorts
from .provisioner import GPUCRProvisioner
from .records import EngineName

if TYPE_CHECKING:
    from .warm import WarmStarts

Progress = Callable[[str, int, int], None]

#: The folder where a kernel's offloaded GPU tensors wait for its restore (beside its process files).
OFFLOAD_DIR = "gpu-tensors"
#: How long a snapshot suspend waits for the stopped kernel's process to be gone (it was killed by then).
EXIT_TIMEOUT_S = 60.0


@dataclass
class Resumed:
    """What a restore brought back, and what it could not."""

    timings: dict[str, float]
    lost: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


class Suspension(ABC):
    """One suspend under way, in the order the suspender awaits it: :meth:`detachable`, then (the
    server's connections to the kernel closed) :meth:`finish`; or :meth:`abandon` instead of
    ``finish`` when the kernel is to run on."""

    @abstractmethod
    async def detachable(self) -> None:
        """Return once the kernel may no longer talk to the server (what it must say is saved, its
        GPU free, it is not frozen yet); raise when the checkpoint failed before: the kernel runs."""

    @abstractmethod
    async def finish(self) -> Checkpoint:
        """The complete checkpoint; the kernel's process is stopped. On failure the kernel runs."""

    @abstractmethod
    async def abandon(self, why: BaseException) -> None:
        """The kernel runs on (detaching it failed, or the suspend was cancelled): no checkpoint is kept."""


class SuspendEngine(ABC):
    """Suspend a running kernel to a checkpoint and bring it back from one."""

    name: EngineName
    #: How the UI and messages call it.
    label: str

    def __init__(self, checkpointer: CheckpointBackend) -> None:
        self.checkpointer = checkpointer

    @abstractmethod
    def problem(self, km: Any) -> str | None:
        """Why this engine cannot suspend the kernel behind ``km``; None when it can."""

    def available_because(self) -> str:
        """What the kernel's state says when this engine was chosen because it can run."""
        return f"{self.label} available"

    @abstractmethod
    def begin(self, kernel_id: str, km: Any, reason: str, extra: dict[str, Any], progress: Progress) -> Suspension:
        """Start writing the kernel's checkpoint; the suspender takes it from there (:class:`Suspension`)."""

    @abstractmethod
    async def resume(self, kernel_id: str, km: Any, ckpt: Checkpoint, gpu: str, progress: Progress) -> Resumed:
        """Bring the kernel back from ``ckpt``; on failure the checkpoint is kept."""

    @abstractmethod
    async def settled(self, kernel_id: str) -> None:
        """Return once the restored kernel holds all of its state (a restore may hand it back
        earlier); raise if it never will: then it was stopped and its checkpoint is intact."""


class CriuEngine(SuspendEngine):
    name = "criu"
    label = "whole process"

    def __init__(self, checkpointer: CheckpointBackend, backend: Backend, ports: HeldPorts) -> None:
        super().__init__(checkpointer)
        self.backend = backend
        self.ports = ports  # the kernels' listening ports, held while they are on disk

    def available_because(self) -> str:
        if self.backend.kind == "daemon":
            return f"whole process (CRIU + CUDA driver) {self.backend.why}"
        return "whole process (CRIU + CUDA driver) available"

    def problem(self, km: Any) -> str | None:
        if self.backend.kind == "none":  # why this server launches no kernel through the gpucr provisioner
            return self.backend.why
        if not isinstance(km.provisioner, GPUCRProvisioner):
            return "the kernel was not launched by the gpucr provisioner (c.GPUCR.checkpointable_kernels)"
        return self.checkpointer.unavailable_reason()

    def begin(self, kernel_id: str, km: Any, reason: str, extra: dict[str, Any], progress: Progress) -> Suspension:
        channels = {c: getattr(km, f"{c}_port") for c in ("shell", "iopub", "stdin", "hb", "control")}
        held = self.ports.take(kernel_id, km.provisioner.kernel_pid, km.ip, channels) if km.transport == "tcp" else {}
        return _CriuSuspension(self, kernel_id, km, reason, {**extra, **held}, progress)

    async def resume(self, kernel_id: str, km: Any, ckpt: Checkpoint, gpu: str, progress: Progress) -> Resumed:
        tensors = self.checkpointer.store.proc_dir(kernel_id) / OFFLOAD_DIR
        offloaded = tensors.exists()
        stop = threading.Event()
        # From a cold disk the process's own image is read first: CRIU, the page daemon and the
        # checksums wait for it, the tensors are needed only once the driver has restored (W2 on
        # the H200: reading both at once slowed CRIU's restore from 0.3 s to 2.6-3.9 s).
        # Stopped once the restore is done; nothing waits for the reads still in flight then.
        images_read = threading.Event()
        if offloaded and not pagecache.in_memory(tensors):
            threading.Thread(target=pagecache.read_ahead, args=([tensors], stop), kwargs={"start": images_read},
                             name="gpucr-read-ahead", daemon=True).start()

        def restoring(phase: str, done: int, total: int) -> None:
            if phase == "gpu-restore" or (phase == "restoring" and 0 < total <= done):  # the image is read
                images_read.set()
            progress(phase, done, total)

        try:
            running = await asyncio.to_thread(self.checkpointer.restore, kernel_id, gpu, ckpt.id, restoring, False,
                                              _offloaded_by_gpu(ckpt, tensors) if offloaded else None)
            self.ports.hand_over(kernel_id)  # the restored kernel's own sockets are bound beside them
            km.provisioner.adopt(running.started)
            await kernel_rpc.follow_moved_history(km, running.relocated)
            if offloaded:  # a GPU kernel: restored eagerly, its memory is all there
                await self._refill(km, tensors, running.timings, progress)
        finally:
            stop.set()  # restored and refilled, or failed: nothing more is worth reading
            images_read.set()
        return Resumed(running.timings)

    async def settled(self, kernel_id: str) -> None:
        """A lazy restore's memory comes in behind the running kernel (``Checkpointer.await_pages``)."""
        await asyncio.to_thread(self.checkpointer.await_pages, kernel_id)

    async def _refill(self, km: Any, tensors: Path, timings: dict[str, float], progress: Progress) -> None:
        """Tensors the kernel moved out before the suspend go back to the GPU before any cell runs,
        from this node's folder (restored on another node, the kernel remembers the first node's);
        a kernel that cannot take them back is stopped again (its checkpoint is kept)."""
        progress("gpu-restore", 0, 0)
        t0 = time.perf_counter()
        try:
            report = await kernel_rpc.with_client(km, kernel_rpc.reload_from, tensors)
        except kernel_rpc.SnapshotError as e:
            await km.provisioner.kill()
            km.provisioner.mark_suspended()
            raise EngineError(f"The restored kernel could not take its GPU tensors back: {e}",
                              "The checkpoint is kept; free GPU memory and retry.") from e
        timings["refill"] = time.perf_counter() - t0
        # in the kernel; of which giving the storages their GPU memory back, and the staging buffers
        for key, part in (("refill_kernel", "seconds"), ("refill_alloc", "alloc_s"), ("refill_staging", "staging_s"),
                          ("refill_read_wait", "read_wait_s"), ("refill_copy_up", "copy_up_s")):
            if part in report:
                timings[key] = report[part]
        timings["total"] = timings.get("total", 0) + timings["refill"]


def _offloaded_by_gpu(ckpt: Checkpoint, tensors: Path) -> dict[str, int]:
    """The GPU memory a kernel takes back itself after the driver's restore, by GPU UUID: as its
    offload reported it, or, for a checkpoint taken without that report (a later server suspended
    a kernel an earlier one had left offloaded), the folder's size on the one GPU it used."""
    reported = (ckpt.manifest.get("offload") or {}).get("bytes_by_gpu")
    if reported:
        return {str(uuid): int(n) for uuid, n in reported.items()}
    used = ckpt.manifest.get("gpu", {}).get("used", [])
    if len(used) != 1:
        return {}
    return {used[0]["uuid"]: dir_size(tensors)}


class SnapshotEngine(SuspendEngine):
    name = "snapshot"
    label = "saved variables"

    def __init__(self, checkpointer: CheckpointBackend, warm: WarmStarts | None = None) -> None:
        super().__init__(checkpointer)
        self.warm = warm  # kernels started ahead of their restore, to load into

    def problem(self, km: Any) -> str | None:
        return None

    def begin(self, kernel_id: str, km: Any, reason: str, extra: dict[str, Any], progress: Progress) -> Suspension:
        return _SnapshotSuspension(self, kernel_id, km, {**extra, "reason": reason}, progress)

    async def _save(self, km: Any, kernel_id: str, extra: dict[str, Any]) -> Checkpoint:
        store = self.checkpointer.store
        cid, tmp = store.new_checkpoint_dir(kernel_id)
        t0 = time.perf_counter()
        try:
            report = await kernel_rpc.with_client(km, kernel_rpc.save, tmp / SNAPSHOT_PAYLOAD, timeout=3600)
            t1 = time.perf_counter()
            files = digest_tree(tmp / SNAPSHOT_PAYLOAD)
            manifest = cast(Manifest, {
                **extra, "name": kernel_id, "created": time.time(), "engine": self.name,
                "size": sum(int(f["size"]) for f in files.values()), "files": files,
                "snapshot": {"kept": report.get("kept", []), "lost": report.get("lost", []), "bytes": report.get("bytes"),
                             "devices": report.get("devices", {})},
                "gpu": {"used": [], "all": []},
                "timings": {"save": t1 - t0, "checksum": time.perf_counter() - t1, "total": time.perf_counter() - t0},
            })
            ckpt = store.commit_checkpoint(cid, tmp, manifest)
        except kernel_rpc.SnapshotError as e:
            store.discard(tmp)
            raise EngineError(f"The kernel could not save its namespace: {e}", "The kernel keeps running.") from e
        except BaseException:
            store.discard(tmp)
            raise
        store.apply_retention(kernel_id, self.checkpointer.keep_last, self.checkpointer.max_bytes)
        return ckpt

    async def settled(self, kernel_id: str) -> None:
        """A snapshot is loaded whole before its restore returns."""

    async def resume(self, kernel_id: str, km: Any, ckpt: Checkpoint, gpu: str, progress: Progress) -> Resumed:
        """Load into the kernel started when a client opened it (``warm.py``), else into a fresh one."""
        t0 = time.perf_counter()
        progress("verifying", 0, ckpt.size)
        await asyncio.to_thread(ckpt.verify, SNAPSHOT_PAYLOAD)
        progress("restoring", 0, ckpt.size)
        t1 = time.perf_counter()
        warm = self.warm is not None and await self.warm.take(kernel_id, ckpt)
        if not warm:
            if isinstance(km.provisioner, GPUCRProvisioner):
                km.provisioner.expect_launch()
            # jupyter_client keeps the first launch's arguments (cwd, env) only in this private
            # attribute (checked against jupyter_client 8.10); a fresh start must reuse them.
            await km.start_kernel(**(km._launch_args or {}))
        t2 = time.perf_counter()
        try:
            report = await kernel_rpc.with_client(km, kernel_rpc.load, ckpt.path / SNAPSHOT_PAYLOAD,
                                                  device=kernel_rpc.load_device(gpu), timeout=3600)
        except kernel_rpc.SnapshotError as e:
            await km.stop_process()
            if isinstance(km.provisioner, GPUCRProvisioner):
                km.provisioner.mark_suspended()
            raise EngineError(f"The fresh kernel could not load the saved variables: {e}",
                              "The checkpoint is kept; retry, or start a fresh kernel.") from e
        t3 = time.perf_counter()
        # kernel_start: launching the fresh kernel, or waiting for the warm one's imports still under way;
        # load: the fresh kernel's own start and imports are in it, the warm one's are done; in_kernel_*:
        # the load's own steps (modules imported, unpickling, the tensors' bytes read ahead of it)
        timings = {"verify": t1 - t0, "kernel_start": t2 - t1, "load": t3 - t2, "total": t3 - t0, "warm_start": warm,
                   **{f"in_kernel_{k}": v for k, v in report.get("timings", {}).items()}}
        return Resumed(timings, report.get("lost", []), report.get("warnings", []))


class _CriuSuspension(Suspension):
    """CRIU dumps in a thread, which stops once the GPU is free, before CRIU freezes the kernel (both
    backends stop there); the tensors the kernel wrote beside the image reach the disk while CRIU dumps."""

    def __init__(self, engine: CriuEngine, kernel_id: str, km: Any, reason: str, extra: dict[str, Any],
                 progress: Progress) -> None:
        self.engine, self.kernel_id, self.km = engine, kernel_id, km
        checkpointer = engine.checkpointer
        self.gpu_free = LoopStep()
        self.dump = asyncio.ensure_future(asyncio.to_thread(
            checkpointer.checkpoint, kernel_id, False, reason, extra, progress, self.gpu_free,
            [checkpointer.store.proc_dir(kernel_id) / OFFLOAD_DIR]))

    async def detachable(self) -> None:
        try:
            await self.gpu_free.reached(self.dump)
        except BaseException:
            self.engine.ports.release(self.kernel_id)  # the kernel runs: its own sockets hold its ports
            raise

    async def finish(self) -> Checkpoint:
        self.gpu_free.go_on()  # the server's connections are closed (their FINs went out) before the freeze
        try:
            ckpt = await self.dump
        except PutBackError as e:  # the dump finished, the commit failed: the process was restored anew
            self.km.provisioner.adopt(e.started)
            self.engine.ports.release(self.kernel_id)
            raise
        except BaseException:
            self.engine.ports.release(self.kernel_id)
            raise
        self.engine.ports.watch(self.kernel_id)
        self.km.provisioner.mark_suspended()
        await self.km.provisioner.cleanup(restart=True)
        return ckpt

    async def abandon(self, why: BaseException) -> None:
        self.gpu_free.refuse(why)
        try:
            await self.dump  # fails with ``why``: the kernel was never frozen
        except BaseException:
            pass
        finally:
            self.engine.ports.release(self.kernel_id)


class _SnapshotSuspension(Suspension):
    """The kernel saves its namespace while it runs; then its process is stopped."""

    def __init__(self, engine: SnapshotEngine, kernel_id: str, km: Any, extra: dict[str, Any],
                 progress: Progress) -> None:
        self.engine, self.kernel_id, self.km, self.extra, self.progress = engine, kernel_id, km, extra, progress
        self.ckpt: Checkpoint | None = None

    async def detachable(self) -> None:
        self.progress("dumping", 0, 0)
        self.ckpt = await self.engine._save(self.km, self.kernel_id, self.extra)  # the kernel still runs if this fails

    async def finish(self) -> Checkpoint:
        assert self.ckpt is not None, "finish() follows detachable()"
        km, ckpt = self.km, self.ckpt
        old = _processes_of(km)
        await km.stop_process()  # jupyter_client's waits are bounded: it may return before the process is gone
        await _until_gone(old, ckpt)
        if isinstance(km.provisioner, GPUCRProvisioner):
            km.provisioner.mark_suspended()
        self.engine.checkpointer.store.write_proc(self.kernel_id, {
            "name": self.kernel_id, "state": "checkpointed", "engine": self.engine.name, "checkpoint": ckpt.id,
            "pid": None, "suspended_at": time.time(), "uid": os.getuid()})
        return ckpt

    async def abandon(self, why: BaseException) -> None:
        """The saved variables stay as a checkpoint of a running kernel, as after any failed suspend."""


def _processes_of(km: Any) -> list[psutil.Process]:
    """The kernel's process and the one launched for it (the gpucr provisioner's namespace, which
    ends only once every process in it is gone), while they run."""
    found = []
    for pid in {getattr(km.provisioner, "pid", None), getattr(km.provisioner, "kernel_pid", None)} - {None}:
        try:
            found.append(psutil.Process(pid))
        except psutil.Error:
            continue
    return found


def _exists(p: psutil.Process) -> bool:
    """Whether ``p`` (not a later process under its PID) has not exited yet; a zombie has, and
    holds no memory, file or GPU any more."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


async def _until_gone(procs: list[psutil.Process], ckpt: Checkpoint, timeout: float = EXIT_TIMEOUT_S) -> None:
    """Until the stopped kernel's processes are gone: until then they may hold memory or a GPU,
    and a process started for the kernel (a restore, a warm start) would be a second one."""
    deadline = time.monotonic() + timeout
    while left := [p for p in procs if _exists(p)]:
        if time.monotonic() >= deadline:
            states = ", ".join(f"PID {p.pid} {_status(p)}" for p in left)
            raise EngineError(f"The kernel's process did not exit within {timeout:.0f} s of being stopped ({states}); "
                              "it may still hold memory or a GPU.",
                              f"Its variables are saved (checkpoint {ckpt.id}); find out what keeps the process "
                              "(ps -o stat,wchan -p PID), then suspend it again or restart the kernel.")
        await asyncio.sleep(0.05)


def _status(p: psutil.Process) -> str:
    try:
        return str(p.status())
    except psutil.Error:
        return "gone"


def choose_engine(engines: dict[str, SuspendEngine], km: Any, requested: str) -> tuple[SuspendEngine, str]:
    """The engine for a suspend and why: criu when it can run, else snapshot."""
    criu, snapshot = engines["criu"], engines["snapshot"]
    if requested == "snapshot":
        return snapshot, "requested"
    problem = criu.problem(km)
    if requested == "criu":
        if problem:
            raise PreconditionError(f"The whole-process engine cannot suspend this kernel: {problem}",
                                    "Use the snapshot engine (engine: snapshot).")
        return criu, "requested"
    if problem:
        return snapshot, f"whole-process engine unavailable: {problem}"
    return criu, criu.available_because()

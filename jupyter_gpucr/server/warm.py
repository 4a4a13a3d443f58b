"""Starting the process of a kernel the snapshot engine suspended ahead of its restore, when a
client opens it.

A snapshot restore loads the saved variables into a fresh kernel, and most of its time is that
kernel's start and its imports (PyTorch's alone takes seconds) before any byte is loaded. A client
opening a suspended kernel (its notebook is opened, a page reloads: the intent the checkpoint is read
ahead on, ``prefetch.py``) is a reason to expect the restore: the kernel's own manager starts its
process then, under its id, with its ports and connection file, and the process imports what the
snapshot needs (``gpucr_hooks.snapshot_prepare``). The restore then only loads.

Until that restore the kernel is suspended for every client: its state, its connections (which
answer from disk or wait, as before) and its execution state do not change, no restarter watches the
process and only the server talks to it. One process per kernel at most. It is stopped, and the
kernel's process record put back as its suspend left it, when the kernel was not restored within
``c.GPUCR.warm_start_timeout_s`` of being opened, when it is shut down or restarted, when host memory
(or memory of a GPU it holds a context on) is needed for another kernel (before any kernel is
suspended for it) and when the server stops. A warm start is only made where the host memory budget
has room for the restore. Where the snapshot holds CUDA tensors, the process also creates the CUDA
context of each GPU the load will use, if those GPUs have room for one now: it then holds a context
there (counted as the kernel's on that GPU), no other GPU memory.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import GPUCRError
from ..core.process.record import ProcRecord
from ..core.storage.store import Checkpoint, Store
from . import kernel_rpc
from .config import GPUCR
from .kernel_rpc import SNAPSHOT_PAYLOAD
from .kernels import Kernels
from .lifecycle import SUSPENDED, UPLOADING, KernelLifecycle
from .room import RoomMaker

#: How long a warm kernel may take to import what its snapshot needs.
PREPARE_TIMEOUT_S = 600.0


@dataclass
class _Warm:
    """A kernel's process started ahead of its restore from checkpoint ``checkpoint_id``."""

    checkpoint_id: str
    km: Any
    record: ProcRecord | None  # what its suspend left in the process record, put back when it stops
    launch: asyncio.Task[None]  # never cancelled: a process being launched is stopped once it runs
    ready: asyncio.Task[dict[str, Any]]  # the launch, then the imports: what they imported
    expiry: asyncio.TimerHandle | None = None


class WarmStarts:
    """The warm processes of one server's kernels; see the module docstring."""

    def __init__(self, config: GPUCR, log: Any, kernel_manager: Kernels, lifecycle: KernelLifecycle, store: Store,
                 room: RoomMaker, busy: Callable[[str], bool], stopping: Callable[[], bool]) -> None:
        self.options = config
        self.log = log
        self.kernel_manager = kernel_manager
        self.lifecycle = lifecycle
        self.store = store
        self.room = room
        self._busy = busy  # whether an operation on the kernel runs or waits to
        self._server_stopping = stopping
        self._warm: dict[str, _Warm] = {}
        self._stopping: dict[str, asyncio.Task[None]] = {}

    # -- a client opened a suspended kernel -------------------------------------------------
    def opened(self, kernel_id: str) -> None:
        """Start the kernel's process ahead of its restore when it is a suspended snapshot kernel
        with room for its restore; a kernel opened again while warm has its timeout start again."""
        if self.options.warm_start_timeout_s <= 0 or self._server_stopping():
            return
        warm = self._warm.get(kernel_id)
        if warm is not None:
            self._expire_later(kernel_id, warm)
            return
        ckpt = self._startable(kernel_id)
        if ckpt is None:
            return
        km = self.kernel_manager.get_kernel(kernel_id)
        try:
            record: ProcRecord | None = self.store.read_proc(kernel_id)
        except GPUCRError:
            record = None
        device = kernel_rpc.load_device(self.options.gpu_placement)  # as the restore will tell the load
        gpu = self._gpus_have_room(km, ckpt, device)
        launch = asyncio.ensure_future(km.start_warm())
        warm = _Warm(ckpt.id, km, record, launch,
                     asyncio.ensure_future(self._prepare(kernel_id, km, launch, ckpt, device, gpu)))
        self._warm[kernel_id] = warm
        self._expire_later(kernel_id, warm)

    def _startable(self, kernel_id: str) -> Checkpoint | None:
        """The checkpoint to start ``kernel_id`` warm for; None when it is not to be."""
        if kernel_id in self._stopping or self._busy(kernel_id):
            return None
        if self.lifecycle.state_of(kernel_id) not in (SUSPENDED, UPLOADING):
            return None
        try:
            ckpt = self.store.latest(kernel_id)
        except (GPUCRError, OSError):  # damaged: its restore says so
            return None
        if ckpt is None or ckpt.manifest.get("engine") != "snapshot":  # whole-process kernels restore as they are
            return None
        if not self.room.host_room_for_restore(kernel_id, ckpt):
            self.log.info("gpucr: kernel %s is not started ahead of its restore: the host memory budget has no room "
                          "for it now", kernel_id)
            return None
        return ckpt

    def _gpus_have_room(self, km: Any, ckpt: Checkpoint, device: str | None) -> bool:
        """Whether the kernel is to create its CUDA contexts ahead: its snapshot holds arrays saved on
        GPUs, and each GPU the load puts them on (``device``, else where they were saved) has room
        for a context now."""
        saved = [d for d in (ckpt.manifest.get("snapshot") or {}).get("devices", {}) if d.startswith("cuda")]
        indices = {int((device or d).partition(":")[2] or 0) for d in saved}
        return bool(indices) and self.room.gpu_room_for_context(km.kernel_spec, indices)

    async def _prepare(self, kernel_id: str, km: Any, launch: asyncio.Task[None], ckpt: Checkpoint, device: str | None,
                       gpu: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        await asyncio.shield(launch)
        report: dict[str, Any] = await kernel_rpc.with_client(km, kernel_rpc.prepare_load, ckpt.path / SNAPSHOT_PAYLOAD,
                                                              device=device, gpu=gpu, timeout=PREPARE_TIMEOUT_S)
        self.log.debug("gpucr: kernel %s was started ahead of its restore in %.2f s (a client opened it); it imported %s%s",
                      kernel_id, time.perf_counter() - t0, ", ".join(report["imported"]) or "nothing",
                      f" and readied {', '.join(report['gpus'])}" if report.get("gpus") else "")
        for failed in report["failed"]:
            self.log.warning("gpucr: kernel %s started ahead of its restore could not ready %s: %s", kernel_id,
                             failed["name"], failed["reason"])
        return report

    # -- the restore ------------------------------------------------------------------------
    async def take(self, kernel_id: str, ckpt: Checkpoint) -> bool:
        """For the restore of ``ckpt`` (under the kernel's operation): True when the kernel's warm
        process is there to load into, up with its imports done (waited for when under way), and the
        room a fresh start makes (its declared memory) is made. False when there is none: one that
        is not of this checkpoint, died or failed is stopped (as one being stopped is) before the
        restore starts a fresh one."""
        await self._until_stopped(kernel_id)
        warm = self._warm.pop(kernel_id, None)
        if warm is None:
            return False
        if warm.expiry is not None:
            warm.expiry.cancel()
        try:
            usable = await self._usable(kernel_id, warm, ckpt)
            if usable:
                async with self.room.for_start(kernel_id, warm.km.kernel_spec):
                    pass
        except BaseException:  # no room for it, or the restore was cancelled
            self._stop_later(kernel_id, warm)
            raise
        if not usable:
            await self._stop(kernel_id, warm)
        return usable

    async def _usable(self, kernel_id: str, warm: _Warm, ckpt: Checkpoint) -> bool:
        try:
            await asyncio.shield(warm.ready)
        except Exception as e:  # the restore starts a fresh kernel, which says what is wrong if it is the same
            self.log.warning("gpucr: kernel %s could not be started ahead of its restore: %s", kernel_id, e)
            return False
        # another node may have suspended it since (object storage): its newer checkpoint is restored
        return warm.checkpoint_id == ckpt.id and bool(await warm.km.is_alive())

    # -- stopping ---------------------------------------------------------------------------
    async def drop(self, kernel_id: str) -> None:
        """Stop the kernel's warm process, if any (it is shut down or restarted)."""
        await self._until_stopped(kernel_id)
        warm = self._warm.pop(kernel_id, None)
        if warm is not None:
            await self._stop(kernel_id, warm)

    async def drop_all(self, but: str | None = None, among: set[str] | None = None) -> int:
        """Stop every warm process (but ``but``'s; with ``among``, only those of these kernels):
        memory is needed, or the server stops. How many were stopped or being stopped."""
        def dropped(k: str) -> bool:
            return k != but and (among is None or k in among)

        warms = [(k, self._warm.pop(k)) for k in list(self._warm) if dropped(k)]
        stopping = [k for k in self._stopping if dropped(k)]
        await asyncio.gather(*(self._stop(k, w) for k, w in warms), *(self._until_stopped(k) for k in stopping))
        return len(warms) + len(stopping)

    def _expire_later(self, kernel_id: str, warm: _Warm) -> None:
        if warm.expiry is not None:
            warm.expiry.cancel()
        warm.expiry = asyncio.get_running_loop().call_later(self.options.warm_start_timeout_s, self._expire,
                                                              kernel_id, warm)

    def _expire(self, kernel_id: str, warm: _Warm) -> None:
        if self._warm.get(kernel_id) is not warm:
            return
        del self._warm[kernel_id]
        self.log.debug("gpucr: kernel %s was not restored within %.0f s of being opened: its process started ahead of "
                      "the restore is stopped", kernel_id, self.options.warm_start_timeout_s)
        self._stop_later(kernel_id, warm)

    def _stop_later(self, kernel_id: str, warm: _Warm) -> None:
        task = asyncio.ensure_future(self._stop(kernel_id, warm))
        self._stopping[kernel_id] = task

        def done(_task: asyncio.Task[None]) -> None:
            if self._stopping.get(kernel_id) is task:
                del self._stopping[kernel_id]

        task.add_done_callback(done)

    async def _until_stopped(self, kernel_id: str) -> None:
        task = self._stopping.get(kernel_id)
        if task is not None:
            await asyncio.wait({task})

    async def _stop(self, kernel_id: str, warm: _Warm) -> None:
        """Kill the process once its launch is over, and put the process record back."""
        if warm.expiry is not None:
            warm.expiry.cancel()
        warm.ready.cancel()  # the imports; the launch always finishes
        await asyncio.wait({warm.launch, warm.ready})
        for task in (warm.launch, warm.ready):  # retrieved: a failure is logged where it matters (take)
            if not task.cancelled():
                task.exception()
        try:
            await warm.km.stop_warm()
        except Exception as e:  # the process is gone or going; nothing else holds it
            self.log.warning("gpucr: the process of kernel %s started ahead of its restore did not stop cleanly: %s",
                             kernel_id, e)
        if warm.record is not None:
            self.store.write_proc(kernel_id, warm.record)
        self.log.debug("gpucr: kernel %s: its process started ahead of its restore is stopped", kernel_id)

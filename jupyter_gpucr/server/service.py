"""The server's suspend/resume service: moves kernels through their lifecycle.

A suspend holds the clients' messages, has the kernel prepare itself (``preparation.py``), runs
one of the engines and leaves the connections answering from disk; a resume makes room
(``room.py``), runs the engine back and reconnects. One operation per kernel runs at a time (a
shutdown waits for a running suspend). What else happens to kernels on disk has a module of its
own: the trash (``trash.py``), listing them again at start (``relist.py``), reading them ahead
and starting a snapshot kernel's process ahead when a client opens one (``prefetch.py``,
``warm.py``) and object storage (``remote.py``).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import psutil
from jupyter_core.utils import ensure_async

from ..core.backend import CheckpointBackend
from ..core.errors import EngineError, GPUCRError, NotFoundError, StateError
from ..core.gpu import gpus
from ..core.process.procs import tree
from ..core.storage.store import Checkpoint, CheckpointSummary, Store
from ..core.storage.writeback import WritebackWhileWriting
from . import labels, portable, preparation
from .config import GPUCR
from .control import ControlAnswers
from .dormant import Reply, Saved, answer
from .engines import OFFLOAD_DIR, SuspendEngine, choose_engine
from .kernels import Kernels
from .lifecycle import (
    PENDING,
    RESTORING,
    RUNNING,
    SUSPENDED,
    SUSPENDING,
    UPLOADING,
    KernelLifecycle,
    KernelState,
    failure,
)
from .loopstep import unless_lost
from .ports import HeldPorts
from .prefetch import Prefetcher
from .preparation import SavedReplies
from .records import EngineName, GpuUse
from .relist import Relister, latest
from .remote import RemoteKernels
from .room import RoomMaker
from .trash import Trash
from .unused_ahead import AheadRestores
from .warm import WarmStarts

#: How long a suspend waits for requests the kernel already received to finish.
REPLY_GRACE_S = 2.0


class KernelBusyError(StateError):
    """The kernel runs a cell: the suspend can wait for it or interrupt it (``options``)."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message, hint)
        self.options = ["idle", "interrupt"]

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "options": self.options}


#: How long the engine a running kernel's suspend would use is reused in its REST state: finding it
#: out may ask the gpucr daemon (a round trip per kernel, too many for every listing).
ENGINE_NOW_TTL = 30.0


class KernelSuspender:
    """Suspends and resumes the kernels of one server; see the module docstring."""

    def __init__(self, config: GPUCR, kernel_manager: Kernels, lifecycle: KernelLifecycle, log: Any, *,
                 checkpointer: CheckpointBackend, engines: dict[str, SuspendEngine], ports: HeldPorts,
                 saved: SavedReplies, remote: RemoteKernels | None, prefetcher: Prefetcher, trash: Trash,
                 relister: Relister, room: RoomMaker, warm: WarmStarts) -> None:
        self.options = config
        self.log = log
        self.kernel_manager = kernel_manager
        self.lifecycle = lifecycle
        self.checkpointer = checkpointer
        self.engines = engines
        self.ports = ports  # whole-process kernels' ports, while on disk
        self.saved = saved
        self.remote = remote  # object storage: kernels are uploaded after their suspend, downloaded to restore
        self.prefetcher = prefetcher
        self.trash = trash
        self.relister = relister
        self.room = room  # suspends idle kernels for one that needs their memory
        self.warm = warm  # snapshot kernels started when a client opens them, ahead of their restore
        self._locks: dict[str, asyncio.Lock] = {}
        self._resumes: dict[str, asyncio.Task[KernelState]] = {}
        #: Per running kernel: when its engine now was found out, the engine (None: none would) and why.
        self._engines_now: dict[str, tuple[float, EngineName | None, str]] = {}
        #: What becomes of a kernel on disk that the server itself shuts down: the trash with this
        #: reason (not "shutdown"), or None: not the trash (its checkpoint is being deleted).
        self._own_shutdowns: dict[str, str | None] = {}
        #: When a kernel taken out of the trash was listed again: its ``suspended_hours`` count from then.
        self._untrashed_at: dict[str, float] = {}
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._background: set[asyncio.Task[None]] = set()
        self.stopping = False  # the server stops: kernels it shuts down stay on disk, listed at the next start
        self.ahead_restores = AheadRestores(log, kernel_manager)  # restores ahead of use that no run followed

    @property
    def store(self) -> Store:
        return self.checkpointer.store

    # -- looking ---------------------------------------------------------------------------
    def kernel(self, kernel_id: str) -> Any:
        if kernel_id not in self.kernel_manager:
            raise NotFoundError(f"No kernel {kernel_id}.", "List kernels with GET /api/kernels.")
        return self.kernel_manager.get_kernel(kernel_id)

    async def state(self, kernel_id: str) -> KernelState:
        """The kernel's state as the REST API shows it, with its GPU and notebook now."""
        self.kernel(kernel_id)
        st = self.lifecycle.get(kernel_id)
        if st.state == RUNNING:
            st.gpu = self._gpu_of(kernel_id)
            st.kind = "gpu" if st.gpu else "cpu"
        st.notebook_path = await self.notebook_path(kernel_id) or st.notebook_path
        if st.checkpoint:
            st.checkpoint["notebook_path"] = st.notebook_path
        if st.state == RUNNING and st.engine is None:  # not suspended yet: the engine a suspend would use now
            engine, why = self._engine_now(kernel_id)
            return dataclasses.replace(st, engine=engine, engine_reason=why)
        return st

    def _engine_now(self, kernel_id: str) -> tuple[EngineName | None, str]:
        """The engine a suspend of the running kernel would use now, and why (None: a suspend would
        fail, and why); found out at most every ``ENGINE_NOW_TTL`` seconds per kernel."""
        known = self._engines_now.get(kernel_id)
        if known and time.monotonic() - known[0] < ENGINE_NOW_TTL:
            return known[1], known[2]
        try:
            engine, why = choose_engine(self.engines, self.kernel(kernel_id), self.options.engine)
            name: EngineName | None = engine.name
        except GPUCRError as e:
            name, why = None, f"a suspend would fail: {e.message}"
        self._engines_now[kernel_id] = (time.monotonic(), name, why)
        return name, why

    async def notebook_path(self, kernel_id: str) -> str | None:
        sessions = await self.kernel_manager.sessions_of(kernel_id)
        return sessions[0]["path"] if sessions else None

    async def _display_name(self, kernel_id: str) -> str:
        path = await self.notebook_path(kernel_id)
        return f"“{os.path.basename(path)}”" if path else "The kernel"

    async def checkpoint_summary(self, ckpt: Checkpoint) -> CheckpointSummary:
        """A checkpoint as the REST API shows it: the notebook path is the kernel's session
        path now, not at suspend time (the notebook may have been renamed since)."""
        summary = ckpt.summary()
        if ckpt.name in self.kernel_manager:
            summary["notebook_path"] = await self.notebook_path(ckpt.name) or summary["notebook_path"]
        return summary

    def saved_for(self, kernel_id: str) -> Saved:
        """What the kernel said at suspend time, for a dormant connection to answer from."""
        return self.saved.of(kernel_id)

    def _gpu_of(self, kernel_id: str) -> GpuUse | None:
        pid = getattr(self.kernel_manager.get_kernel(kernel_id).provisioner, "kernel_pid", None)
        if not pid or not gpus.nvml_ready():
            return None
        try:
            used = gpus.gpus_of(tree(pid))
        except (psutil.Error, OSError, GPUCRError):
            return None
        return used[0] if used else None

    @contextlib.asynccontextmanager
    async def operation(self, kernel_id: str) -> AsyncIterator[None]:
        """One suspend, restore, shutdown or restart of a kernel at a time."""
        lock = self._locks.setdefault(kernel_id, asyncio.Lock())
        async with lock:
            yield

    def busy(self, kernel_id: str) -> bool:
        """Whether an operation on the kernel runs or waits to (a restore asked for included)."""
        lock = self._locks.get(kernel_id)
        return kernel_id in self._resumes or bool(lock and lock.locked())

    # -- suspend -------------------------------------------------------------------------
    async def suspend_idle_kernels(self) -> None:
        """Suspend every running kernel idle for longer than its timeout (the kernelspec's
        ``gpucr_idle_timeout``, else ``c.GPUCR.idle_timeout``); called every ``idle_check_interval``."""
        km = self.kernel_manager
        for kernel_id in list(km.list_kernel_ids()):
            if self.lifecycle.state_of(kernel_id) != RUNNING:
                continue
            timeout = km.get_kernel(kernel_id).kernel_spec.metadata.get("gpucr_idle_timeout", self.options.idle_timeout)
            if km.is_idle(kernel_id, timeout, self.options.suspend_busy, self.options.suspend_connected):
                try:
                    await self.suspend(kernel_id, reason="idle")
                except GPUCRError as e:
                    self.log.warning("gpucr: idle kernel %s not suspended: %s", kernel_id, e)

    async def expire_suspended_kernels(self) -> None:
        """Shut down every kernel suspended for longer than ``c.GPUCR.suspended_hours``: its saved
        state goes to the trash (reason "expired"), from where ``trash_hours`` later deletes it."""
        limit = self.options.suspended_hours * 3600
        if limit <= 0:
            return
        now = time.time()
        for kernel_id in list(self.kernel_manager.list_kernel_ids()):
            st = self.lifecycle.get(kernel_id)
            since = max(st.suspended_at or now, self._untrashed_at.get(kernel_id, 0.0))
            if st.state != SUSPENDED or now - since < limit or self.busy(kernel_id):
                continue
            self.log.info("gpucr: kernel %s was suspended for more than %g h: shutting it down, its state to the trash",
                          kernel_id, self.options.suspended_hours)
            self._own_shutdowns[kernel_id] = "expired"
            try:
                await self.kernel_manager.shutdown_kernel(kernel_id)
            except Exception as e:  # the next check tries again
                self.log.warning("gpucr: expired kernel %s was not shut down: %s", kernel_id, e)
            finally:
                self._own_shutdowns.pop(kernel_id, None)

    async def check_kernels(self) -> None:
        """The periodic check (every ``idle_check_interval``): idle kernels to disk, expired ones to the trash."""
        if self.options.idle_timeout > 0:
            await self.suspend_idle_kernels()
        await self.expire_suspended_kernels()

    async def suspend(self, kernel_id: str, reason: str = "manual", engine: str | None = None,
                      when: str = "now") -> KernelState:
        """Suspend now, when the running cell finishes (``idle``), or after interrupting it."""
        self.kernel(kernel_id)
        if when == "idle":
            return await self._pend(kernel_id, reason, engine)
        if when == "interrupt":
            await self._interrupt(kernel_id)
        async with self.operation(kernel_id):
            return await self.suspend_now(kernel_id, reason, engine)

    async def suspend_now(self, kernel_id: str, reason: str, engine_name: str | None) -> KernelState:
        """The suspend, top to bottom; the caller holds the kernel's :meth:`operation`. The clients'
        messages wait from the start; the kernel prepares itself (saved replies, trim, GPU tensors
        out), the engine writes the checkpoint and says when the kernel may be let go, the server's
        connections to it close, the engine finishes, and the connections answer from disk. On any
        failure the kernel runs on, reconnected, and says why."""
        km = await self._suspendable(kernel_id)
        self.ahead_restores.leaving(kernel_id)
        engine, why = choose_engine(self.engines, km, engine_name or self.options.engine)
        if self.remote:  # a store that does not answer leaves the kernel running
            await self.remote.check()
        self.lifecycle.transition(kernel_id, SUSPENDING, "trimming", error=None, hint=None, engine=engine.name,
                                  engine_reason=why)
        offload_to = self.store.proc_dir(kernel_id) / OFFLOAD_DIR if engine.name == "criu" else None
        execution_state = km.execution_state  # its own, before the trim's requests: reported while it is on disk
        self.kernel_manager.hold_messages(kernel_id)
        detached = False
        try:
            async with preparation.tensors_back_on_failure(self.store, kernel_id, km, self.log):
                if await self.kernel_manager.wait_for_replies(kernel_id, REPLY_GRACE_S):
                    raise await self._busy_error(kernel_id)
                carried = None
                if engine.name == "criu" and self.options.portable_fallback:  # before its tensors leave the GPU
                    self._progress(kernel_id)("saving-variables", 0, 0)
                    carried = await portable.save(km, self.store, kernel_id)
                with WritebackWhileWriting(offload_to) if offload_to else contextlib.nullcontext():  # the disk starts at once
                    saved, trim = await preparation.prepare(km, self.options, self.log, engine.name == "criu", offload_to,
                                                            preparation.save_point_tensors(self.store, kernel_id))
                if not await km.is_alive():
                    raise StateError(f"{await self._display_name(kernel_id)} exited while it was being suspended.",
                                     "Restart the kernel.")
                self.saved.keep(kernel_id, saved)
                record = preparation.kernel_record(kernel_id, km, saved, await self.kernel_manager.sessions_of(kernel_id))
                extra = {"kernel": record, "engine_reason": why,
                         "offload": (trim or {}).get("offload"), "portable": carried}
                suspension = engine.begin(kernel_id, km, reason, extra, self._progress(kernel_id))
                try:
                    await suspension.detachable()
                    await self.kernel_manager.detach_kernel(kernel_id, execution_state)
                    detached = True
                except BaseException as e:
                    await suspension.abandon(e)
                    raise
                ckpt = await suspension.finish()
                st = self.lifecycle.transition(  # before the connections settle: they answer from disk
                    kernel_id, UPLOADING if self.remote else SUSPENDED, "uploading" if self.remote else "done",
                    suspended_at=time.time(), checkpoint=ckpt.summary(), gpu=None,
                    kind=ckpt.kind, lost=ckpt.manifest.get("snapshot", {}).get("lost", []), trim=trim,
                    timings=ckpt.manifest.get("timings", {}), warnings=[])
        except BaseException as e:
            if detached:
                await self.kernel_manager.reattach_kernel(kernel_id, wake=False)
            self.kernel_manager.back_after_failed_suspend(kernel_id)
            err = e if isinstance(e, GPUCRError) else EngineError(f"The suspend failed: {e}", "The kernel keeps running.")
            self.log.warning("gpucr: suspending kernel %s failed: %s %s", kernel_id, err.message, err.hint)
            self.lifecycle.transition(kernel_id, RUNNING, "failed", **failure(err))
            raise err from (None if err is e else e)
        self.kernel_manager.settle_connections(kernel_id)
        self.ahead_restores.left(kernel_id, "suspended again")
        self.log.debug("gpucr: suspended kernel %s with %s (%s, %d MiB in %.2f s)", kernel_id, engine.name, reason,
                       ckpt.size >> 20, st.timings.get("total", 0))
        if self.remote:
            self.remote.upload_later(kernel_id, ckpt)
        return st

    async def _suspendable(self, kernel_id: str) -> Any:
        """The kernel's manager, once the kernel is running and idle; else why it cannot be suspended."""
        km = self.kernel(kernel_id)
        st = self.lifecycle.get(kernel_id)
        st.notebook_path = await self.notebook_path(kernel_id) or st.notebook_path  # events name it as it is now
        if st.state not in (RUNNING, PENDING):
            raise StateError(f"{await self._display_name(kernel_id)} is already {st.state}.",
                             "It is on disk already." if st.state == SUSPENDED else "Wait until it is running again.")
        if km.execution_state == "dead" or not await km.is_alive():
            raise StateError(f"{await self._display_name(kernel_id)} is not running (its process has exited).",
                             "Restart the kernel.")
        if await self.busy_after(km, 1.0):
            raise await self._busy_error(kernel_id)
        return km

    async def busy_after(self, km: Any, seconds: float) -> bool:
        """Whether the kernel is still busy after ``seconds`` (a completion request passes)."""
        deadline = time.monotonic() + seconds
        while km.execution_state == "busy" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return bool(km.execution_state == "busy")

    async def _busy_error(self, kernel_id: str) -> KernelBusyError:
        return KernelBusyError(f"{await self._display_name(kernel_id)} is running a cell.",
                               "Suspend it when the cell finishes, or interrupt the cell and suspend.")

    async def _interrupt(self, kernel_id: str) -> None:
        km = self.kernel(kernel_id)
        if km.execution_state != "busy":
            return
        await ensure_async(self.kernel_manager.interrupt_kernel(kernel_id))
        if await self.busy_after(km, 10.0):
            raise KernelBusyError(f"{await self._display_name(kernel_id)} kept running after the interrupt.",
                                  "Suspend it when the cell finishes, or restart the kernel.")

    async def _pend(self, kernel_id: str, reason: str, engine: str | None) -> KernelState:
        """Suspend when the running cell finishes: state ``suspend-pending`` until then."""
        state = self.lifecycle.state_of(kernel_id)
        if state == PENDING:
            return self.lifecycle.get(kernel_id)
        st = self.lifecycle.transition(kernel_id, PENDING, "pending", pending_since=time.time(), error=None, hint=None)
        self._pending[kernel_id] = asyncio.ensure_future(self._suspend_when_idle(kernel_id, reason, engine))
        return st

    async def _suspend_when_idle(self, kernel_id: str, reason: str, engine: str | None) -> None:
        try:
            km = self.kernel(kernel_id)
            while km.execution_state == "busy":
                await asyncio.sleep(0.1)
            async with self.operation(kernel_id):
                self._pending.pop(kernel_id, None)
                if self.lifecycle.state_of(kernel_id) == PENDING:
                    await self.suspend_now(kernel_id, reason, engine)
        except GPUCRError as e:
            self.log.warning("gpucr: the pending suspend of kernel %s failed: %s", kernel_id, e)
        finally:
            self._pending.pop(kernel_id, None)

    def cancel_pending(self, kernel_id: str) -> KernelState | None:
        """Drop a suspend that waits for the cell; the kernel just keeps running."""
        task = self._pending.pop(kernel_id, None)
        if task is not None:
            task.cancel()
        if self.lifecycle.state_of(kernel_id) != PENDING:
            return None
        return self.lifecycle.transition(kernel_id, RUNNING, "cancelled")

    # -- what the kernel manager asks (``kernels.KernelHooks``) ---------------------------------
    def room_for_start(self, kernel_id: str, kernel_spec: Any) -> contextlib.AbstractAsyncContextManager[None]:
        """Room for a starting kernel's declared memory, held while it starts (``room.py``)."""
        return self.room.for_start(kernel_id, kernel_spec)

    def started(self, kernel_id: str, km: Any, label: str | None) -> None:
        """A kernel started: write down what a later server lists it again from, and its label."""
        self.remember(kernel_id, km)
        if label:  # not listed by the mapping manager yet
            labels.save(self.store, kernel_id, label)
            self.lifecycle.set_label(kernel_id, label)

    def remember(self, kernel_id: str, km: Any) -> None:
        """A kernel started (or was forked): what a later server lists it again from (``preparation.remember``)."""
        preparation.remember(self.store, kernel_id, km)

    def restarting(self, kernel_id: str) -> None:
        """The process room was made for is gone; the start that follows makes room again."""
        self.room.forget(kernel_id)
        self.ahead_restores.left(kernel_id, "restarted")

    def set_label(self, kernel_id: str, label: Any) -> None:
        """Label the kernel (see :mod:`.labels`), for this server and the next."""
        self.kernel(kernel_id)
        labels.save(self.store, kernel_id, labels.check(label))
        self.lifecycle.set_label(kernel_id, label)

    def _progress(self, kernel_id: str) -> Any:
        loop = asyncio.get_running_loop()

        def report(phase: str, done: int, total: int) -> None:
            loop.call_soon_threadsafe(self.lifecycle.progress, kernel_id, phase, done, total)

        return report

    # -- resume --------------------------------------------------------------------------
    def resume_ahead(self, kernel_id: str, gpu: str | None = None) -> KernelState:
        """A client is about to use a suspended kernel (its user types into a cell; an agent is about
        to send code): start its restore in the background, so that its request runs at once or
        sooner; a request that comes meanwhile waits for this restore. The state now."""
        self.kernel(kernel_id)
        if self.lifecycle.state_of(kernel_id) in (SUSPENDED, UPLOADING) and kernel_id not in self._resumes:
            self._in_background(self._resume_ahead(kernel_id, gpu))
        return self.lifecycle.get(kernel_id)

    async def _resume_ahead(self, kernel_id: str, gpu: str | None) -> None:
        try:
            with self.ahead_restores.restoring(kernel_id):
                await self.resume(kernel_id, gpu, ahead=True)
        except GPUCRError as e:  # the kernel stays on disk, its failure in its state as for any restore
            self.log.warning("gpucr: kernel %s, restored ahead of use, was not restored: %s", kernel_id, e)

    async def resume(self, kernel_id: str, gpu: str | None = None, ahead: bool = False) -> KernelState:
        """Restore a suspended kernel; concurrent callers share one restore. ``ahead``: asked for
        ahead of use (see :meth:`resume_ahead`), which the state says while it runs."""
        self.kernel(kernel_id)
        state = self.lifecycle.state_of(kernel_id)
        if state == PENDING:
            return self.cancel_pending(kernel_id) or self.lifecycle.get(kernel_id)
        if state == SUSPENDING:
            raise StateError(f"{await self._display_name(kernel_id)} is being suspended.", "Resume it once that finished.")
        task = self._resumes.get(kernel_id)
        if task is None:
            if state == RUNNING:
                return self.lifecycle.get(kernel_id)
            task = asyncio.ensure_future(self._resume(kernel_id, gpu or self.options.gpu_placement, ahead))
            self._resumes[kernel_id] = task
            task.add_done_callback(lambda _t: self._resumes.pop(kernel_id, None))
        return await asyncio.shield(task)

    async def _resume(self, kernel_id: str, gpu: str, ahead: bool = False) -> KernelState:
        asked = time.perf_counter()
        async with self.operation(kernel_id):
            km = self.kernel(kernel_id)
            st = self.lifecycle.get(kernel_id)
            if st.state not in (SUSPENDED, UPLOADING):
                return st
            suspended_at = st.suspended_at or time.time()
            st.notebook_path = await self.notebook_path(kernel_id) or st.notebook_path
            self.lifecycle.transition(kernel_id, RESTORING, "restoring", error=None, hint=None, ahead=ahead)
            took_over = None
            try:
                if self.remote:  # claimed for this node, downloaded if another node made it
                    took_over = await self.remote.fetch(kernel_id, self._progress(kernel_id))
                ckpt = latest(self.store, kernel_id)
                engine = self.engines[ckpt.manifest.get("engine", "criu")]
                instead = await asyncio.to_thread(portable.instead, self.checkpointer, ckpt)
                if instead is not None:  # the image cannot run on this node: its saved variables can
                    ckpt, fell_back = instead
                    engine = self.engines["snapshot"]
                    self.ports.release(kernel_id)  # a fresh kernel binds them
                    self.log.warning("gpucr: kernel %s is restored from its saved variables: %s", kernel_id, fell_back)
                async with self.room.for_restore(kernel_id, ckpt, gpu) as target:
                    started = time.perf_counter()
                    resumed = await engine.resume(kernel_id, km, ckpt, target, self._progress(kernel_id))
                    returned = time.perf_counter()
                if instead is not None:
                    resumed.warnings.insert(0, portable.what_was_lost(fell_back, ckpt))
                if took_over:
                    resumed.warnings.insert(0, took_over)
            except BaseException as e:
                err = e if isinstance(e, GPUCRError) else EngineError(f"The restore failed: {e}", "The checkpoint is kept; try again.")
                if self.remote:
                    err = await self.remote.damaged_in_store(kernel_id, err)
                self.log.warning("gpucr: restoring kernel %s failed: %s %s", kernel_id, err.message, err.hint)
                self.lifecycle.transition(kernel_id, SUSPENDED, "failed", **failure(err))
                if self.remote:
                    await self.remote.give_back(kernel_id)
                raise err from (None if err is e else e)
            # The restore may hand the kernel back before all its memory is in (engine.settled);
            # if the rest never comes it was stopped, possibly while the connections wait for it.
            settled = asyncio.ensure_future(engine.settled(kernel_id))
            try:
                await unless_lost(settled, self.kernel_manager.reattach_kernel(kernel_id))
            except BaseException as e:
                if settled.done() and settled.exception() is e:
                    await self._back_to_suspended(kernel_id, e)
                else:
                    settled.cancel()  # nobody waits for it any more
                raise
            now = time.time()
            gpu_now = self._gpu_of(kernel_id)
            # the server's own share of the wait, beside the engine's steps: before the restore
            # started (the lock, the checkpoint's records) and after it (reconnecting the channels)
            timings = {**resumed.timings, "server_before": started - asked, "server_after": time.perf_counter() - returned,
                       # the engine's own time outside the steps it reports (thread hand-offs, its set-up)
                       "engine_other": returned - started - resumed.timings.get("total", 0.0)}
            st = self.lifecycle.transition(
                kernel_id, RUNNING, "done", restored_at=now, suspended_for=now - suspended_at, lost=resumed.lost,
                warnings=resumed.warnings, timings=timings, gpu=gpu_now, kind="gpu" if gpu_now else ckpt.kind,
                engine=engine.name, engine_reason=ckpt.manifest.get("engine_reason"))
            self.log.debug("gpucr: restored kernel %s in %.2f s", kernel_id, resumed.timings.get("total", 0))
            if not settled.done():
                self._in_background(self._until_settled(kernel_id, settled))
            return st

    def connected_while_on_disk(self, kernel_id: str) -> None:
        """A client connected to a suspended kernel's shell or stdin port (by its
        connection file: ``jupyter console --existing``): restore it; the request it sends is
        answered once the kernel is back (see ``ports.py``)."""
        if kernel_id in self.kernel_manager and self.lifecycle.state_of(kernel_id) == SUSPENDED:
            self._in_background(self._wake_for_connection(kernel_id))

    def control_answers(self, kernel_id: str) -> ControlAnswers | None:
        """How the server answers a suspended kernel's control requests (a monitor's usage
        requests; see ``control.py``): signed with the kernel's session key, from what it saved."""
        if kernel_id not in self.kernel_manager:
            return None
        session = self.kernel_manager.get_kernel(kernel_id).session
        restore_on = set(self.options.restore_on)

        def on_control(msg_type: str, content: dict[str, Any]) -> Reply | None:
            return answer(msg_type, "control", content, self.saved_for(kernel_id), restore_on)

        return ControlAnswers(session.key, session.signature_scheme, on_control)

    async def _wake_for_connection(self, kernel_id: str) -> None:
        try:
            await self.resume(kernel_id)
        except GPUCRError as e:  # the kernel stays on disk, its failure shown where the UI shows failures
            self.log.warning("gpucr: kernel %s, asked for through its ports, was not restored: %s", kernel_id, e)

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` without waiting for it; the task is kept referenced until it ends."""
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _until_settled(self, kernel_id: str, settled: asyncio.Future[None]) -> None:
        try:
            await settled
        except Exception as e:  # not a cancellation (the server stopping)
            async with self.operation(kernel_id):  # not if it was shut down or suspended meanwhile
                if kernel_id in self.kernel_manager and self.lifecycle.state_of(kernel_id) == RUNNING:
                    await self._back_to_suspended(kernel_id, e)

    async def _back_to_suspended(self, kernel_id: str, err: BaseException) -> None:
        """The restored kernel was stopped for memory that never came back (see
        ``Checkpointer.await_pages``): take the connections off it as a suspend does and show it
        suspended, with why, in its intact checkpoint; the next request restores it again."""
        e = err if isinstance(err, GPUCRError) else EngineError(f"The restored kernel failed: {err}", "Restore it again.")
        self.log.error("gpucr: kernel %s: %s %s", kernel_id, e.message, e.hint)
        km = self.kernel(kernel_id)
        self.kernel_manager.hold_messages(kernel_id)
        await self.kernel_manager.detach_kernel(kernel_id, "idle")
        await km.provisioner.kill()
        km.provisioner.mark_suspended()
        self.ports.hold_anew(kernel_id, latest(self.store, kernel_id))
        if self.lifecycle.state_of(kernel_id) == RUNNING:  # already handed back: through suspending
            self.lifecycle.transition(kernel_id, SUSPENDING, "failed", **failure(e))
        self.lifecycle.transition(kernel_id, SUSPENDED, "failed", **failure(e))
        self.kernel_manager.settle_connections(kernel_id)

    def prefetch(self, kernel_id: str) -> None:
        """A client opened a suspended kernel: read its checkpoint ahead (see ``prefetch.py``), and
        start a snapshot kernel's process ahead of its restore (``warm.py``)."""
        self.prefetcher.opened(kernel_id)
        self.warm.opened(kernel_id)

    # -- shutdown, restart and the trash -----------------------------------------------------
    async def shelve(self, kernel_id: str, reason: str) -> None:
        """The user shut down or restarted a kernel that is on disk: keep its checkpoint in
        the trash (not when the server stops: then it stays listed for the next start)."""
        await self.warm.drop(kernel_id)
        st = self.lifecycle.get(kernel_id)
        path = await self.notebook_path(kernel_id) or st.notebook_path
        self._forget(kernel_id)
        fate = self._own_shutdowns.get(kernel_id, reason)
        if not self.stopping and fate is not None:
            self.trash.shelve(kernel_id, fate, path, st.restored_at)

    def discard(self, kernel_id: str) -> None:
        """A running kernel was shut down: its checkpoints are stale, and hold its memory."""
        self._forget(kernel_id)
        self._locks.pop(kernel_id, None)
        if not self.stopping:
            self.trash.discard(kernel_id)

    def _forget(self, kernel_id: str) -> None:
        """What this server kept in memory of a kernel that is gone."""
        self.lifecycle.forget(kernel_id)
        self._engines_now.pop(kernel_id, None)
        self.saved.forget(kernel_id)
        self.prefetcher.forget(kernel_id)
        self.room.forget(kernel_id)
        self.ahead_restores.left(kernel_id, "shut down")
        self.ports.release(kernel_id)
        self._untrashed_at.pop(kernel_id, None)

    async def restore_from_trash(self, trash_id: str, replace: bool = False, sessions: bool = True) -> KernelState:
        """List a trashed kernel again, suspended, under its old id (see ``Trash.take_out`` for
        ``replace``). ``sessions``: give the kernel its notebook sessions back; a client that
        connects the notebook it has open itself says False, or that notebook would get a second
        session."""
        item = next((t for t in self.store.list_trash() if t["id"] == trash_id), {})
        kernel_id = str(item.get("kernel_id") or "")
        if replace and item.get("reason") == "goback" and kernel_id in self.kernel_manager and \
                self.lifecycle.state_of(kernel_id) == RUNNING:
            # the state a kernel left when it went back to a save point, restored in place of the kernel
            # it went back to: that one is suspended first, so it goes to the trash in turn (and no
            # connection of its killed process lingers on the addresses the restored one takes back)
            await self.suspend(kernel_id, reason="goback")
        name = await self.trash.take_out(trash_id, replace)
        self._untrashed_at[name] = time.time()
        return await self.relister.list_on_disk(name, latest(self.store, name), sessions=sessions)

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Delete a checkpoint; the last one of a suspended kernel is that kernel, so deleting
        it shuts the kernel down for good (the UI asks first)."""
        ckpt = self.store.get(checkpoint_id)
        kernel_id = ckpt.name
        if kernel_id in self.kernel_manager and self.lifecycle.is_on_disk(kernel_id):
            latest = self.store.latest(kernel_id)
            if latest is not None and latest.id == checkpoint_id:
                if self.lifecycle.state_of(kernel_id) == RESTORING:
                    raise StateError(f"Kernel {kernel_id} is being restored from this checkpoint.", "Try again later.")
                self._own_shutdowns[kernel_id] = None  # not to the trash: deleting is the point
                try:
                    await self.kernel_manager.shutdown_kernel(kernel_id)
                finally:
                    self._own_shutdowns.pop(kernel_id, None)
                self.checkpointer.remove(kernel_id, kill=False)
                if self.remote:  # else another node would list it again from the store
                    self.remote.forget_later(kernel_id)
                return
        self.store.delete(checkpoint_id)

    # -- server start and stop -----------------------------------------------------------
    async def relist_at_start(self) -> None:
        """List the kernels an earlier server left on disk or running (see ``relist.py``)."""
        await self.relister.relist_at_start()

    async def suspend_all(self, reason: str = "server-stop") -> dict[str, str]:
        """Suspend every running kernel within the stop budget (uploads included); return failures by kernel id."""
        deadline = time.monotonic() + self.options.stop_budget
        for kernel_id in list(self._pending):
            self.cancel_pending(kernel_id)
        running = [k for k in self.kernel_manager.list_kernel_ids() if self.lifecycle.state_of(k) == RUNNING]
        failures: dict[str, str] = {}
        sem = asyncio.Semaphore(2)

        async def one(kernel_id: str) -> None:
            async with sem:
                try:
                    await self.suspend(kernel_id, reason=reason)
                except GPUCRError as e:
                    failures[kernel_id] = str(e)

        tasks = {k: asyncio.ensure_future(one(k)) for k in running}
        if tasks:
            _done, pending = await asyncio.wait(tasks.values(), timeout=self.options.stop_budget)
            for k, t in tasks.items():
                if t in pending:
                    failures[k] = f"not finished within the stop budget of {self.options.stop_budget:.0f} s"
        if self.remote:
            await self.remote.wait_uploads(deadline - time.monotonic())
        return failures


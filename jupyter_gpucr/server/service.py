"""The server's suspend/resume service: one kernel at a time through its lifecycle
``running -> suspending -> suspended -> restoring -> running``.

It owns the per-kernel state the REST API and UI show, closes and reopens the server's own
ZeroMQ connections around the engine, asks the kernel to trim itself first, records what a
later server needs to list the kernel again (connection info, sessions, kernel_info), and
emits every state change and progress step on jupyter_server's event bus.
"""
from __future__ import annotations

import asyncio
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jupyter_events import EventLogger

from ..core import gpus
from ..core.checkpointer import Checkpointer
from ..core.privileges import check_privileges
from . import kernel_rpc
from ..core.procs import tree
from .provisioner import GPUCRProvisioner
from .config import GPUCR
from ..core.errors import GPUCRError, NotFoundError, PreconditionError, StateError
from .snapshot_engine import PAYLOAD as SNAPSHOT_PAYLOAD, KernelSnapshots
from ..core.store import Checkpoint, Store

if TYPE_CHECKING:
    from .kernelmanager import GPUCRMappingKernelManager

EVENT_SCHEMA_ID = "https://events.jupyter.org/jupyter_gpucr/kernel-state/v1"
EVENT_SCHEMA = Path(__file__).parent / "events" / "kernel-state.yaml"


@dataclass
class KernelState:
    """What the REST API reports for one kernel."""

    kernel_id: str
    state: str = "running"
    engine: str | None = None
    checkpoint: dict[str, Any] | None = None
    gpu: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None
    engine_reason: str | None = None
    lost: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    suspended_at: float | None = None
    error: str | None = None
    hint: str | None = None
    trim: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class KernelSuspender:
    """Suspends and resumes kernels of one server; see the module docstring."""

    def __init__(self, config: GPUCR, kernel_manager: "GPUCRMappingKernelManager", event_logger: EventLogger | None,
                 log: Any) -> None:
        self.config = config
        self.kernel_manager = kernel_manager
        self.event_logger = event_logger
        self.log = log
        self.checkpointer = Checkpointer(
            Store(config.store or None), criu_path=config.criu_path or None, keep_last=config.keep_last,
            max_bytes=config.max_store_bytes or None, lock_timeout_ms=config.lock_timeout_ms)
        self.snapshots = KernelSnapshots(self.checkpointer.store, config.keep_last, config.max_store_bytes or None)
        self.states: dict[str, KernelState] = {}
        self._kernel_infos: dict[str, dict[str, Any]] = {}
        self._resumes: dict[str, asyncio.Task] = {}
        self._busy: set[str] = set()
        self.stopping = False
        if event_logger is not None and EVENT_SCHEMA_ID not in event_logger.schemas.schema_ids:
            event_logger.register_event_schema(EVENT_SCHEMA)

    # -- state ---------------------------------------------------------------------------
    def state(self, kernel_id: str) -> KernelState:
        if kernel_id not in self.kernel_manager:
            raise NotFoundError(f"No kernel {kernel_id}.", "List kernels with GET /api/kernels.")
        st = self.states.setdefault(kernel_id, KernelState(kernel_id))
        if st.state == "running":
            st.gpu = self._gpu_of(kernel_id)
        return st

    def kernel_info_of(self, kernel_id: str) -> dict[str, Any] | None:
        """The kernel_info reply cached at suspend time, answered while the kernel is on disk."""
        return self._kernel_infos.get(kernel_id)

    def is_suspended(self, kernel_id: str) -> bool:
        st = self.states.get(kernel_id)
        return st is not None and st.state in ("suspended", "restoring")

    def _gpu_of(self, kernel_id: str) -> dict[str, Any] | None:
        pid = getattr(self.kernel_manager.get_kernel(kernel_id).provisioner, "kernel_pid", None)
        if not pid or not gpus.nvml_ready():
            return None
        try:
            used = gpus.gpus_of(tree(pid))
        except Exception:
            return None
        return used[0] if used else None

    def _emit(self, st: KernelState, phase: str, done: int = 0, total: int = 0) -> None:
        st.progress = {"phase": phase, "bytes_done": done, "bytes_total": total}
        if self.event_logger is None:
            return
        self.event_logger.emit(schema_id=EVENT_SCHEMA_ID, data={
            "kernel_id": st.kernel_id, "state": st.state, "phase": phase, "bytes_done": int(done),
            "bytes_total": int(total), "error": st.error or ""})

    def _progress_callback(self, st: KernelState):
        loop = asyncio.get_running_loop()

        def report(phase: str, done: int, total: int) -> None:
            loop.call_soon_threadsafe(self._emit, st, phase, done, total)

        return report

    # -- suspend -------------------------------------------------------------------------
    async def suspend(self, kernel_id: str, reason: str = "manual", engine: str | None = None) -> KernelState:
        st = self.state(kernel_id)
        km = self.kernel_manager.get_kernel(kernel_id)
        if kernel_id in self._busy or st.state != "running":
            raise StateError(f"Kernel {kernel_id} is {st.state if st.state != 'running' else 'busy with another operation'}.",
                             "Wait until it is running again." if st.state != "suspended" else "It is already on disk.")
        for _ in range(10):  # let a momentary busy (a completion request) pass
            if km.execution_state != "busy":
                break
            await asyncio.sleep(0.1)
        if km.execution_state == "busy" and reason == "manual":
            raise StateError(f"Kernel {kernel_id} is busy running code.",
                             "Wait for the cell to finish or interrupt it, then suspend.")
        engine, why = self.choose_engine(km, engine or self.config.engine)
        execution_state = km.execution_state
        self._busy.add(kernel_id)
        st.state, st.error, st.hint = "suspending", None, None
        try:
            self._emit(st, "trimming")
            kernel_info, st.trim = await self._prepare_kernel(km, trim=engine == "criu")
            if kernel_info:
                self._kernel_infos[kernel_id] = kernel_info
            extra = {"kernel": await self._kernel_record(kernel_id, km, kernel_info), "reason": reason,
                     "engine_reason": why}
            if engine == "criu":
                ckpt = await self._suspend_criu(kernel_id, km, reason, extra, st, execution_state)
            else:
                ckpt = await self._suspend_snapshot(kernel_id, km, extra, st, execution_state)
        except GPUCRError as e:
            st.state, st.error, st.hint = "running", e.message, e.hint
            self._emit(st, "failed")
            raise
        finally:
            self._busy.discard(kernel_id)
        st.state, st.engine, st.engine_reason, st.suspended_at = "suspended", engine, why, time.time()
        st.checkpoint, st.gpu = ckpt.summary(), None
        st.lost = ckpt.manifest.get("snapshot", {}).get("lost", [])
        st.timings = ckpt.manifest.get("timings", {})
        self._emit(st, "done", ckpt.size, ckpt.size)
        self.log.info("gpucr: suspended kernel %s with %s (%s, %d MiB in %.2f s)", kernel_id, engine, reason,
                      ckpt.size >> 20, st.timings.get("total", 0))
        return st

    def choose_engine(self, km: Any, requested: str) -> tuple[str, str]:
        """Pick the engine for a suspend and say why: criu when it can run, else snapshot."""
        problem = self._criu_problem(km)
        if requested == "snapshot":
            return "snapshot", "requested"
        if requested == "criu":
            if problem:
                raise PreconditionError(f"The criu engine cannot suspend this kernel: {problem}",
                                        "Use the snapshot engine (engine: snapshot).")
            return "criu", "requested"
        if problem:
            return "snapshot", f"criu unavailable: {problem}"
        return "criu", "whole process (CRIU + CUDA driver) available"

    def _criu_problem(self, km: Any) -> str | None:
        if not isinstance(km.provisioner, GPUCRProvisioner):
            return "the kernel was not launched by the gpucr provisioner (c.GPUCR.checkpointable_kernels)"
        try:
            self.checkpointer.criu
        except GPUCRError as e:
            return e.message
        if os.geteuid() != 0:
            check = check_privileges()
            if not check.ok:
                return f"no checkpoint privileges ({check.detail})"
        return None

    async def _suspend_criu(self, kernel_id: str, km: Any, reason: str, extra: dict[str, Any],
                            st: KernelState, execution_state: str) -> Checkpoint:
        await self.kernel_manager.detach_kernel(kernel_id, execution_state)
        try:
            ckpt = await asyncio.to_thread(self.checkpointer.checkpoint, kernel_id, False, reason, extra,
                                           self._progress_callback(st))
        except BaseException:
            await self.kernel_manager.reattach_kernel(kernel_id)
            raise
        km.provisioner.mark_suspended()
        await km.provisioner.cleanup(restart=True)
        return ckpt

    async def _suspend_snapshot(self, kernel_id: str, km: Any, extra: dict[str, Any], st: KernelState,
                                execution_state: str) -> Checkpoint:
        self._emit(st, "dumping")
        ckpt = await self.snapshots.save(km, kernel_id, extra)  # the kernel still runs if this fails
        await self.kernel_manager.detach_kernel(kernel_id, execution_state)
        await km.shutdown_kernel(now=False, restart=True)
        if hasattr(km.provisioner, "mark_suspended"):
            km.provisioner.mark_suspended()
        self.checkpointer.store.write_proc(kernel_id, {
            "name": kernel_id, "state": "checkpointed", "engine": "snapshot", "checkpoint": ckpt.id, "pid": None,
            "suspended_at": time.time(), "uid": os.getuid()})
        return ckpt

    async def _prepare_kernel(self, km: Any, trim: bool) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
        """Ask the kernel for its kernel_info (served from cache while it is suspended) and to
        trim itself; neither may block a suspend, so failures only log."""
        client = km.client()
        client.start_channels()
        info = report = None
        try:
            reply = await client.kernel_info(reply=True, timeout=10)
            info = reply["content"]
            if trim and self.config.trim_before_suspend:
                report = await kernel_rpc.prepare_suspend(client, timeout=60)
        except Exception as e:
            self.log.warning("gpucr: kernel did not trim before suspend: %s", e)
        finally:
            client.stop_channels()
        return info, report

    async def _kernel_record(self, kernel_id: str, km: Any, kernel_info: dict[str, Any] | None) -> dict[str, Any]:
        sessions = await self.kernel_manager.sessions_of(kernel_id)
        return {
            "kernel_id": kernel_id, "kernel_name": km.kernel_name, "connection_info": _jsonable(km.get_connection_info()),
            "kernel_info": kernel_info, "sessions": sessions, "cwd": str(getattr(km.provisioner, "cwd", "") or ""),
            "notebook_path": sessions[0]["path"] if sessions else None,
            "last_activity": km.last_activity.isoformat() if getattr(km, "last_activity", None) else None,
        }

    # -- resume --------------------------------------------------------------------------
    async def resume(self, kernel_id: str, gpu: str | None = None) -> KernelState:
        """Restore a suspended kernel; concurrent callers share one restore."""
        st = self.state(kernel_id)
        if st.state == "running" and kernel_id not in self._resumes:
            return st
        if st.state == "suspending":
            raise StateError(f"Kernel {kernel_id} is being suspended.", "Resume it once that finished.")
        task = self._resumes.get(kernel_id)
        if task is None:
            task = asyncio.ensure_future(self._resume(kernel_id, gpu or self.config.gpu_placement))
            self._resumes[kernel_id] = task
            task.add_done_callback(lambda _t: self._resumes.pop(kernel_id, None))
        return await asyncio.shield(task)

    async def _resume(self, kernel_id: str, gpu: str) -> KernelState:
        st = self.state(kernel_id)
        km = self.kernel_manager.get_kernel(kernel_id)
        st.state, st.error, st.hint = "restoring", None, None
        self._emit(st, "restoring")
        ckpt = self.checkpointer.store.latest(kernel_id)
        try:
            if ckpt is None:
                raise StateError(f"Kernel {kernel_id} has no checkpoint left.", "Shut it down and start a new kernel.")
            if ckpt.manifest.get("engine") == "snapshot":
                timings = await self._resume_snapshot(kernel_id, km, ckpt, gpu, st)
            else:
                timings = await self._resume_criu(kernel_id, km, gpu, st)
        except GPUCRError as e:
            st.state, st.error, st.hint = "suspended", e.message, e.hint
            self._emit(st, "failed")
            raise
        st.gpu = self._gpu_of(kernel_id)
        # Before any client's queued cell runs, so the notice lands in that very cell.
        await self._notify_kernel(km, st.suspended_at, st.gpu, st.engine or "criu", st.lost)
        await self.kernel_manager.reattach_kernel(kernel_id)
        st.state, st.suspended_at, st.timings = "running", None, timings
        self._emit(st, "done")
        self.log.info("gpucr: restored kernel %s in %.2f s", kernel_id, timings.get("total", 0))
        return st

    async def _resume_criu(self, kernel_id: str, km: Any, gpu: str, st: KernelState) -> dict[str, float]:
        running = await asyncio.to_thread(self.checkpointer.restore, kernel_id, gpu, None,
                                          self._progress_callback(st), False)
        km.provisioner.adopt(running.started)
        return running.timings

    async def _resume_snapshot(self, kernel_id: str, km: Any, ckpt: Checkpoint, gpu: str,
                               st: KernelState) -> dict[str, float]:
        t0 = time.perf_counter()
        await asyncio.to_thread(ckpt.verify, SNAPSHOT_PAYLOAD)
        if hasattr(km.provisioner, "suspended"):
            km.provisioner.suspended = False
        await km.start_kernel(**(km._launch_args or {}))
        device = f"cuda:{gpu}" if str(gpu).isdigit() else None
        try:
            report = await self.snapshots.load(km, ckpt, device)
        except GPUCRError:
            await km.shutdown_kernel(now=True, restart=True)
            if hasattr(km.provisioner, "mark_suspended"):
                km.provisioner.mark_suspended()
            raise
        st.lost = report.get("lost", [])
        st.warnings = report.get("warnings", [])
        return {"total": time.perf_counter() - t0}

    async def _notify_kernel(self, km: Any, suspended_at: float | None, gpu: dict[str, Any] | None, engine: str,
                             lost: list[dict[str, Any]]) -> None:
        client = km.client()
        client.start_channels()
        try:
            await kernel_rpc.notify_restored(client, {"suspended_at": suspended_at, "gpu": gpu, "engine": engine, "lost": lost},
                                           timeout=10)
        except Exception as e:
            self.log.debug("gpucr: restored kernel was not notified: %s", e)
        finally:
            client.stop_channels()

    # -- server start and stop -----------------------------------------------------------
    def mark_adopted(self, kernel_id: str, ckpt: Checkpoint, suspended_at: float | None) -> None:
        """A kernel an earlier server suspended is listed again by this one."""
        m = ckpt.manifest
        if m["kernel"].get("kernel_info"):
            self._kernel_infos[kernel_id] = m["kernel"]["kernel_info"]
        self.states[kernel_id] = KernelState(
            kernel_id, state="suspended", engine=m.get("engine"), engine_reason=m.get("engine_reason"),
            checkpoint=ckpt.summary(), suspended_at=suspended_at, lost=m.get("snapshot", {}).get("lost", []))

    async def suspend_all(self, reason: str = "server-stop") -> dict[str, str]:
        """Suspend every running kernel within the stop budget; return failures by kernel id."""
        running = [k for k in list(self.kernel_manager.list_kernel_ids())
                   if self.states.get(k, KernelState(k)).state == "running"]
        failures: dict[str, str] = {}

        async def one(kernel_id: str) -> None:
            try:
                await self.suspend(kernel_id, reason=reason)
            except GPUCRError as e:
                failures[kernel_id] = str(e)

        sem = asyncio.Semaphore(2)

        async def limited(kernel_id: str) -> None:
            async with sem:
                await one(kernel_id)

        tasks = [asyncio.ensure_future(limited(k)) for k in running]
        if tasks:
            done, pending = await asyncio.wait(tasks, timeout=self.config.stop_budget)
            for k, t in zip(running, tasks):
                if t in pending:
                    failures[k] = f"not finished within the stop budget of {self.config.stop_budget:.0f} s"
        return failures

    async def with_current_path(self, summary: dict[str, Any]) -> dict[str, Any]:
        """A checkpoint summary as the REST API shows it: the notebook path is the kernel's
        session path now, not at suspend time (the notebook may have been renamed since)."""
        kernel_id = summary.get("kernel_id")
        if kernel_id and kernel_id in self.kernel_manager:
            sessions = await self.kernel_manager.sessions_of(kernel_id)
            if sessions:
                summary["notebook_path"] = sessions[0]["path"]
        return summary

    async def delete_checkpoint(self, checkpoint_id: str) -> None:
        """Delete a checkpoint; the last one of a suspended kernel is that kernel, so deleting
        it shuts the kernel down (the UI asks first)."""
        store = self.checkpointer.store
        ckpt = store.get(checkpoint_id)
        kernel_id = ckpt.name
        latest = store.latest(kernel_id)
        if self.is_suspended(kernel_id) and latest is not None and latest.id == checkpoint_id:
            if self.states[kernel_id].state == "restoring":
                raise StateError(f"Kernel {kernel_id} is being restored from this checkpoint.", "Try again later.")
            await self.kernel_manager.shutdown_kernel(kernel_id)
            return
        store.delete(checkpoint_id)
        if kernel_id in self.states and self.states[kernel_id].checkpoint and \
                self.states[kernel_id].checkpoint.get("id") == checkpoint_id:
            self.states[kernel_id].checkpoint = None

    def kernels_by_pid(self) -> dict[int, str]:
        """Host PIDs of running kernels' process trees, for GPU listings."""
        out: dict[int, str] = {}
        for kernel_id in self.kernel_manager.list_kernel_ids():
            pid = getattr(self.kernel_manager.get_kernel(kernel_id).provisioner, "kernel_pid", None)
            if pid:
                try:
                    out.update({p: kernel_id for p in tree(pid)})
                except Exception:
                    pass
        return out

    def forget(self, kernel_id: str, delete_checkpoints: bool) -> None:
        """The kernel was shut down (or restarted fresh) by the user."""
        self.states.pop(kernel_id, None)
        self._kernel_infos.pop(kernel_id, None)
        if delete_checkpoints:
            try:
                self.checkpointer.remove(kernel_id, kill=False)
            except GPUCRError:
                pass


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in info.items()}

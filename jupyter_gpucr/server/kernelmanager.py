"""Kernel managers that keep suspended kernels listed and manageable.

A suspended kernel keeps its id, its entry in ``/api/kernels`` and its sessions. Interrupting it
does nothing; shutting it down or restarting it moves its checkpoint to the trash first (kept
``trash_hours``), so nothing is lost silently. Culling suspends instead of shutting down.

The mapping manager owns the kernels' :class:`~.lifecycle.KernelLifecycle` and builds gpucr's
:class:`~.runtime.GPUCRRuntime` (once per server), keeps each kernel's process and its open
websocket connections, and holds, detaches, reattaches and wakes them when the suspender says so.
The kernels ask the suspender only through :class:`~.kernels.KernelHooks`.
"""
from __future__ import annotations

import asyncio
import contextlib
import datetime
import inspect
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import psutil
from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_core.utils import ensure_async
from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager, ServerKernelManager
from traitlets import Instance, default, observe

from ..core.errors import GPUCRError
from ..core.process.procs import tcp_connections_to, tree
from . import labels
from .config import GPUCR
from .kernels import KernelHooks
from .lifecycle import RUNNING, KernelLifecycle
from .provisioner import GPUCRProvisioner
from .runtime import GPUCRRuntime

PROVISIONER = "gpucr-provisioner"
#: Requests of monitors, never the user's activity: jupyter-resource-usage's kernel panel sends a
#: usage request every few seconds, and the kernel's busy/idle for it would keep it from ever
#: being idle (suspended, or culled).
MONITORING = frozenset({"usage_request", "usage_reply"})


def unseen(method: Callable[..., Any]) -> Callable[..., Any]:
    """jupyter_client's start or shutdown of a kernel's process without its ``in_pending_state``,
    which makes the kernel's ``ready`` a new future, pending until the method ends. A process started
    ahead of a restore is none of the kernel's business: jupyter_client's shutdown reads the outcome
    of ``ready`` at once (a kernel shut down during that launch got a 500), and its websockets wait for
    it. The unwrapped function takes the kernel manager as its first argument."""
    return inspect.unwrap(method)


class Connection(Protocol):
    """What a suspend needs of a websocket connection (:class:`.websocket.GPUCRWebsocketConnection`)."""

    in_flight: int

    def hold(self) -> None: ...
    def sleep(self) -> None: ...
    def settle(self) -> None: ...
    def cancel_queued(self) -> int: ...
    async def wake(self) -> None: ...


class GPUCRKernelManager(ServerKernelManager):
    """One kernel; asks the suspender first when the kernel is on disk or being moved."""

    @property
    def hooks(self) -> KernelHooks:
        return self.parent.runtime.suspender

    @observe("execution_state")
    def _cell_ended(self, change: Any) -> None:
        """Kernels grow in cells: the host memory budget and the room kept free on this kernel's GPUs
        are checked as one ends (``pressure.py``)."""
        if change["old"] == "busy" and change["new"] == "idle":
            self.parent.runtime.growth.cell_ended(self.kernel_id)

    async def start_kernel(self, *args: Any, **kwargs: Any) -> None:
        label = labels.given_at_start(kwargs.get("env"), self.kernel_spec.metadata if self.kernel_spec else {})
        kernel_id = kwargs.get("kernel_id") or self.kernel_id or "a new kernel"  # set by the start itself
        async with self.hooks.room_for_start(kernel_id, self.kernel_spec):  # room for its declared memory
            await super().start_kernel(*args, **kwargs)
        self.hooks.started(self.kernel_id, self, label)

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        async with self.hooks.operation(self.kernel_id):
            if self.parent.lifecycle.is_on_disk(self.kernel_id):
                await self.hooks.shelve(self.kernel_id, "restart" if restart else "shutdown")
                self.provisioner.forget_suspended()
                await self._async_cleanup_resources(restart=restart)
                return
            self.hooks.cancel_pending(self.kernel_id)
            await super().shutdown_kernel(now=now, restart=restart)
            if restart:  # the process room was made for is gone; the start that follows makes room again
                self.hooks.restarting(self.kernel_id)
            else:
                self.hooks.discard(self.kernel_id)

    async def stop_process(self) -> None:
        """Stop the kernel process as the snapshot engine needs it, inside a suspend or restore
        that already holds the kernel's operation (the user-facing shutdown would wait for it)."""
        await super().shutdown_kernel(now=False, restart=True)

    async def start_warm(self) -> None:
        """Start the process of this suspended kernel ahead of its restore (:mod:`.warm`): the start a
        snapshot restore makes, with the first launch's arguments, its id, ports and connection file,
        but unseen: no kernel event, no room made (a warm start is made only where there is room) and
        no restarter, which would restart a warm process that died as if the kernel had."""
        if isinstance(self.provisioner, GPUCRProvisioner):
            self.provisioner.expect_launch()  # as for a restore's start: the process to come is the kernel
        await unseen(super(ServerKernelManager, self).start_kernel)(self, **(self._launch_args or {}))
        self.stop_restarter()

    async def stop_warm(self) -> None:
        """Kill a process :meth:`start_warm` started (it holds nothing of the user's yet): the kernel
        is on disk again as its suspend left it."""
        await unseen(super(ServerKernelManager, self).shutdown_kernel)(self, now=True, restart=True)
        if isinstance(self.provisioner, GPUCRProvisioner):
            self.provisioner.mark_suspended()

    async def interrupt_kernel(self) -> None:
        if not self.parent.lifecycle.is_on_disk(self.kernel_id):
            await super().interrupt_kernel()
        else:  # what waits for its restore is cancelled; the restore goes on
            self.parent.cancel_queued(self.kernel_id)

    async def restart_kernel(self, now: bool = False, newports: bool = False, **kw: Any) -> None:
        async with self.hooks.operation(self.kernel_id):
            on_disk = self.parent.lifecycle.is_on_disk(self.kernel_id)
            if on_disk:  # the user asked for a fresh kernel
                await self.hooks.shelve(self.kernel_id, "restart")
                self.provisioner.forget_suspended()
            else:
                self.hooks.cancel_pending(self.kernel_id)
        await super().restart_kernel(now=now, newports=newports, **kw)
        # The idle clock restarts with the kernel. jupyter_server leaves it where the old kernel's
        # last activity put it (a restart's own messages are no activity to it), and it watches
        # the activity only of kernels it started: one that was on disk was unwatched at suspend.
        if on_disk:
            self.parent.start_watching_activity(self.kernel_id)
        self.last_activity = utcnow()


class GPUCRMappingKernelManager(AsyncMappingKernelManager):
    """The server's kernel manager with gpucr's lifecycle, suspender and connection registry."""

    lifecycle = Instance(KernelLifecycle)
    runtime = Instance(GPUCRRuntime)

    @default("kernel_manager_class")
    def _default_kernel_manager_class(self) -> str:
        return "jupyter_gpucr.server.kernelmanager.GPUCRKernelManager"

    @default("lifecycle")
    def _default_lifecycle(self) -> KernelLifecycle:
        return KernelLifecycle(parent=self, event_logger=getattr(self.parent, "event_logger", None))

    @default("runtime")
    def _default_runtime(self) -> GPUCRRuntime:
        """gpucr's parts, built once for this server (the composition root, ``runtime.py``)."""
        return GPUCRRuntime.build(GPUCR(parent=self.parent), self, self.lifecycle, self.log)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._connections: dict[str, set[Connection]] = {}
        self._background: set[asyncio.Task[None]] = set()

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        model = super().kernel_model(kernel_id)
        st = self.lifecycle.get(kernel_id)
        model["gpucr"] = {"state": st.state, "kind": st.kind, "suspended_at": st.suspended_at,
                          "size": st.checkpoint["size"] if st.checkpoint else None}
        return model

    # -- websocket connections -------------------------------------------------------------
    def register_connection(self, kernel_id: str, conn: Connection) -> None:
        self._connections.setdefault(kernel_id, set()).add(conn)

    def unregister_connection(self, kernel_id: str, conn: Connection) -> None:
        self._connections.get(kernel_id, set()).discard(conn)

    def connections_of(self, kernel_id: str) -> list[Connection]:
        return list(self._connections.get(kernel_id, ()))

    def hold_messages(self, kernel_id: str) -> None:
        for conn in self.connections_of(kernel_id):
            conn.hold()

    async def wait_for_replies(self, kernel_id: str, timeout: float) -> int:
        """Wait until the kernel finished every request clients sent it; the number left."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = sum(c.in_flight for c in self.connections_of(kernel_id))
            if not left or asyncio.get_running_loop().time() >= deadline:
                return left
            await asyncio.sleep(0.02)

    # -- around a suspend: the suspender decides, these do ---------------------------------
    def back_after_failed_suspend(self, kernel_id: str) -> None:
        """The suspend failed and the kernel runs: its connections wake in the background (one to a
        kernel that died meanwhile would hold the error up until the websocket gives up on it, while
        the restarter takes over). A kernel detached before is reattached first (:meth:`reattach_kernel`)."""
        self._in_background(self.wake_connections(kernel_id))

    def _in_background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._background.add(task)  # referenced until it ends
        task.add_done_callback(self._background.discard)

    async def detach_kernel(self, kernel_id: str, execution_state: str) -> None:
        """Close every ZeroMQ connection the server holds to the kernel, so the image holds
        no connection to this server; open websockets stay open, dormant.

        ``execution_state`` is the state to report meanwhile: the kernel's own, from before the
        server's trim request, whose closing ``idle`` the closed activity stream may miss."""
        km = self.get_kernel(kernel_id)
        km.stop_restarter()
        self.stop_watching_activity(kernel_id)
        km.execution_state = execution_state
        self.stop_buffering(kernel_id)
        for conn in self.connections_of(kernel_id):
            conn.sleep()
        # jupyter_client has no public way to close the control socket it keeps open
        # (checked against jupyter_client 8.10); a frozen kernel must not hold it.
        km._close_control_socket()
        await self._until_kernel_closed_its_side(km)

    @staticmethod
    async def _until_kernel_closed_its_side(km: Any, timeout: float = 0.1) -> None:
        """Until the kernel has closed its side of the connections just closed (the FINs went out
        and its ZeroMQ closed them), so that the dump freezes none half-closed; at most
        ``timeout``, which another client's connection to the kernel takes in full. On loopback
        this takes milliseconds (a fixed 0.1 s was a tenth of a CPU kernel's suspend)."""
        pid = getattr(km.provisioner, "kernel_pid", None) or getattr(km.provisioner, "pid", None)
        ports = set(km.ports) if km.transport == "tcp" else set()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline and (not pid or not ports or tcp_connections_to(pid, ports)):
            await asyncio.sleep(0.002)

    async def reattach_kernel(self, kernel_id: str, wake: bool = True) -> None:
        """The kernel runs again (restored, or the suspend failed after detaching); ``wake``
        reconnects the open websockets too (waiting for the kernel to answer them)."""
        km = self.get_kernel(kernel_id)
        if km._control_socket is None:  # private as above
            km._connect_control_socket()
        self.start_watching_activity(kernel_id)
        km.start_restarter()
        if wake:
            await self.wake_connections(kernel_id)

    async def wake_connections(self, kernel_id: str) -> None:
        for conn in self.connections_of(kernel_id):
            try:
                await conn.wake()
            except Exception as e:  # one broken websocket must not stop the others
                self.log.warning("gpucr: a connection to kernel %s could not be woken: %s", kernel_id, e)

    def kernels_by_pid(self) -> dict[int, str]:
        """Host PIDs of running kernels' process trees, for GPU listings."""
        out: dict[int, str] = {}
        for kernel_id in self.list_kernel_ids():
            pid = getattr(self.get_kernel(kernel_id).provisioner, "kernel_pid", None)
            with contextlib.suppress(psutil.Error, OSError):
                out.update({p: kernel_id for p in tree(pid)} if pid else {})
        return out

    def cancel_queued(self, kernel_id: str) -> None:
        """An interrupt while the kernel is on disk or being restored: the requests that wait
        for the restore are answered as interrupted and never run; the restore goes on."""
        cancelled = sum(conn.cancel_queued() for conn in self.connections_of(kernel_id))
        if cancelled:
            self.log.warning("gpucr: kernel %s was interrupted while being restored: %d waiting request(s) cancelled, "
                             "the restore goes on", kernel_id, cancelled)

    def settle_connections(self, kernel_id: str) -> None:
        for conn in self.connections_of(kernel_id):
            conn.settle()

    async def sessions_of(self, kernel_id: str) -> list[dict[str, Any]]:
        sm = getattr(self.parent, "session_manager", None)
        if sm is None:
            return []
        rows = await ensure_async(sm.list_sessions())  # Kernel Gateway's session manager is not async
        return [{"id": s["id"], "path": s["path"], "name": s["name"], "type": s["type"]}
                for s in rows if s.get("kernel", {}).get("id") == kernel_id]

    # -- culling and idle suspension -----------------------------------------------------
    def track_message_type(self, message_type: str | None) -> bool:
        """Whether a message of this type (or, for the kernel's iopub messages, of their parent's
        type) is the user's activity: as ``untracked_message_types`` says, and never a monitor's
        (:data:`MONITORING`)."""
        return message_type not in MONITORING and bool(super().track_message_type(message_type))

    def is_idle(self, kernel_id: str, timeout: float, busy_ok: bool, connected_ok: bool) -> bool:
        kernel = self.get_kernel(kernel_id)
        if not hasattr(kernel, "last_activity") or timeout <= 0:
            return False
        idle = utcnow() - kernel.last_activity > datetime.timedelta(seconds=timeout)
        not_busy = busy_ok or kernel.execution_state != "busy"
        not_connected = connected_ok or not self._kernel_connections.get(kernel_id, 0)
        return idle and not_busy and not_connected

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        if not self.runtime.options.suspend_on_cull:
            return await super().cull_kernel_if_idle(kernel_id)
        if self.lifecycle.state_of(kernel_id) != RUNNING:
            return None
        kernel = self.get_kernel(kernel_id)
        if getattr(kernel, "execution_state", None) == "dead":
            return await super().cull_kernel_if_idle(kernel_id)
        timeout = kernel.kernel_spec.metadata.get("cull_idle_timeout", self.cull_idle_timeout)
        if self.is_idle(kernel_id, timeout, self.cull_busy, self.cull_connected):
            self.log.warning("gpucr: suspending idle kernel %s instead of culling it", kernel_id)
            try:
                await self.runtime.suspender.suspend(kernel_id, reason="idle")
            except GPUCRError as e:
                self.log.error("gpucr: could not suspend idle kernel %s: %s", kernel_id, e)
        return None

    # -- kernels of an earlier server ----------------------------------------------------
    async def list_suspended(self, record: dict[str, Any]) -> None:
        """List a kernel that is on disk (suspended by an earlier server, or brought back from
        the trash) under its id, with its sessions."""
        kernel_id = record["kernel_id"]
        km = self.kernel_manager_factory(
            parent=self, log=self.log, kernel_name=record["kernel_name"], owns_kernel=True,
            connection_file=self.connection_dir and f"{self.connection_dir}/kernel-{kernel_id}.json")
        km.kernel_id = kernel_id
        km.load_connection_info(record["connection_info"])
        km.write_connection_file()
        km.provisioner = KernelProvisionerFactory.instance(parent=self).create_provisioner_instance(
            kernel_id, km.kernel_spec, parent=km)
        km.provisioner.connection_info = record["connection_info"]
        km.provisioner.cwd = record.get("cwd") or None
        km.provisioner.mark_suspended()
        # jupyter_client keeps the launch arguments (for restarts) and the readiness state only
        # in these private attributes (checked against jupyter_client 8.10).
        km._launch_args = {"cwd": record.get("cwd") or None}
        km._ready = asyncio.get_running_loop().create_future()
        km._ready.set_result(None)
        km._attempted_start = True  # later calls get a fresh readiness future, as after a start
        km.execution_state = "idle"
        km.last_activity = utcnow()
        km.reason = ""
        label = labels.load(self.runtime.store, kernel_id)
        if label:
            self.lifecycle.set_label(kernel_id, label)
        # The stock manager registers kernels in these maps in _async_start_kernel, which a
        # kernel on disk never runs (checked against jupyter_server 2.21).
        self._kernels[kernel_id] = km
        self._kernel_connections[kernel_id] = 0
        self._kernel_ports[kernel_id] = km.ports
        sm = self.parent.session_manager
        for s in record.get("sessions", []):
            if not await ensure_async(sm.session_exists(path=s["path"])):
                await ensure_async(sm.save_session(s["id"], path=s["path"], name=s["name"], type=s["type"], kernel_id=kernel_id))

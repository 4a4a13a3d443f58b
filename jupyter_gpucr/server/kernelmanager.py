"""Kernel managers that keep suspended kernels listed and manageable.

A suspended kernel keeps its id, its entry in ``/api/kernels`` and its sessions; interrupting
it does nothing, shutting it down deletes its checkpoint, restarting it starts a fresh kernel.
Culling suspends instead of shutting down, and kernels suspended by a previous server with
the same store are listed again at start-up.
"""
from __future__ import annotations

import asyncio
import datetime
from typing import Any

from jupyter_client.provisioning import KernelProvisionerFactory as KPF
from jupyter_server._tz import utcnow
from jupyter_server.services.kernels.kernelmanager import AsyncMappingKernelManager, ServerKernelManager
from traitlets import default

from ..core.errors import GPUCRError
from .websocket import RestoringWebsocketConnection

PROVISIONER = "gpucr-provisioner"


class GPUCRKernelManager(ServerKernelManager):
    """One kernel; defers to the gpucr service while the kernel is on disk."""

    def _service(self) -> Any:
        return getattr(self.parent, "gpucr", None)

    def _suspended(self) -> bool:
        svc = self._service()
        return svc is not None and svc.is_suspended(self.kernel_id)

    async def shutdown_kernel(self, now: bool = False, restart: bool = False) -> None:
        if not self._suspended():
            return await super().shutdown_kernel(now=now, restart=restart)
        svc = self._service()
        svc.forget(self.kernel_id, delete_checkpoints=not svc.stopping)
        self.provisioner.suspended = False
        self.provisioner.process = None
        await self._async_cleanup_resources(restart=restart)

    async def interrupt_kernel(self) -> None:
        if not self._suspended():
            await super().interrupt_kernel()

    async def restart_kernel(self, now: bool = False, newports: bool = False, **kw: Any) -> None:
        if self._suspended():  # the user asked for a fresh kernel: the checkpoint goes
            self._service().forget(self.kernel_id, delete_checkpoints=True)
            self.provisioner.suspended = False
            self.provisioner.process = None
        await super().restart_kernel(now=now, newports=newports, **kw)


class GPUCRMappingKernelManager(AsyncMappingKernelManager):
    """The server's kernel manager with gpucr's suspend/resume hooks."""

    gpucr: Any = None  # the KernelSuspender, set by the extension

    @default("kernel_manager_class")
    def _default_kernel_manager_class(self) -> str:
        return "jupyter_gpucr.server.kernelmanager.GPUCRKernelManager"

    def _validate_kernel_manager_class(self, proposal: Any) -> Any:
        return proposal.value

    def kernel_model(self, kernel_id: str) -> dict[str, Any]:
        model = super().kernel_model(kernel_id)
        if self.gpucr is not None and kernel_id in self.gpucr.states:
            model["gpucr"] = {"state": self.gpucr.states[kernel_id].state}
        return model

    # -- around a suspend ----------------------------------------------------------------
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
        for conn in list(RestoringWebsocketConnection.registry.get(kernel_id, ())):
            conn.sleep()
        km._close_control_socket()
        await asyncio.sleep(0.1)  # let ZeroMQ send the FINs before the dump freezes the kernel

    async def reattach_kernel(self, kernel_id: str) -> None:
        km = self.get_kernel(kernel_id)
        km._connect_control_socket()
        self.start_watching_activity(kernel_id)
        km.start_restarter()
        for conn in list(RestoringWebsocketConnection.registry.get(kernel_id, ())):
            await conn.wake()

    async def sessions_of(self, kernel_id: str) -> list[dict[str, Any]]:
        sm = getattr(self.parent, "session_manager", None)
        if sm is None:
            return []
        rows = await sm.list_sessions()
        return [{"id": s["id"], "path": s["path"], "name": s["name"], "type": s["type"]}
                for s in rows if s.get("kernel", {}).get("id") == kernel_id]

    # -- culling and idle suspension -----------------------------------------------------
    def is_idle(self, kernel_id: str, timeout: float, busy_ok: bool, connected_ok: bool) -> bool:
        kernel = self._kernels[kernel_id]
        if not hasattr(kernel, "last_activity") or timeout <= 0:
            return False
        idle = utcnow() - kernel.last_activity > datetime.timedelta(seconds=timeout)
        not_busy = busy_ok or kernel.execution_state != "busy"
        not_connected = connected_ok or not self._kernel_connections.get(kernel_id, 0)
        return idle and not_busy and not_connected

    async def cull_kernel_if_idle(self, kernel_id: str) -> None:
        svc = self.gpucr
        if svc is None or not svc.config.suspend_on_cull:
            return await super().cull_kernel_if_idle(kernel_id)
        kernel = self._kernels[kernel_id]
        if svc.state(kernel_id).state != "running" or getattr(kernel, "execution_state", None) == "dead":
            return await super().cull_kernel_if_idle(kernel_id) if svc.state(kernel_id).state == "running" else None
        timeout = kernel.kernel_spec.metadata.get("cull_idle_timeout", self.cull_idle_timeout)
        if self.is_idle(kernel_id, timeout, self.cull_busy, self.cull_connected):
            self.log.warning("gpucr: suspending idle kernel %s instead of culling it", kernel_id)
            try:
                await svc.suspend(kernel_id, reason="idle")
            except GPUCRError as e:
                self.log.error("gpucr: could not suspend idle kernel %s: %s", kernel_id, e)

    # -- server start --------------------------------------------------------------------
    async def adopt_suspended(self, record: dict[str, Any], session_manager: Any) -> None:
        """List a kernel suspended by an earlier server again, with its sessions."""
        kernel_id = record["kernel_id"]
        km = self.kernel_manager_factory(
            parent=self, log=self.log, kernel_name=record["kernel_name"], owns_kernel=True,
            connection_file=self.connection_dir and f"{self.connection_dir}/kernel-{kernel_id}.json")
        km.kernel_id = kernel_id
        km.load_connection_info(record["connection_info"])
        km.write_connection_file()
        km.provisioner = KPF.instance(parent=self).create_provisioner_instance(kernel_id, km.kernel_spec, parent=km)
        km.provisioner.connection_info = record["connection_info"]
        km.provisioner.cwd = record.get("cwd") or None
        km.provisioner.mark_suspended()
        km._launch_args = {"cwd": record.get("cwd") or None}
        km._ready = asyncio.get_running_loop().create_future()
        km._ready.set_result(None)
        km.execution_state = "idle"
        km.last_activity = utcnow()
        km.reason = ""
        self._kernels[kernel_id] = km
        self._kernel_connections[kernel_id] = 0
        self._kernel_ports[kernel_id] = km.ports
        for s in record.get("sessions", []):
            await session_manager.save_session(s["id"], path=s["path"], name=s["name"], type=s["type"],
                                               kernel_id=kernel_id)

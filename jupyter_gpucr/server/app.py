"""The jupyter_server extension: wires the service, kernel managers, websocket class and
REST handlers together. Configuration lives in :class:`jupyter_gpucr.config.GPUCR`."""
from __future__ import annotations

import asyncio
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from tornado.ioloop import PeriodicCallback

from .config import GPUCR
from ..core import cuda
from ..core.errors import GPUCRError
from .handlers import handlers
from .kernelmanager import PROVISIONER, GPUCRMappingKernelManager
from .service import KernelSuspender
from .websocket import RestoringWebsocketConnection


class GPUCRApp(ExtensionApp):
    name = "jupyter_gpucr"
    description = "Suspend Jupyter kernels to disk and restore them on demand."

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        """Install the kernel manager and websocket classes before the server creates them."""
        super()._link_jupyter_server_extension(serverapp)
        options = GPUCR(parent=serverapp)
        # Set, never read: reading the trait's default needs parts of the server not made yet.
        serverapp.kernel_manager_class = GPUCRMappingKernelManager
        serverapp.kernel_websocket_connection_class = RestoringWebsocketConnection
        if options.checkpointable_kernels:
            serverapp.config.KernelProvisionerFactory.default_provisioner_name = PROVISIONER

    def initialize_settings(self) -> None:
        self.options = GPUCR(parent=self.serverapp)
        km = self.serverapp.kernel_manager
        self.service = KernelSuspender(self.options, km, getattr(self.serverapp, "event_logger", None), self.log)
        km.gpucr = self.service
        self.settings["gpucr"] = self.service
        self._idle_checker: PeriodicCallback | None = None

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        # Initialise the CUDA driver (where there is one) now, not during the first suspend.
        asyncio.get_running_loop().run_in_executor(None, cuda.unavailable_reason)
        await self._adopt_suspended_kernels()
        if self.options.idle_timeout > 0:
            self._idle_checker = PeriodicCallback(self._suspend_idle_kernels, 1000 * self.options.idle_check_interval)
            self._idle_checker.start()
            self.log.info("gpucr: suspending kernels idle for more than %d s", self.options.idle_timeout)

    async def _adopt_suspended_kernels(self) -> None:
        """List kernels that an earlier server with this store suspended, under their ids."""
        cp = self.service.checkpointer
        km = self.serverapp.kernel_manager
        for name in cp.store.proc_names():
            rec = cp.store.read_proc(name)
            latest = cp.store.latest(name)
            kernel = (latest.manifest.get("kernel") if latest else None) or {}
            if rec.get("state") != "checkpointed" or not kernel or name in km:
                continue
            try:
                await km.adopt_suspended(kernel, self.serverapp.session_manager)
            except Exception as e:
                self.log.error("gpucr: could not list suspended kernel %s again: %s", name, e)
                continue
            self.service.mark_adopted(name, latest, rec.get("suspended_at"))
            self.log.info("gpucr: kernel %s is suspended on disk (%s); it restores on first use", name, latest.id)

    async def _suspend_idle_kernels(self) -> None:
        km = self.serverapp.kernel_manager
        for kernel_id in list(km.list_kernel_ids()):
            kernel = km.get_kernel(kernel_id)
            timeout = kernel.kernel_spec.metadata.get("gpucr_idle_timeout", self.options.idle_timeout)
            if self.service.states.get(kernel_id) and self.service.states[kernel_id].state != "running":
                continue
            if km.is_idle(kernel_id, timeout, self.options.suspend_busy, self.options.suspend_connected):
                try:
                    await self.service.suspend(kernel_id, reason="idle")
                except GPUCRError as e:
                    self.log.warning("gpucr: idle kernel %s not suspended: %s", kernel_id, e)

    async def stop_extension(self) -> None:  # type: ignore[override]
        """Runs before jupyter_server shuts kernels down: suspend them all first."""
        if self._idle_checker:
            self._idle_checker.stop()
        self.service.stopping = True
        if not self.options.suspend_on_stop:
            return
        failures = await self.service.suspend_all("server-stop")
        for kernel_id, why in failures.items():
            self.log.error("gpucr: kernel %s was not suspended before the server stopped: %s", kernel_id, why)
        suspended = [k for k, s in self.service.states.items() if s.state == "suspended"]
        self.log.info("gpucr: %d kernel(s) suspended on disk for the next start", len(suspended))


"""The jupyter_server extension: installs gpucr's kernel manager, websocket connection and REST
handlers, and starts and stops gpucr's runtime (``runtime.py``: the kernels an earlier server left
listed before kernel requests are answered, the idle and memory checks, every kernel suspended
before the server stops), as the Kernel Gateway personality does.
Configuration lives in :class:`jupyter_gpucr.server.config.GPUCR`."""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets.utils.importstring import import_item

from ..core.errors import GPUCRError
from ..core.gpu import cuda
from .backend_choice import choose_backend
from .config import GPUCR
from .kernelmanager import PROVISIONER, GPUCRMappingKernelManager
from .readiness import Readiness
from .remote import remote_url, store_keys
from .routes import routes
from .runtime import GPUCRRuntime
from .websocket import GPUCRWebsocketConnection

KM_CLASS = f"{GPUCRMappingKernelManager.__module__}.{GPUCRMappingKernelManager.__name__}"


class GPUCRApp(ExtensionApp):
    name = "jupyter_gpucr"
    description = "Suspend Jupyter kernels to disk and restore them on demand."
    runtime: GPUCRRuntime | None = None  # None when the server was refused before gpucr loaded
    readiness: Readiness | None = None

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        """Install the kernel manager and websocket classes before the server creates them.

        Set in the server's config as well as on its traits: another extension linked later
        re-applies the server's config to its traits (ExtensionApp._link_jupyter_server_extension)."""
        super()._link_jupyter_server_extension(serverapp)
        configured = serverapp.config.ServerApp.get("kernel_manager_class")
        if configured is not None and not _is_gpucr_manager(configured):
            self._refuse(f"ServerApp.kernel_manager_class is set to {configured!r} in the server's configuration, "
                         f"and gpucr needs its own ({KM_CLASS}) to suspend kernels.",
                         "Remove that setting, subclass gpucr's manager, or disable gpucr "
                         "(jupyter server extension disable jupyter_gpucr).")
        serverapp.config.ServerApp.kernel_manager_class = KM_CLASS
        serverapp.kernel_manager_class = GPUCRMappingKernelManager
        serverapp.kernel_websocket_connection_class = GPUCRWebsocketConnection
        config = GPUCR(parent=serverapp)
        self._check_encryption_key(config)
        # Without a backend the gpucr provisioner could not start a kernel here (unshare needs privileges).
        if config.checkpointable_kernels and choose_backend(config).kind != "none":
            serverapp.config.KernelProvisionerFactory.default_provisioner_name = PROVISIONER

    def initialize_settings(self) -> None:
        km = self.serverapp.kernel_manager
        if not isinstance(km, GPUCRMappingKernelManager):
            self._refuse(f"The server runs kernel manager {type(km).__name__}, not gpucr's: another extension or "
                         "a configuration replaced it after gpucr was linked.",
                         "Remove the other ServerApp.kernel_manager_class setting, or disable gpucr.")
        self.runtime = km.runtime
        self.settings["gpucr"] = self.runtime
        # What JupyterLab says about the trash (labextension/src/serverconfig.ts reads it).
        page_config = self.serverapp.web_app.settings.setdefault("page_config_data", {})
        page_config["gpucrTrashHours"] = f"{self.runtime.options.trash_hours:g}"
        # Before the server's HTTP server exists (it is made after the extensions are loaded),
        # and listed as soon as the event loop runs (jupyter_server starts extensions only after
        # it has started serving, and servers embedded in tests never do).
        self.readiness = Readiness(self.serverapp.base_url)
        self.readiness.hold_requests(self.serverapp.web_app)
        self.serverapp.io_loop.add_callback(self.runtime.start, self.readiness)

    def _check_encryption_key(self, config: GPUCR) -> None:
        """A key file (current or previous) that is missing or open to others stops the server, rather
        than kernels being uploaded unencrypted or not at all, or left in the store unrestorable."""
        if not config.encryption_key_file and not config.previous_encryption_key_files:
            return
        if not remote_url(config):
            self.log.warning("gpucr: c.GPUCR.encryption_key_file encrypts what goes into object storage; the store %s "
                             "is a directory, whose checkpoints stay plaintext (0600 files in 0700 folders: protect "
                             "the disk).", config.store or "(default)")
            return
        try:
            store_keys(config)
        except GPUCRError as e:
            self._refuse(e.message, e.hint)

    def _refuse(self, message: str, hint: str) -> None:
        """Stop the server rather than run kernels gpucr cannot see (a silent half-install)."""
        self.log.critical("gpucr: %s %s", message, hint)
        raise SystemExit(f"gpucr: {message} {hint}")

    def initialize_handlers(self) -> None:
        self.handlers.extend(routes())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        # Initialise the CUDA driver (where there is one) now, not during the first suspend.
        asyncio.get_running_loop().run_in_executor(None, cuda.unavailable_reason)
        assert self.runtime is not None
        self.runtime.log_engine(self.runtime.options.checkpointable_kernels)
        self._check_stop_budget()
        self._stop_on_sigint()

    def _stop_on_sigint(self) -> None:
        """LocalProcessSpawner stops a server with SIGINT. jupyter_server handles SIGINT only when
        stdin is a terminal (to ask before stopping); without one, Python's KeyboardInterrupt ends the
        event loop and no extension's stop hook runs: kernels would be neither suspended nor shut down."""
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self.serverapp._signal_stop)

    def _check_stop_budget(self) -> None:
        """A spawner kills a server that takes longer to stop than it allows: kernels not on disk by
        then are lost. JupyterHub does not tell the server its timeout, so the admin does."""
        assert self.runtime is not None
        options = self.runtime.options
        if not options.suspend_on_stop:
            return
        limit = options.spawner_stop_timeout
        if limit and options.stop_budget >= limit:
            self.log.warning("gpucr: c.GPUCR.stop_budget (%.0f s) does not fit in the spawner's stop timeout (%.0f s): "
                             "kernels still being suspended when the spawner kills the server are lost. Lower the budget "
                             "or raise the spawner's timeout (docs/jupyterhub.md).", options.stop_budget, limit)
        elif not limit and "JUPYTERHUB_API_TOKEN" in os.environ:
            self.log.warning("gpucr: running under JupyterHub, whose stop timeout this server cannot know (LocalProcessSpawner "
                             "kills after 15 s by default, KubeSpawner after 1 s); c.GPUCR.stop_budget is %.0f s. Set "
                             "c.GPUCR.spawner_stop_timeout or $GPUCR_SPAWNER_STOP_TIMEOUT (docs/jupyterhub.md).",
                             options.stop_budget)

    async def stop_extension(self) -> None:
        """Runs before jupyter_server shuts kernels down: suspend them all first."""
        if self.runtime is not None:
            await self.runtime.stop("server")


def _is_gpucr_manager(value: Any) -> bool:
    if isinstance(value, str):
        try:
            value = import_item(value)
        except Exception:
            return False
    return isinstance(value, type) and issubclass(value, GPUCRMappingKernelManager)

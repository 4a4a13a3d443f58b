"""Kernel Gateway's websocket personality with what gpucr's server extension adds to a jupyter
server (see :mod:`jupyter_gpucr.server.app`): the kernel manager and websocket connection
class, ``/api/gpucr/``, kernels of an earlier gateway listed again before kernel requests are
answered, idle suspension, and every kernel suspended before the gateway stops: the same runtime
(``server/runtime.py``) and the same routes, with the gateway's own rules."""
from __future__ import annotations

import asyncio
import signal
from typing import Any

from kernel_gateway.jupyter_websocket import JupyterWebsocketPersonality
from kernel_gateway.mixins import CORSMixin, TokenAuthorizationMixin
from kernel_gateway.services.kernels.manager import SeedingMappingKernelManager
from tornado import web

from ..core.gpu import cuda
from ..server.backend_choice import choose_backend
from ..server.config import GPUCR
from ..server.kernelmanager import PROVISIONER, GPUCRMappingKernelManager
from ..server.readiness import Readiness
from ..server.routes import routes
from ..server.runtime import GPUCRRuntime
from ..server.websocket import GPUCRWebsocketConnection
from .manager import GatewayKernelManager

#: A gateway's default ``c.GPUCR.suspended_hours``: agent frameworks seldom delete their kernels.
GATEWAY_SUSPENDED_HOURS = 24.0


class GatewayWebsocketConnection(GPUCRWebsocketConnection):
    """gpucr's connection with the class method Kernel Gateway calls when it stops."""

    @classmethod
    async def close_all(cls) -> None:
        """The websockets close with the process; their kernels are on disk or shut down by then."""


class GPUCRPersonality(JupyterWebsocketPersonality):
    """See the module docstring. Made by Kernel Gateway after its kernel manager and before its
    web application and HTTP server."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        app = self.parent
        if "suspended_hours" not in app.config.GPUCR:  # agents' throwaway kernels: nobody shuts them down
            app.config.GPUCR.suspended_hours = GATEWAY_SUSPENDED_HOURS
        config = GPUCR(parent=app)
        # Before the first kernel starts: the provisioner factory reads this when it is made.
        if config.checkpointable_kernels and choose_backend(config).kind != "none":
            app.config.KernelProvisionerFactory.default_provisioner_name = PROVISIONER
        self.kernel_manager = _gpucr_kernel_manager(app)
        if not issubclass(app.kernel_websocket_connection_class, GPUCRWebsocketConnection):
            if app.config.KernelGatewayApp.get("kernel_websocket_connection_class") is not None:
                _refuse(f"KernelGatewayApp.kernel_websocket_connection_class is set to "
                        f"{app.kernel_websocket_connection_class.__name__}, and gpucr needs its own to keep "
                        "websockets open while a kernel is on disk.", "Remove that setting.")
            app.kernel_websocket_connection_class = GatewayWebsocketConnection
        self.runtime: GPUCRRuntime = self.kernel_manager.runtime
        self.readiness = Readiness(app.base_url)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            # Without a terminal Kernel Gateway leaves SIGINT to Python, whose KeyboardInterrupt ends
            # the event loop before any kernel is suspended.
            signal.signal(signal.SIGINT, app._signal_stop)
        # The first callback of the event loop: before it accepts the first connection.
        app.io_loop.add_callback(self._start)

    def create_request_handlers(self) -> list[tuple[Any, ...]]:
        """Kernel Gateway's handlers, and gpucr's behind the gateway's token, CORS headers and
        listing rule."""
        base = self.parent.base_url.rstrip("/")
        ours = [(pattern, type(cls.__name__, (TokenAuthorizationMixin, CORSMixin, GatewayListingRule, cls), {}))
                for pattern, cls in routes(f"{base}/api/gpucr")]
        return ours + super().create_request_handlers()

    async def _start(self) -> None:
        app = self.parent
        app.web_app.settings["gpucr"] = self.runtime
        self.readiness.hold_requests(app.web_app)
        asyncio.get_running_loop().run_in_executor(None, cuda.unavailable_reason)
        self.runtime.log_engine(kernels_start_stock=False)
        await self.runtime.start(self.readiness)

    async def shutdown(self) -> None:
        """Kernel Gateway shuts every kernel down when it stops: put them on disk first, where
        the next gateway with this store lists them again."""
        await self.runtime.stop("gateway")
        await super().shutdown()


class GatewayListingRule:
    """Kernel Gateway's own rule for listing kernels, on gpucr's routes too: with
    ``KernelGatewayApp.list_kernels=False`` (its default) ``GET /api/kernels`` answers 403, and so
    does every gpucr GET that lists kernels (their ids, labels, checkpoints); a caller who knows a
    kernel's id still reaches it."""

    settings: dict[str, Any]
    request: Any
    lists_kernels: bool

    def prepare(self) -> Any:
        if self.lists_kernels and self.request.method == "GET" and not self.settings.get("kg_list_kernels"):
            raise web.HTTPError(403, "Forbidden: this gateway does not list kernels (KernelGatewayApp.list_kernels).")
        return super().prepare()  # type: ignore[misc]


def _gpucr_kernel_manager(app: Any) -> GPUCRMappingKernelManager:
    """gpucr's kernel manager for the gateway. Kernel Gateway makes its kernel manager before it
    loads the API module; unless configured otherwise it made its own seeding manager, which
    has no kernels yet and is replaced here by the same manager with gpucr's added."""
    km = app.kernel_manager
    if isinstance(km, GPUCRMappingKernelManager):
        return km
    if type(km) is not SeedingMappingKernelManager:
        _refuse(f"KernelGatewayApp.kernel_manager_class is {type(km).__name__}, and gpucr needs its own "
                "to suspend kernels.", "Remove that setting or use jupyter_gpucr.gateway.GatewayKernelManager.")
    kwargs = {"default_kernel_name": app.default_kernel_name} if app.default_kernel_name else {}
    app.kernel_manager_class = GatewayKernelManager
    app.kernel_manager = GatewayKernelManager(parent=app, log=app.log, connection_dir=app.runtime_dir,
                                              kernel_spec_manager=app.kernel_spec_manager, **kwargs)
    app.session_manager.kernel_manager = app.kernel_manager
    return app.kernel_manager


def _refuse(message: str, hint: str) -> None:
    """Stop the gateway rather than run kernels gpucr cannot see (a silent half-install)."""
    raise SystemExit(f"gpucr: {message} {hint}")

"""REST handlers under /api/gpucr/: thin translations of HTTP into calls on the service.

Authenticated like every jupyter_server API handler, and authorized against the ``kernels``
resource: ``read`` to look, ``execute`` to suspend or resume, ``write`` to delete.
"""
from __future__ import annotations

import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.doctor import report, run_checks
from ..core.errors import GPUCRError
from ..core.gpu import gpus
from ..daemon.client import DaemonClient

AUTH_RESOURCE = "kernels"
_KERNEL_ID = r"(?P<kernel_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
_CHECKPOINT_ID = r"(?P<checkpoint_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
_TRASH_ID = r"(?P<trash_id>[A-Za-z0-9][A-Za-z0-9._-]*)"


class GPUCRHandler(APIHandler):
    """Handlers raise; :meth:`write_error` turns a :class:`GPUCRError` into its status and a JSON
    body with the message and the hint (``reason`` too, where jupyter_server's clients look)."""

    auth_resource = AUTH_RESOURCE

    @property
    def service(self) -> Any:
        return self.settings["gpucr"]

    def body(self) -> dict[str, Any]:
        """The request's JSON object; ``{}`` for an empty body."""
        data = self.get_json_body()
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise web.HTTPError(400, "The request body must be a JSON object.")
        return data

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        e = kwargs.get("exc_info", (None, None, None))[1]
        if not isinstance(e, GPUCRError):
            return super().write_error(status_code, **kwargs)
        self.set_status(e.status)
        self.finish(json.dumps({**e.to_dict(), "reason": e.hint}))

    def log_exception(self, typ: Any, value: BaseException | None, tb: Any) -> None:
        """A :class:`GPUCRError` is an answer, not a crash: one line, no traceback."""
        if isinstance(value, GPUCRError):
            self.log.warning("gpucr: %s %s: %s", value.status, self._request_summary(), value)
        else:
            super().log_exception(typ, value, tb)

    async def kernel_state(self, kernel_id: str) -> dict[str, Any]:
        return (await self.service.state(kernel_id)).to_dict()


class KernelsHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every kernel; ``?label=L``: the kernels labelled L (an agent finding its own)."""
        km = self.service.kernel_manager
        label = self.get_query_argument("label", None)
        states = [await self.kernel_state(k) for k in km.list_kernel_ids()]
        self.finish(json.dumps([s for s in states if label is None or s["label"] == label]))


class LabelHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="write")
    async def put(self, kernel_id: str) -> None:
        """Label a kernel after its start (jupyter_server passes no environment from the start request)."""
        self.service.kernel_manager.set_label(kernel_id, self.body().get("label"))
        self.finish(json.dumps(await self.kernel_state(kernel_id)))


class KernelHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        self.finish(json.dumps(await self.kernel_state(kernel_id)))


class SuspendHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str) -> None:
        body = self.body()
        engine, when = body.get("engine"), body.get("when", "now")
        if engine not in (None, "auto", "criu", "snapshot"):
            raise web.HTTPError(400, f"Unknown engine {engine!r}: use auto, criu or snapshot.")
        if when not in ("now", "idle", "interrupt"):
            raise web.HTTPError(400, f"Unknown 'when' {when!r}: use now, idle (when the cell finishes) or interrupt.")
        st = await self.service.suspend(kernel_id, reason="manual", engine=engine, when=when)
        self.set_status(202 if st.state == "suspend-pending" else 200)
        self.finish(json.dumps(await self.kernel_state(kernel_id)))

    @web.authenticated
    @authorized(action="execute")
    async def delete(self, kernel_id: str) -> None:
        """Cancel a suspend that waits for the running cell."""
        self.service.cancel_pending(kernel_id)
        self.finish(json.dumps(await self.kernel_state(kernel_id)))


class ResumeHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str) -> None:
        body = self.body()
        gpu = None if body.get("gpu") is None else str(body["gpu"])
        if body.get("wait", True) is False:  # about to use it: restore in the background
            self.service.resume_ahead(kernel_id, gpu)
            self.set_status(202)
        else:
            await self.service.resume(kernel_id, gpu=gpu)
        self.finish(json.dumps(await self.kernel_state(kernel_id)))


class CheckpointsHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        store = self.service.checkpointer.store
        self.finish(json.dumps([await self.service.checkpoint_summary(c) for c in store.list_checkpoints()]))


class CheckpointHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, checkpoint_id: str) -> None:
        ckpt = self.service.checkpointer.store.get(checkpoint_id)
        self.finish(json.dumps(await self.service.checkpoint_summary(ckpt)))

    @web.authenticated
    @authorized(action="write")
    async def delete(self, checkpoint_id: str) -> None:
        await self.service.delete_checkpoint(checkpoint_id)
        self.set_status(204)
        self.finish()


class TrashHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(self.service.trash.contents()))


class TrashItemHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="write")
    async def delete(self, trash_id: str) -> None:
        self.service.trash.delete(trash_id)
        self.set_status(204)
        self.finish()


class TrashRestoreHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="write")
    async def post(self, trash_id: str) -> None:
        body = self.body()
        replace, sessions = body.get("replace", False), body.get("sessions", True)
        if not isinstance(replace, bool) or not isinstance(sessions, bool):
            raise web.HTTPError(400, "'replace' and 'sessions' are true or false.")
        st = await self.service.restore_from_trash(trash_id, replace=replace, sessions=sessions)
        self.finish(json.dumps(await self.kernel_state(st.kernel_id)))


class GpusHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        on_gpu = self.service.kernels_by_pid()
        out = []
        for g in gpus.list_gpus():
            d = g.to_dict()
            d.pop("processes")
            d["kernels"] = sorted({on_gpu[p] for p in g.processes if p in on_gpu})
            out.append(d)
        self.finish(json.dumps(out))


class DoctorHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        """The doctor's checks as this server sees them: its store, its CRIU and its daemon."""
        options = self.service.options
        daemon = DaemonClient(options.daemon_socket) if options.daemon_socket else None
        checks = run_checks(self.service.checkpointer.store, options.criu_path or None, daemon)
        self.finish(json.dumps(report(checks)))


def handlers(base: str = "/api/gpucr") -> list[tuple[str, type]]:
    return [
        (rf"{base}/kernels", KernelsHandler),
        (rf"{base}/kernels/{_KERNEL_ID}", KernelHandler),
        (rf"{base}/kernels/{_KERNEL_ID}/suspend", SuspendHandler),
        (rf"{base}/kernels/{_KERNEL_ID}/resume", ResumeHandler),
        (rf"{base}/kernels/{_KERNEL_ID}/label", LabelHandler),
        (rf"{base}/trash", TrashHandler),
        (rf"{base}/trash/{_TRASH_ID}", TrashItemHandler),
        (rf"{base}/trash/{_TRASH_ID}/restore", TrashRestoreHandler),
        (rf"{base}/checkpoints", CheckpointsHandler),
        (rf"{base}/checkpoints/{_CHECKPOINT_ID}", CheckpointHandler),
        (rf"{base}/gpus", GpusHandler),
        (rf"{base}/doctor", DoctorHandler),
    ]

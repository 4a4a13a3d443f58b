"""REST handlers under /api/gpucr/: thin translations of HTTP into calls on gpucr's runtime.

Authenticated like every jupyter_server API handler, and authorized against the ``kernels``
resource: ``read`` to look, ``execute`` to suspend or resume, ``write`` to delete.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, cast

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from tornado import web

from ..core.doctor import report, run_checks
from ..core.errors import GPUCRError
from ..core.gpu import gpus
from ..daemon.client import DaemonClient

if TYPE_CHECKING:
    from .runtime import GPUCRRuntime

AUTH_RESOURCE = "kernels"


class GPUCRHandler(APIHandler):
    """Handlers raise; :meth:`write_error` turns a :class:`GPUCRError` into its status and a JSON
    body with the message and the hint (``reason`` too, where jupyter_server's clients look)."""

    auth_resource = AUTH_RESOURCE

    #: A GET that lists kernels (their ids, labels, checkpoints): refused where the server does not
    #: list kernels to its clients (Kernel Gateway's ``list_kernels=False``, see the gateway's rules).
    lists_kernels = False

    @property
    def runtime(self) -> GPUCRRuntime:
        """gpucr's parts for this server (``runtime.py``)."""
        return cast("GPUCRRuntime", self.settings["gpucr"])

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
        return (await self.runtime.suspender.state(kernel_id)).to_dict()


class KernelsHandler(GPUCRHandler):
    lists_kernels = True

    @web.authenticated
    @authorized
    async def get(self) -> None:
        """Every kernel; ``?label=L``: the kernels labelled L (an agent finding its own)."""
        km = self.runtime.suspender.kernel_manager
        label = self.get_query_argument("label", None)
        states = [await self.kernel_state(k) for k in km.list_kernel_ids()]
        self.finish(json.dumps([s for s in states if label is None or s["label"] == label]))


class LabelHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="write")
    async def put(self, kernel_id: str) -> None:
        """Label a kernel after its start (jupyter_server passes no environment from the start request)."""
        self.runtime.suspender.set_label(kernel_id, self.body().get("label"))
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
        st = await self.runtime.suspender.suspend(kernel_id, reason="manual", engine=engine, when=when)
        self.set_status(202 if st.state == "suspend-pending" else 200)
        self.finish(json.dumps(await self.kernel_state(kernel_id)))

    @web.authenticated
    @authorized(action="execute")
    async def delete(self, kernel_id: str) -> None:
        """Cancel a suspend that waits for the running cell."""
        self.runtime.suspender.cancel_pending(kernel_id)
        self.finish(json.dumps(await self.kernel_state(kernel_id)))


class ResumeHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str) -> None:
        body = self.body()
        gpu = None if body.get("gpu") is None else str(body["gpu"])
        if body.get("wait", True) is False:  # about to use it: restore in the background
            self.runtime.suspender.resume_ahead(kernel_id, gpu)
            self.set_status(202)
        else:
            await self.runtime.suspender.resume(kernel_id, gpu=gpu)
        self.finish(json.dumps(await self.kernel_state(kernel_id)))


class CheckpointsHandler(GPUCRHandler):
    lists_kernels = True

    @web.authenticated
    @authorized
    async def get(self) -> None:
        store = self.runtime.store
        self.finish(json.dumps([await self.runtime.suspender.checkpoint_summary(c) for c in store.list_checkpoints()]))


class CheckpointHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, checkpoint_id: str) -> None:
        ckpt = self.runtime.store.get(checkpoint_id)
        self.finish(json.dumps(await self.runtime.suspender.checkpoint_summary(ckpt)))

    @web.authenticated
    @authorized(action="write")
    async def delete(self, checkpoint_id: str) -> None:
        await self.runtime.suspender.delete_checkpoint(checkpoint_id)
        self.set_status(204)
        self.finish()


class TrashHandler(GPUCRHandler):
    lists_kernels = True

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(self.runtime.trash.contents()))


class TrashItemHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="write")
    async def delete(self, trash_id: str) -> None:
        self.runtime.trash.delete(trash_id)
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
        st = await self.runtime.suspender.restore_from_trash(trash_id, replace=replace, sessions=sessions)
        self.finish(json.dumps(await self.kernel_state(st.kernel_id)))


class GpusHandler(GPUCRHandler):
    lists_kernels = True

    @web.authenticated
    @authorized
    async def get(self) -> None:
        on_gpu = self.runtime.suspender.kernel_manager.kernels_by_pid()
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
        """The doctor's checks as this server sees them: its store, its CRIU and its daemon; and
        what restoring ahead of use cost it (restores no run followed)."""
        options = self.runtime.options
        daemon = DaemonClient(options.daemon_socket) if options.daemon_socket else None
        checks = run_checks(self.runtime.store, options.criu_path or None, daemon)
        self.finish(json.dumps(report([*checks, self.runtime.suspender.ahead_restores.check()])))


class RoomHandler(GPUCRHandler):
    lists_kernels = True

    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(self.runtime.room.report()))


class ForkHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str) -> None:
        body = self.body()
        count, gpu = body.get("count", 1), body.get("gpu", "auto")
        if not isinstance(count, int) or isinstance(count, bool):
            raise web.HTTPError(400, "'count' is a whole number.")
        ids, paused = await self.runtime.forker.fork(kernel_id, count, "auto" if gpu is None else str(gpu))
        mkm = self.runtime.suspender.kernel_manager
        answer: dict[str, Any] = {"kernels": [mkm.kernel_model(k) for k in ids]}
        if paused is not None:
            answer["source"] = paused
        self.finish(json.dumps(answer, default=str))


class SavePointsHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        self.finish(json.dumps(self.runtime.savepoints.listed(kernel_id)))

    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str) -> None:
        made = await self.runtime.savepoints.save(kernel_id, self.body().get("name"))
        self.set_status(201)
        self.finish(json.dumps(made, default=str))


class SavePointHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str, savepoint_id: str) -> None:
        sps = self.runtime.savepoints
        self.finish(json.dumps(sps.summary(sps.get(kernel_id, savepoint_id))))

    @web.authenticated
    @authorized(action="write")
    async def delete(self, kernel_id: str, savepoint_id: str) -> None:
        await self.runtime.savepoints.delete(kernel_id, savepoint_id)
        self.set_status(204)
        self.finish()


class GoBackHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str, savepoint_id: str) -> None:
        st, trash_id = await self.runtime.savepoints.go_back(kernel_id, savepoint_id)
        self.finish(json.dumps({**(await self.kernel_state(kernel_id)), "trash_id": trash_id,
                                "timings": st.timings}, default=str))


class SavePointForkHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str, savepoint_id: str) -> None:
        body = self.body()
        count, gpu = body.get("count", 1), body.get("gpu", "auto")
        if not isinstance(count, int) or isinstance(count, bool):
            raise web.HTTPError(400, "'count' is a whole number.")
        ids = await self.runtime.savepoints.fork(kernel_id, savepoint_id, count, "auto" if gpu is None else str(gpu))
        mkm = self.runtime.suspender.kernel_manager
        self.finish(json.dumps({"kernels": [mkm.kernel_model(k) for k in ids]}, default=str))

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

from ..core import gpus
from ..cli.doctor import report, run_checks
from ..core.errors import GPUCRError

AUTH_RESOURCE = "kernels"
_KERNEL_ID = r"(?P<kernel_id>[A-Za-z0-9][A-Za-z0-9._-]*)"
_CHECKPOINT_ID = r"(?P<checkpoint_id>[A-Za-z0-9][A-Za-z0-9._-]*)"


class GPUCRHandler(APIHandler):
    auth_resource = AUTH_RESOURCE

    @property
    def service(self) -> Any:
        return self.settings["gpucr"]

    def body(self) -> dict[str, Any]:
        if not self.request.body:
            return {}
        try:
            data = json.loads(self.request.body)
        except ValueError:
            raise web.HTTPError(400, "The request body is not JSON.") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "The request body must be a JSON object.")
        return data

    def fail(self, e: GPUCRError) -> None:
        self.set_status(e.status)
        self.finish(json.dumps({**e.to_dict(), "reason": e.hint}))

    async def kernel_state(self, kernel_id: str) -> dict[str, Any]:
        state = self.service.state(kernel_id).to_dict()
        if state["checkpoint"]:
            await self.service.with_current_path(state["checkpoint"])
        return state


class KernelsHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        km = self.service.kernel_manager
        self.finish(json.dumps([await self.kernel_state(k) for k in km.list_kernel_ids()]))


class KernelHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, kernel_id: str) -> None:
        try:
            self.finish(json.dumps(await self.kernel_state(kernel_id)))
        except GPUCRError as e:
            self.fail(e)


class KernelActionHandler(GPUCRHandler):
    @web.authenticated
    @authorized(action="execute")
    async def post(self, kernel_id: str, action: str) -> None:
        body = self.body()
        try:
            if action == "suspend":
                engine = body.get("engine")
                if engine not in (None, "auto", "criu", "snapshot"):
                    raise web.HTTPError(400, f"Unknown engine {engine!r}: use auto, criu or snapshot.")
                st = await self.service.suspend(kernel_id, reason="manual", engine=engine)
            else:
                gpu = body.get("gpu")
                st = await self.service.resume(kernel_id, gpu=None if gpu is None else str(gpu))
        except GPUCRError as e:
            return self.fail(e)
        self.finish(json.dumps(st.to_dict()))


class CheckpointsHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        store = self.service.checkpointer.store
        self.finish(json.dumps([await self.service.with_current_path(c.summary()) for c in store.list_checkpoints()]))


class CheckpointHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self, checkpoint_id: str) -> None:
        try:
            ckpt = self.service.checkpointer.store.get(checkpoint_id)
            self.finish(json.dumps(await self.service.with_current_path(ckpt.summary())))
        except GPUCRError as e:
            self.fail(e)

    @web.authenticated
    @authorized
    async def delete(self, checkpoint_id: str) -> None:
        try:
            await self.service.delete_checkpoint(checkpoint_id)
        except GPUCRError as e:
            return self.fail(e)
        self.set_status(204)
        self.finish()


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
        svc = self.service
        self.finish(json.dumps(report(run_checks(svc.checkpointer.store, svc.config.criu_path or None))))


def handlers(base: str = "/api/gpucr") -> list[tuple[str, type]]:
    return [
        (rf"{base}/kernels", KernelsHandler),
        (rf"{base}/kernels/{_KERNEL_ID}", KernelHandler),
        (rf"{base}/kernels/{_KERNEL_ID}/(?P<action>suspend|resume)", KernelActionHandler),
        (rf"{base}/checkpoints", CheckpointsHandler),
        (rf"{base}/checkpoints/{_CHECKPOINT_ID}", CheckpointHandler),
        (rf"{base}/gpus", GpusHandler),
        (rf"{base}/doctor", DoctorHandler),
    ]

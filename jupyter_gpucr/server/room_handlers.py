"""``GET /api/gpucr/room``: what each GPU (and the host memory budget) holds, and how much of it
idle kernels hold that could be suspended to make room now (``room.py``)."""
from __future__ import annotations

import json

from jupyter_server.auth.decorator import authorized
from tornado import web

from .handlers import GPUCRHandler


class RoomHandler(GPUCRHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        self.finish(json.dumps(self.service.room.report()))


def room_handlers(base: str = "/api/gpucr") -> list[tuple[str, type]]:
    return [(rf"{base}/room", RoomHandler)]

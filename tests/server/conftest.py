"""Fixtures of the server tests that watch a real server (pytest-jupyter) from inside."""
from __future__ import annotations

from typing import Any

import pytest

from jupyter_gpucr.server.lifecycle import EVENT_SCHEMA_ID
from jupyter_gpucr.server.room import ROOM_EVENT_ID


class ServerEvents:
    """The kernel lifecycle and room events the server emitted, in the order it emitted them."""

    def __init__(self, serverapp: Any) -> None:
        self.all: list[tuple[str, dict[str, Any]]] = []  # (schema id, data)
        for schema in (EVENT_SCHEMA_ID, ROOM_EVENT_ID):
            serverapp.event_logger.add_listener(schema_id=schema, listener=self._record)

    async def _record(self, logger: Any, schema_id: str, data: dict[str, Any]) -> None:
        self.all.append((schema_id, dict(data)))

    def lifecycle(self) -> list[dict[str, Any]]:
        """The kernels' state changes and phases (``lifecycle.py``)."""
        return [data for schema, data in self.all if schema == EVENT_SCHEMA_ID]

    def room(self) -> list[dict[str, Any]]:
        """Where room was wanted, and which idle kernels were suspended for it (``room.py``)."""
        return [data for schema, data in self.all if schema == ROOM_EVENT_ID]


@pytest.fixture
def server_events(jp_serverapp: Any) -> ServerEvents:
    """What the test's server emits from now on."""
    return ServerEvents(jp_serverapp)

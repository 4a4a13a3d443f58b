"""gpucr's REST API in one table: what the Jupyter server mounts and what the Kernel Gateway
mounts are the same routes (docs/rest-api.md), so a gateway has fork, save points and room too."""
from __future__ import annotations

from .handlers import handlers
from .kernel_forks import fork_handlers
from .room_handlers import room_handlers
from .savepoints import savepoint_handlers


def routes(base: str = "/api/gpucr") -> list[tuple[str, type]]:
    """Every gpucr route under ``base``, with its handler class."""
    return [*handlers(base), *fork_handlers(base), *savepoint_handlers(base), *room_handlers(base)]

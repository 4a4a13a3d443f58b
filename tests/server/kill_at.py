"""A jupyter server extension for the fault tests: the server kills itself (SIGKILL, as ``kill -9``)
on entering a named phase of an operation, once the test has armed that phase. A kill timed from
outside rarely lands in the short windows between an operation's steps; this lands in each.

Armed by writing the phase's name into ``ARMED`` in the server's root folder; every server of the
test loads the extension, and only an armed one dies."""
from __future__ import annotations

import functools
import inspect
import os
import signal
from pathlib import Path
from typing import Any

from jupyter_gpucr.core.storage.store import Store
from jupyter_gpucr.server import fork_source
from jupyter_gpucr.server.savepoints import SavePoints
from jupyter_gpucr.server.service import KernelSuspender

ARMED = "kill-at"
#: Each phase: the method the server dies on entering.
PHASES: dict[str, tuple[type, str]] = {
    "save point: dumped, the kernel runs again": (fork_source._RunningAgain, "_set"),
    "save point: complete, before the limit": (SavePoints, "_share_with"),
    "go back: suspended, before the trash": (Store, "trash_checkpoint"),
    "go back: left state in the trash, before the copy": (SavePoints, "_prepare"),
    "go back: copy made, before the restore": (KernelSuspender, "resume"),
}


def _jupyter_server_extension_points() -> list[dict[str, str]]:
    return [{"module": __name__}]


def _load_jupyter_server_extension(app: Any) -> None:
    armed = Path(app.root_dir) / ARMED
    for phase, (owner, name) in PHASES.items():
        setattr(owner, name, _dying(getattr(owner, name), phase, armed))


def _dying(method: Any, phase: str, armed: Path) -> Any:
    def die_if_armed() -> None:
        if armed.is_file() and armed.read_text() == phase:
            os.kill(os.getpid(), signal.SIGKILL)

    if inspect.iscoroutinefunction(method):
        @functools.wraps(method)
        async def coroutine(*args: Any, **kwargs: Any) -> Any:
            die_if_armed()
            return await method(*args, **kwargs)
        return coroutine

    @functools.wraps(method)
    def function(*args: Any, **kwargs: Any) -> Any:
        die_if_armed()
        return method(*args, **kwargs)
    return function

"""Waiting for a restored process's memory to be all in, as its holder reports it (``.pages``:
``lazy``, then ``in``, or ``lost`` when the page daemon failed): a dump must see the whole memory."""
from __future__ import annotations

import time
from typing import Any

from ..criu.commands import LAZY_LOG
from ..errors import BusyError, EngineError
from ..recovery import read_pages
from ..storage.store import Store

# How long a checkpoint waits for the memory of a lazy restore of the same process to be all in.
PAGES_WAIT = 300.0


def wait_for_pages(store: Store, name: str, timeout: float = PAGES_WAIT) -> EngineError | None:
    """None once the memory of ``name`` is all in (at once when no lazy restore brings it in);
    the error to raise when its page daemon failed. Raises when it is still coming after ``timeout``."""
    deadline = time.monotonic() + timeout
    while (report := read_pages(store, name)).get("pages") == "lazy":
        if time.monotonic() > deadline:
            raise BusyError(f"The memory of {name!r} is still being restored after {timeout:.0f} s.",
                            "Wait, then retry.")
        time.sleep(0.005)
    return pages_lost(name, report)


def pages_lost(name: str, report: dict[str, Any]) -> EngineError | None:
    if report.get("pages") != "lost":
        return None
    return EngineError(f"The restored {name!r} lost its memory before all of it was back "
                       f"({report.get('error', 'the lazy-pages daemon failed')}); it was stopped.",
                       f"Restore it again: its checkpoint is intact ('gpucr restore {name}'). The page "
                       f"daemon's log: {LAZY_LOG} in the checkpoint's folder.")

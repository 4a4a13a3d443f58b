"""How a save point's dump takes the memory: only the pages written since the process's last save
point, where the kernel tracks written pages (CRIU's ``--track-mem`` and ``--prev-images-dir``;
the dump's images then take the others from that save point's, ``storage/chain.py``), else all
of it; the manifest's ``memory`` says which, and why a dump asked to be incremental is full.

The kernel tracks written pages per process (soft-dirty bits), from a tracked dump to the next:
a restored or restarted process's first save point is full, and so is one after a dump that did
not track (a suspend, a fork's) or failed, or whose last save point is gone.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from ..errors import CheckpointDamagedError, NotFoundError
from ..process.identity import start_time
from ..process.record import ProcRecord
from ..storage.chain import parent_link
from ..storage.store import Checkpoint
from .contract import CheckpointerParts

NO_TRACKING = "this machine's kernel does not track the pages a process writes (CONFIG_MEM_SOFT_DIRTY)"


@dataclass(frozen=True)
class MemoryPlan:
    """Whether the dump tracks written pages (``track``), the checkpoint it takes the unwritten
    ones from (``parent``), and why it holds every page when it was asked not to."""

    track: bool = False
    parent: Checkpoint | None = None
    why_full: str | None = None

    @property
    def prev_images(self) -> str | None:
        """``--prev-images-dir``: the parent's images, relative to the new ones."""
        return parent_link(self.parent.id) if self.parent is not None else None

    def record(self) -> dict[str, Any]:
        """The manifest's ``memory``."""
        return {"dump": "incremental" if self.parent is not None else "full", "tracked": self.track,
                "why_full": self.why_full}


def plan(cr: CheckpointerParts, rec: ProcRecord, pid: int, incremental: bool) -> MemoryPlan:
    """How the dump of ``pid`` (recorded as ``rec``) takes its memory; ``incremental``: asked to
    hold only what changed since the last save point."""
    if not incremental:
        return MemoryPlan()
    if cr.full_dumps:
        return MemoryPlan(why_full=cr.full_dumps)
    if not cr.criu.dirty_tracking:
        return MemoryPlan(why_full=NO_TRACKING)
    last = rec.get("memory_tracked")
    if not last:
        return MemoryPlan(True, why_full="the first save point of this process")
    if last.get("pid") != pid or last.get("start") != start_time(pid):
        return MemoryPlan(True, why_full="the process was restored or restarted since its last save point")
    try:
        return MemoryPlan(True, cr.store.get(last["checkpoint"]))
    except (NotFoundError, CheckpointDamagedError):
        return MemoryPlan(True, why_full="its last save point is gone")


def recorded(rec: ProcRecord, memory: MemoryPlan, cid: str | None, pid: int) -> ProcRecord:
    """The record after the dump (``cid``: the checkpoint written, None when the dump failed): a
    tracked dump is the next one's parent; after any other dump, or a failed one (the kernel may
    have started tracking anew), there is none."""
    out = cast(ProcRecord, {k: v for k, v in rec.items() if k != "memory_tracked"})
    if memory.track and cid is not None:
        out["memory_tracked"] = {"checkpoint": cid, "pid": pid, "start": start_time(pid)}
    return out

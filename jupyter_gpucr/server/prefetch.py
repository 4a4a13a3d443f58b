"""Reading a suspended kernel's checkpoint into the page cache when a client opens it (its
notebook, or a reconnect), so that a restore that follows reads memory, not disk."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from ..core.storage import pagecache
from ..core.storage.store import Checkpoint, Store
from .config import GPUCR
from .engines import OFFLOAD_DIR


class Prefetcher:
    """Reads ahead once per checkpoint, in the background; never restores, never fails the client
    (a damaged checkpoint says so to whatever restores it)."""

    def __init__(self, store: Store, config: GPUCR, log: Any) -> None:
        self.store = store
        self.options = config
        self.log = log
        self._done: dict[str, str] = {}  # kernel id -> the checkpoint id read into the page cache
        self._tasks: set[asyncio.Task[None]] = set()

    def opened(self, kernel_id: str) -> None:
        """A client opened the suspended kernel ``kernel_id``: read its latest checkpoint ahead."""
        try:
            ckpt = self.store.latest(kernel_id) if self.options.prefetch_on_open else None
            parents = [a.path for a in ckpt.ancestors()] if ckpt is not None else []  # pages it takes from them
        except Exception as e:  # damaged, or the store unreadable: only the read-ahead is lost
            self.log.warning("gpucr: the checkpoint of kernel %s was not read ahead: %s", kernel_id, e)
            return
        if ckpt is None or self._done.get(kernel_id) == ckpt.id:
            return
        self._done[kernel_id] = ckpt.id
        task = asyncio.ensure_future(self._read(kernel_id, ckpt, parents))
        self._tasks.add(task)  # kept referenced until it ends
        task.add_done_callback(self._tasks.discard)

    def forget(self, kernel_id: str) -> None:
        self._done.pop(kernel_id, None)

    async def _read(self, kernel_id: str, ckpt: Checkpoint, parents: list[Path]) -> None:
        t0 = time.perf_counter()
        done = await asyncio.to_thread(pagecache.prefetch, [ckpt.path, *parents, self.store.proc_dir(kernel_id) / OFFLOAD_DIR])
        self.log.debug("gpucr: read %d MiB of the checkpoint of kernel %s into the page cache in %.2f s (a client "
                      "opened it)", done >> 20, kernel_id, time.perf_counter() - t0)

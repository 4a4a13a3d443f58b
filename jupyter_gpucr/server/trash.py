"""What becomes of a kernel's checkpoints when the user ends it: a kernel shut down or restarted
while on disk goes to the trash (for ``c.GPUCR.trash_hours``), from where it can be listed
again under its old id; a running kernel shut down loses its checkpoints, which are stale.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

from ..core.backend import CheckpointBackend
from ..core.errors import GPUCRError, NotFoundError, StateError
from ..core.storage.store import Store
from .config import GPUCR
from .kernels import Kernels
from .lifecycle import RUNNING, KernelLifecycle
from .remote import RemoteKernels


class KernelReplacedError(StateError):
    """A trashed kernel's id is taken by the fresh kernel its restart started. Restoring shuts
    that one down (``replace``), which only the user can decide."""

    def __init__(self, notebook_path: str | None) -> None:
        what = os.path.basename(notebook_path) if notebook_path else "This kernel"
        super().__init__(f"{what} was restarted after its state was saved: a new kernel runs in its place.",
                         "Restore with {\"replace\": true} to shut the new kernel down and bring the saved one back.")


class Trash:
    """The trash of one server's store (see the module docstring)."""

    def __init__(self, config: GPUCR, checkpointer: CheckpointBackend, kernel_manager: Kernels,
                 lifecycle: KernelLifecycle, remote: RemoteKernels | None, log: Any) -> None:
        self.options = config
        self.checkpointer = checkpointer
        self.kernel_manager = kernel_manager
        self.lifecycle = lifecycle
        self.remote = remote
        self.log = log

    @property
    def store(self) -> Store:
        return self.checkpointer.store

    @property
    def max_age_s(self) -> float:
        return self.options.trash_hours * 3600

    def shelve(self, kernel_id: str, reason: str, notebook_path: str | None, restored_at: float | None) -> None:
        """The user shut down or restarted a kernel that is on disk: its checkpoint goes to the
        trash. After a restart the fresh kernel's state says so, for whoever looks next."""
        if self.remote:
            self.remote.forget_later(kernel_id)
        trash_id = self.store.trash(kernel_id, reason, {"notebook_path": notebook_path})
        self.log.info("gpucr: the saved state of kernel %s is in the trash as %s for %s h (%s)", kernel_id, trash_id,
                      self.options.trash_hours, reason)
        if reason == "restart":
            self.lifecycle.transition(kernel_id, RUNNING, "done", restored_at=restored_at, notebook_path=notebook_path,
                                      warnings=[
                f"Restarted fresh: the variables of the suspended kernel are gone from it; its saved state is in "
                f"the trash ({trash_id}) for {self.options.trash_hours:g} h."])

    def discard(self, kernel_id: str) -> None:
        """A running kernel was shut down: its checkpoints are stale, and hold its memory."""
        if self.remote:
            self.remote.forget_later(kernel_id)
        try:
            self.checkpointer.remove(kernel_id, kill=False)
        except NotFoundError:
            pass
        except GPUCRError as e:
            self.log.warning("gpucr: the checkpoints of kernel %s were not removed: %s", kernel_id, e)

    def contents(self) -> list[dict[str, Any]]:
        """What is in the trash, once what is older than ``trash_hours`` is gone."""
        self.store.purge_trash(self.max_age_s)
        return self.store.list_trash(self.max_age_s)

    def delete(self, trash_id: str) -> None:
        self.store.delete_trash(trash_id)

    async def take_out(self, trash_id: str, replace: bool) -> str:
        """Move a trashed kernel's checkpoints back under its old id, which is returned.

        After a restart the fresh kernel has that id: ``replace`` shuts it down first (its state
        is lost, or goes to the trash if it is on disk), else :class:`KernelReplacedError`."""
        items = {t["id"]: t for t in self.store.list_trash(self.max_age_s)}
        item = items.get(trash_id)
        if item is None:
            raise NotFoundError(f"Nothing in the trash is called {trash_id!r}.", "List it with GET /api/gpucr/trash.")
        kernel_id = item.get("kernel_id")
        if kernel_id and kernel_id in self.kernel_manager:
            if not replace:
                raise KernelReplacedError(item.get("notebook_path"))
            self.log.info("gpucr: shutting down kernel %s, restarted since it went to the trash, to restore %s",
                          kernel_id, trash_id)
            await self.kernel_manager.shutdown_kernel(kernel_id)
            await self._drop_connections(kernel_id)
        return self.store.untrash(trash_id)

    async def _drop_connections(self, kernel_id: str, timeout: float = 2.0) -> None:
        """Close the websockets of a kernel just shut down under an id that is about to be listed
        again: jupyter_server leaves them open, connected to the gone process, and a request sent
        on one would never be answered. Their clients reconnect, to the kernel listed again. Waits
        (bounded) until they are gone, so that none is counted against the kernel listed again."""
        for conn in self.kernel_manager.connections_of(kernel_id):
            handler = getattr(conn, "websocket_handler", None)
            if handler is not None:
                handler.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self.kernel_manager.connections_of(kernel_id) and loop.time() < deadline:
            await asyncio.sleep(0.02)

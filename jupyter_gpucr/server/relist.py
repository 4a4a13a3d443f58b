"""Listing kernels on disk: at start, every kernel an earlier server left on disk (or running), so
none is lost; later, a kernel taken out of the trash or suspended into object storage elsewhere.

A kernel on disk is listed under its old id, suspended, with its notebook sessions; it restores
on first use.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, cast

from ..core.backend import CheckpointBackend
from ..core.errors import CheckpointDamagedError, GPUCRError
from ..core.jsonfile import read_json
from ..core.process.procs import is_alive, tree
from ..core.storage.store import GO_BACK, Checkpoint, Store
from .engines import OFFLOAD_DIR
from .kernels import Kernels
from .lifecycle import SUSPENDED, KernelLifecycle, KernelState
from .ports import HeldPorts
from .preparation import KERNEL_RECORD, SavedReplies
from .remote import RemoteKernels


def latest(store: Store, kernel_id: str) -> Checkpoint:
    """The kernel's latest checkpoint; a kernel on disk without one cannot be restored."""
    ckpt = store.latest(kernel_id)
    if ckpt is None:
        raise CheckpointDamagedError(f"The checkpoint of kernel {kernel_id} is missing from {store.root}.",
                                     "Nothing can be restored; shut the kernel down to start a fresh one.")
    return ckpt


class Relister:
    """Lists the kernels on disk of one server's store (see the module docstring)."""

    def __init__(self, checkpointer: CheckpointBackend, kernel_manager: Kernels, lifecycle: KernelLifecycle,
                 saved: SavedReplies, remote: RemoteKernels | None, ports: HeldPorts, log: Any) -> None:
        self.checkpointer = checkpointer
        self.kernel_manager = kernel_manager
        self.lifecycle = lifecycle
        self.saved = saved
        self.remote = remote
        self.ports = ports
        self.log = log

    @property
    def store(self) -> Store:
        return self.checkpointer.store

    async def relist_at_start(self) -> None:
        """After a clean stop or a crash of an earlier server with this store: finish what it
        left half done, then list every kernel of it that is on disk (a kernel it left running
        goes to disk first), so none is lost."""
        await asyncio.to_thread(self._undo_cut_go_backs)
        for name, outcome in (await asyncio.to_thread(self.checkpointer.recover_all)).items():
            self.log.info("gpucr: recovery of %s: %s", name, outcome.message)
        for name in self.store.proc_names():
            if name in self.kernel_manager:
                continue
            try:
                await self._relist(name)
            except GPUCRError as e:
                self.log.error("gpucr: kernel %s could not be listed again: %s", name, e)
        if self.remote:  # unfinished uploads, and the kernels suspended into the store elsewhere
            await self.remote.relist(set(self.kernel_manager.list_kernel_ids()), self.list_on_disk)
        self.store.collect_garbage(set(self.store.proc_names()))

    def _undo_cut_go_backs(self) -> None:
        """A server that died going back to a save point after the state the kernel left went to
        the trash, and before the copy of the save point it goes back to was made, left the kernel
        in no checkpoint (``savepoints.py``): that state is put back, as if the go-back had not
        begun. Its record names it still (a finished go-back's names the copy)."""
        for item in self.store.list_trash():
            name = item["name"]
            if item["reason"] != GO_BACK or self.store.read_proc(name).get("checkpoint") not in item["checkpoints"]:
                continue
            with contextlib.suppress(CheckpointDamagedError):
                ckpt = self.store.latest(name)
                if ckpt is None or ckpt.created < item["trashed_at"]:
                    self.store.put_back_trashed_checkpoint(item["id"], (OFFLOAD_DIR,))
                    self.log.warning("gpucr: kernel %s was going back to a save point when the server died; it is "
                                     "listed in the state it was in before (%s)", name, item["checkpoints"][0])

    async def _relist(self, name: str) -> None:
        rec = self.store.read_proc(name)
        ckpt = self.store.latest(name)
        kernel = (ckpt.manifest.get("kernel") if ckpt else None) or read_json(self.store.proc_dir(name) / KERNEL_RECORD)
        if not kernel:
            return  # a `gpucr run` process: not the server's to list
        if rec.get("state") == "running" and is_alive(rec.get("pid")):
            ckpt = await self._put_on_disk(name, ckpt, kernel)
        if ckpt is not None:
            await self.list_on_disk(name, ckpt)

    async def _put_on_disk(self, name: str, ckpt: Checkpoint | None, kernel: dict[str, Any]) -> Checkpoint:
        """An earlier server died while this kernel ran: before its first suspend, during or
        after a restore. It goes to disk now, so this server can list it."""
        m = ckpt.manifest if ckpt else {"engine": "criu"}
        if m.get("engine") != "criu" and ckpt is not None:
            for pid in reversed(tree(cast(int, self.store.read_proc(name)["pid"]))):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            self.log.warning("gpucr: kernel %s ran from saved variables when the server died; it is listed with "
                             "the variables saved at its last suspend", name)
            return ckpt
        self.log.warning("gpucr: kernel %s was left running by an earlier server; suspending it to list it again", name)
        extra = {"kernel": kernel, "engine_reason": m.get("engine_reason") or "whole process, after a server crash"}
        return await asyncio.to_thread(self.checkpointer.checkpoint, name, False, "recovered", extra)

    async def list_on_disk(self, name: str, ckpt: Checkpoint, sessions: bool = True) -> KernelState:
        """List ``name`` as a suspended kernel of this server, in ``ckpt``; ``sessions``: with
        its notebook sessions (see ``KernelSuspender.restore_from_trash``)."""
        kernel = ckpt.manifest["kernel"]
        await self.kernel_manager.list_suspended(kernel if sessions else {**kernel, "sessions": []})
        self.saved.keep(name, kernel.get("saved_replies") or {"kernel_info": kernel.get("kernel_info")})
        rec = self.store.read_proc(name)
        st = KernelState(name, state=SUSPENDED, kind=ckpt.kind, engine=ckpt.manifest.get("engine"),
                         engine_reason=ckpt.manifest.get("engine_reason"), checkpoint=ckpt.summary(),
                         suspended_at=rec.get("suspended_at") or ckpt.created, notebook_path=kernel.get("notebook_path"),
                         lost=ckpt.manifest.get("snapshot", {}).get("lost", []))
        self.lifecycle.adopt(st)
        self.ports.hold_anew(name, ckpt)  # nobody else takes them until its restore
        self.log.info("gpucr: kernel %s is suspended on disk (%s); it restores on first use", name, ckpt.id)
        return st

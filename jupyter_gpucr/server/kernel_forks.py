"""Fork a kernel: ``POST /api/gpucr/kernels/{id}/fork`` with ``{"count": N, "gpu": "auto"}``.

The copies are made by the core (``core/forks/copies.py``), restored N times, each in namespaces of its
own, from the checkpoint a suspended source is in, or from one of a running source taken as a
suspend takes it, which leaves the source running (``fork_source.py``). Here
each copy becomes a kernel of this server under a new id, listed in ``/api/kernels``, with a
connection file of its own: the same key, and the host ports of the relay that leads to the
copy's ports (see ``core/process/relay.py``). Only the server's own whole-process engine forks; through
the gpucr daemon (unprivileged users) forking is not available yet.
"""
from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

from jupyter_client.provisioning import KernelProvisionerFactory
from jupyter_server._tz import utcnow

from ..core.errors import EngineError, NotFoundError, PreconditionError, StateError
from ..core.files import make_private_dir
from ..core.forks import netns
from ..core.process.running import Running
from ..core.storage.store import Checkpoint
from . import kernel_rpc
from .engines import OFFLOAD_DIR, SuspendEngine, _offloaded_by_gpu
from .fork_source import checkpoint_running
from .kernels import KernelOperations
from .lifecycle import RUNNING, SUSPENDED
from .relist import latest

#: More copies than this in one request is a typo, not a plan (each holds the source's memory).
MAX_FORKS = 16
_PORTS = ("shell_port", "iopub_port", "stdin_port", "control_port", "hb_port")


class KernelForker:
    """Forks the kernels of one server (built once, in ``runtime.py``)."""

    def __init__(self, ops: KernelOperations, criu: SuspendEngine) -> None:
        self.ops = ops
        self.kernel_manager = ops.kernel_manager
        self.criu = criu  # the whole-process engine, whose checks a fork's source passes

    async def fork(self, kernel_id: str, count: int = 1, gpu: str = "auto") -> tuple[list[str], dict[str, Any] | None]:
        """The ids of ``count`` new kernels holding what ``kernel_id`` holds (see the module
        docstring), and where a running source's pause went (None for a suspended one)."""
        km = self._source(kernel_id, count)
        ids = [str(uuid.uuid4()) for _ in range(count)]
        async with self.ops.operation(kernel_id):
            self._check_state(kernel_id, km)
            source = None
            if self.ops.lifecycle.state_of(kernel_id) == RUNNING:
                source = await checkpoint_running(self.ops, kernel_id, km)
                ckpt, tensors = source.checkpoint, source.tensors
            else:  # suspended (``_check_state``): its newest checkpoint is the one it is in
                ckpt, tensors = latest(self.ops.store, kernel_id), self._offloaded(kernel_id)
            try:
                await self.make(km, kernel_id, ids, gpu, ckpt, tensors)
            except BaseException:
                if source is not None:
                    await asyncio.to_thread(source.discard, self.ops)
                raise
        if source is not None:  # the copies hold what they need: the reply need not wait for the deletion
            _in_background(asyncio.to_thread(source.discard, self.ops))
        return ids, source.report if source else None

    async def make(self, km: Any, kernel_id: str, ids: list[str], gpu: str, ckpt: Checkpoint,
                    tensors: Path | None) -> None:
        """Restore the copies from ``ckpt``, list them and have each take the GPU tensors back
        from links of its own to the files in ``tensors``; all of them or none."""
        beside = _offloaded_by_gpu(ckpt, tensors) if tensors else {}
        forks = await asyncio.to_thread(self.ops.checkpointer.fork, kernel_id, names=ids, gpu=gpu, detach=False,
                                        gpu_bytes_beside=beside, checkpoint_id=ckpt.id)
        try:
            for running in forks:
                await self._list(km, running)
                await kernel_rpc.follow_moved_history(self.kernel_manager.get_kernel(running.name), running.relocated)
            if tensors:  # side by side: each copy reads its files while another copies to the GPU
                refilled = await asyncio.gather(*(self._refill(r.name, tensors) for r in forks), return_exceptions=True)
                for outcome in refilled:
                    if isinstance(outcome, BaseException):
                        raise outcome
        except BaseException:
            for running in forks:
                await self._drop(running.name)
            raise

    def _offloaded(self, kernel_id: str) -> Path | None:
        """The folder of GPU tensors a suspended kernel moved out before its suspend (it takes them
        back itself after a restore: see ``gpucr_hooks.offload``), if any."""
        tensors = self.ops.store.proc_dir(kernel_id) / OFFLOAD_DIR
        return tensors if tensors.is_dir() else None

    async def _refill(self, fork_id: str, tensors: Path) -> None:
        """A fork of a GPU kernel takes the tensors back from links of its own to its source's
        files (the refill deletes the folder it read: a suspended source's stays for its resume)."""
        own = make_private_dir(self.ops.store.proc_dir(fork_id) / OFFLOAD_DIR)
        for f in tensors.iterdir():
            os.link(f, own / f.name)
        try:
            await kernel_rpc.with_client(self.kernel_manager.get_kernel(fork_id), kernel_rpc.reload_from, own)
        except kernel_rpc.SnapshotError as e:
            raise EngineError(f"A fork could not take its GPU tensors back: {e}",
                              "No fork was made; the source is as it was. Free GPU memory and retry.") from e

    def _source(self, kernel_id: str, count: int) -> Any:
        if kernel_id not in self.kernel_manager:
            raise NotFoundError(f"No kernel {kernel_id}.", "List kernels with GET /api/kernels.")
        if not 1 <= count <= MAX_FORKS:
            raise StateError(f"Cannot make {count} forks.", f"Ask for 1 to {MAX_FORKS}.")
        why_not = self.ops.checkpointer.cannot_fork()
        if why_not:
            raise PreconditionError(f"Kernels of this server cannot be forked: {why_not}.",
                                    "Suspend and restore work as before.")
        return self.kernel_manager.get_kernel(kernel_id)

    def _check_state(self, kernel_id: str, km: Any) -> None:
        state = self.ops.lifecycle.state_of(kernel_id)
        if state == RUNNING:
            problem = self.criu.problem(km)
            if problem:
                raise PreconditionError(f"This kernel cannot be forked: {problem}.",
                                        "Forks are made by the whole-process engine.")
            if km.execution_state == "busy":
                raise StateError("The kernel is running a cell.", "Fork it when the cell has finished.")
        elif state == SUSPENDED:
            ckpt = self.ops.store.latest(kernel_id)
            if ckpt is None or ckpt.manifest.get("engine") != "criu":
                raise PreconditionError("This kernel was suspended as saved variables, which cannot be forked.",
                                        "Resume it, then fork it.")
        else:
            raise StateError(f"The kernel is {state}.", "Fork it once it is running or suspended.")

    async def _list(self, source: Any, running: Running) -> None:
        """List a restored copy as a running kernel of this server (as ``list_suspended`` lists a
        kernel on disk, but with its process adopted)."""
        mkm = self.kernel_manager
        kernel_id = running.name
        info = _relayed(source.get_connection_info(), netns.routes_of(dict(running.record)) or [])
        km = mkm.kernel_manager_factory(
            parent=mkm, log=mkm.log, kernel_name=source.kernel_name, owns_kernel=True,
            connection_file=mkm.connection_dir and f"{mkm.connection_dir}/kernel-{kernel_id}.json")
        km.kernel_id = kernel_id
        km.load_connection_info(info)
        km.write_connection_file()
        km.provisioner = KernelProvisionerFactory.instance(parent=mkm).create_provisioner_instance(
            kernel_id, km.kernel_spec, parent=km)
        km.provisioner.connection_info = info
        km.provisioner.cwd = getattr(source.provisioner, "cwd", None)
        km.provisioner.adopt(running.started)
        # jupyter_client keeps the launch arguments (for restarts) and the readiness state only in
        # these private attributes (checked against jupyter_client 8.10), as list_suspended sets them.
        km._launch_args = dict(getattr(source, "_launch_args", None) or {})
        km._ready = asyncio.get_running_loop().create_future()
        km._ready.set_result(None)
        km._attempted_start = True
        km.execution_state = "idle"
        km.last_activity = utcnow()
        km.reason = ""
        mkm._kernels[kernel_id] = km
        mkm._kernel_connections[kernel_id] = 0
        mkm._kernel_ports[kernel_id] = km.ports
        await mkm.reattach_kernel(kernel_id, wake=False)
        self.ops.remember(kernel_id, km)

    async def _drop(self, kernel_id: str) -> None:
        if kernel_id in self.kernel_manager:
            await self.kernel_manager.shutdown_kernel(kernel_id, now=True)
        else:
            await asyncio.to_thread(self.ops.checkpointer.remove, kernel_id, True)


#: Deletions of running sources' fork checkpoints still in progress (kept referenced until they end).
_DISCARDING: set[asyncio.Task[None]] = set()


def _in_background(work: Any) -> None:
    task = asyncio.ensure_future(work)
    _DISCARDING.add(task)
    task.add_done_callback(_DISCARDING.discard)


def _relayed(info: dict[str, Any], routes: list[netns.Route]) -> dict[str, Any]:
    """The source's connection info with each port replaced by the host port that leads to it."""
    by_inner = {r.inner: r.port for r in routes}
    missing = [info[p] for p in _PORTS if info.get(p) not in by_inner]
    if missing:
        raise PreconditionError(f"The fork does not listen on the kernel's ports {missing} on loopback or every "
                                "address, so it cannot be reached.", "Kernels that listen on 127.0.0.1 can be forked.")
    return {**info, **{p: by_inner[info[p]] for p in _PORTS}}

"""The checkpoint a running kernel's forks are restored from, taken as a suspend takes one.

Through the driver's checkpoint alone a kernel's GPU memory is copied at about 2 GB/s, and the
source is paused for all of it (W2: 7.7-13.1 s). So the source goes through the suspend's steps
instead: its clients' messages are held, it trims itself and moves its GPU tensors into files
beside its image (``gpucr_hooks.offload``, about 50 GB/s), CRIU dumps it and leaves it running
(the driver copies only what is left), and it takes its tensors back, as after a failed suspend;
then the held messages reach it. It is paused about as long as a suspend takes, less the image's
verification and flush to disk, which run on after it runs again (the files it writes are copied
first, as they were at the dump: ``core.criu.images.RunningAgain``). Each fork takes the tensors
back from links of its own to those files.

That checkpoint is useless without the files, which are deleted once the forks hold their tensors:
it is deleted with them (:meth:`SourceCheckpoint.discard`). When the source cannot take its
tensors back, it keeps running without them and the error says how to get them back: they stay
in the folder a suspend would have left them in (``gpucr_hooks.reload_tensors`` refills from it,
as does the kernel's next resume).
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.criu.images import RegFile
from ..core.errors import EngineError, NotFoundError, StateError
from ..core.files import make_private_dir
from ..core.forks.copies import keep_written_files
from ..core.storage.store import Checkpoint
from . import kernel_rpc
from .engines import OFFLOAD_DIR
from .kernels import KernelOperations

#: Links to the source's offloaded tensor files, kept for its forks while the source takes the files back.
FORK_TENSORS = "fork-tensors"
#: How long the fork waits for requests the kernel already received to finish (as a suspend does).
REPLY_GRACE_S = 2.0


@dataclass
class SourceCheckpoint:
    """A running kernel's checkpoint for its forks; ``tensors``: links to its offloaded GPU tensors
    (None when it had none on the GPU); ``report``: where the source's pause went."""

    checkpoint: Checkpoint
    tensors: Path | None
    report: dict[str, Any] = field(default_factory=dict)

    def discard(self, ops: KernelOperations) -> None:
        """Delete the checkpoint and the links once the forks are made (or not): neither restores
        anything without the other."""
        if self.tensors is not None:
            shutil.rmtree(self.tensors, ignore_errors=True)
        with contextlib.suppress(NotFoundError):
            ops.store.delete(self.checkpoint.id)


async def checkpoint_running(ops: KernelOperations, kernel_id: str, km: Any, reason: str = "fork",
                             extra: dict[str, Any] | None = None, detach: str | None = None,
                             incremental: bool = False, save_point_after: Sequence[Path] | None = None) -> SourceCheckpoint:
    """See the module docstring. Raises (the kernel running, with its tensors if at all possible)
    when the checkpoint cannot be made. ``reason`` and ``extra``: the checkpoint's (a save point's
    are ``savepoint`` and its name: ``server/savepoints.py``). ``detach`` (the kernel's
    execution state, reported meanwhile): the server's own connections to the kernel are closed
    for the dump, as for a suspend, and opened again after it: an image restored under the kernel's own id, in the host's network (a save point gone
    back to), must hold no connection to this server (a fork's namespace cuts them instead).
    ``incremental``: the dump holds only what changed since the kernel's last save point, where
    the kernel tracks written pages (``core/steps/incremental.py``); ``save_point_after``: the
    tensor folders of its earlier save points, whose files the tensors unchanged since are linked
    from (``kernel_rpc.offload``)."""
    store = ops.store
    offload_to = store.proc_dir(kernel_id) / OFFLOAD_DIR
    kept = store.proc_dir(kernel_id) / FORK_TENSORS
    shutil.rmtree(kept, ignore_errors=True)  # left by a server that died in the middle of a fork
    report: dict[str, Any] = {}
    t0 = time.perf_counter()
    dumping: asyncio.Future[Checkpoint] | None = None
    try:
        async with _held(ops.kernel_manager, kernel_id):
            moved = await _move_tensors_out(ops, km, offload_to, save_point_after)
            report.update(moved)
            t1 = time.perf_counter()
            detached = False
            try:
                if detach is not None:
                    await ops.kernel_manager.detach_kernel(kernel_id, detach)
                    detached = True
                again = _RunningAgain()
                dumping = asyncio.ensure_future(asyncio.to_thread(
                    ops.checkpointer.checkpoint, kernel_id, True, reason, {**(extra or {}), "offload": moved.get("offload")},
                    incremental=incremental, running_again=again))
                await again.or_done(dumping)
                if again.at is not None:
                    cid, files = again.at
                    await asyncio.to_thread(keep_written_files, cid, store.proc_dir(kernel_id), files)
                else:  # the backend answered once complete (the daemon)
                    await asyncio.to_thread(keep_files, ops, dumping.result())
                if offload_to.is_dir():
                    link_all(offload_to, kept)
            finally:
                if detached:
                    await ops.kernel_manager.reattach_kernel(kernel_id, wake=False)
                t2 = time.perf_counter()
                report["checkpoint_s"] = round(t2 - t1, 3)
                report["reload"] = await _tensors_back(ops, kernel_id, km, offload_to)
                report["reload_s"] = round(time.perf_counter() - t2, 3)
        report["paused_s"] = round(time.perf_counter() - t0, 3)
        t3 = time.perf_counter()
        ckpt = await dumping
        report["dump"] = ckpt.manifest.get("timings", {})
        report["finish_s"] = round(time.perf_counter() - t3, 3)
    except BaseException:
        shutil.rmtree(kept, ignore_errors=True)
        if dumping is not None:
            (made,) = await asyncio.gather(dumping, return_exceptions=True)  # its thread runs on: wait for it
            if isinstance(made, Checkpoint):
                with contextlib.suppress(NotFoundError):
                    store.delete(made.id)
        raise
    ops.log.info("gpucr: kernel %s was paused %.2f s for its %s (%d MiB of GPU tensors moved out and back)",
                     kernel_id, report["paused_s"], "save point" if reason == "savepoint" else reason, (report.get("offload") or {}).get("bytes", 0) >> 20)
    return SourceCheckpoint(ckpt, kept if kept.is_dir() else None, report)


class _RunningAgain:
    """Told from the checkpoint's thread when the kernel runs again, before its checkpoint is
    verified and durable (``core.criu.images.RunningAgain``): its messages need not wait for that."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()
        self.at: tuple[str, list[RegFile]] | None = None  # the checkpoint's id, its image's files

    def __call__(self, cid: str, files: list[RegFile]) -> None:
        self.loop.call_soon_threadsafe(self._set, cid, files)

    def _set(self, cid: str, files: list[RegFile]) -> None:
        self.at = (cid, files)
        self.event.set()

    async def or_done(self, dumping: asyncio.Future[Checkpoint]) -> None:
        """Until the kernel runs again or the checkpoint ended; raises what the checkpoint raised."""
        told: asyncio.Future[Any] = asyncio.ensure_future(self.event.wait())
        try:
            await asyncio.wait({told, dumping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            told.cancel()
        if dumping.done() and self.at is None:
            dumping.result()


def keep_files(ops: KernelOperations, ckpt: Checkpoint) -> None:
    """``keep_written_files`` for a kernel's checkpoint, its files named by the backend (the
    daemon reads images the server cannot)."""
    keep_written_files(ckpt.id, ops.store.proc_dir(ckpt.name), ops.checkpointer.image_files(ckpt))


@contextlib.asynccontextmanager
async def _held(mkm: Any, kernel_id: str) -> AsyncIterator[None]:
    """The clients' messages wait in the server while the block runs, and reach the kernel after
    it, whatever happened (the kernel runs on either way)."""
    mkm.hold_messages(kernel_id)
    try:
        if await mkm.wait_for_replies(kernel_id, REPLY_GRACE_S):
            raise StateError("The kernel is still answering a request.", "Fork it once it is idle.")
        yield
    finally:
        await mkm.wake_connections(kernel_id)


async def _move_tensors_out(ops: KernelOperations, km: Any, offload_to: Path,
                            save_point_after: Sequence[Path] | None) -> dict[str, Any]:
    """Have the kernel trim itself and move its GPU tensors into ``offload_to``, as before a
    suspend. Neither may stop the fork (the driver's checkpoint takes what stays on the GPU), so
    failures only log."""
    options = ops.options
    report: dict[str, Any] = {}
    t0 = time.perf_counter()
    client = kernel_rpc.own_client(km)
    client.start_channels()
    try:
        if options.trim_before_suspend:
            report["trim"] = await kernel_rpc.prepare_suspend(client, timeout=60)
        if options.offload_gpu_tensors:
            report["offload"] = await kernel_rpc.offload(client, offload_to, "trim" not in report, save_point_after or (),
                                                         save_point=save_point_after is not None)
    except Exception as e:
        ops.log.warning("gpucr: the kernel did not move its GPU tensors out before its fork: %s", e)
    finally:
        client.stop_channels()
    report["move_out_s"] = round(time.perf_counter() - t0, 3)
    return report


async def _tensors_back(ops: KernelOperations, kernel_id: str, km: Any, offload_to: Path) -> dict[str, Any] | None:
    """The source takes its GPU tensors back from ``offload_to`` (which the refill deletes)."""
    if not offload_to.is_dir():
        return None
    try:
        return dict(await kernel_rpc.with_client(km, kernel_rpc.reload))
    except Exception as e:
        ops.log.error("gpucr: kernel %s could not take its GPU tensors back after its fork's checkpoint: %s",
                          kernel_id, e)
        raise EngineError(f"The kernel could not take its GPU tensors back after the fork's checkpoint: {e}. "
                          "No fork was made; the kernel runs, without those tensors.",
                          f"They are kept in {offload_to}: free GPU memory, then run 'import gpucr_hooks; "
                          "gpucr_hooks.reload_tensors()' in the kernel to take them back.") from e


def link_all(folder: Path, links: Path) -> None:
    """Hard links to each file of ``folder`` in the new folder ``links``."""
    make_private_dir(links)
    for f in folder.iterdir():
        os.link(f, links / f.name)

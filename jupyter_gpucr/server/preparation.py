"""The kernel's own part of its suspend, asked of it over its channels before it is checkpointed.

It says what a suspended kernel answers from disk (its saved replies, kept here for its dormant
connections), trims itself, and moves its GPU tensors into files beside its image; a suspend
that fails has it take them back. Beside its process files lies the record a later server lists
it again from, should this one die before the kernel was ever suspended.
"""
from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from ..core.jsonfile import write_json_atomic
from ..core.storage.store import Store
from . import kernel_rpc
from .config import GPUCR
from .dormant import Saved
from .engines import OFFLOAD_DIR
from .provisioner import GPUCRProvisioner

#: A kernel's record beside its process files (procs/KERNEL_ID/), for listing it after a crash.
KERNEL_RECORD = "kernel.json"
#: Beside them too: the GPU tensor files of each of the kernel's save points (``savepoints.py``).
SAVEPOINT_TENSORS = "savepoint-tensors"


class SavedReplies:
    """What each kernel said at its suspend, for its dormant connections to answer from. Kept in
    memory; the checkpoint's manifest holds a copy for the next server."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._by_kernel: dict[str, dict[str, Any]] = {}

    def keep(self, kernel_id: str, replies: dict[str, Any]) -> None:
        self._by_kernel[kernel_id] = replies

    def forget(self, kernel_id: str) -> None:
        self._by_kernel.pop(kernel_id, None)

    def of(self, kernel_id: str) -> Saved:
        """The kernel's saved replies, and its own history database if it has one."""
        history = self.store.proc_dir(kernel_id) / kernel_rpc.HISTORY_FILE
        return Saved(self._by_kernel.get(kernel_id, {}), history if history.exists() else None)


def save_point_tensors(store: Store, kernel_id: str) -> list[Path]:
    """The folders of the kernel's save points' GPU tensors, newest first: its offloads link the
    tensors unchanged since its last save point from them."""
    root = store.proc_dir(kernel_id) / SAVEPOINT_TENSORS
    return sorted(root.iterdir(), key=lambda p: p.stat().st_mtime, reverse=True) if root.is_dir() else []


async def prepare(km: Any, options: GPUCR, log: Any, trim: bool, offload_to: Path | None,
                  reuse: list[Path]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Save the replies a suspended kernel answers from disk, have it trim itself and move
    its GPU tensors out (those unchanged since its last save point linked from ``reuse``:
    ``save_point_tensors``). None of these may block a suspend (the driver checkpoint takes
    whatever stays on the GPU), so failures only log."""
    client = kernel_rpc.own_client(km)
    client.start_channels()
    saved: dict[str, Any] = {}
    report: dict[str, Any] | None = None
    try:
        saved = await kernel_rpc.saved_replies(client)
        if trim and options.trim_before_suspend:
            report = await kernel_rpc.prepare_suspend(client, timeout=60)
        if offload_to is not None and options.offload_gpu_tensors:
            moved = await kernel_rpc.offload(client, offload_to, report is None, reuse)
            report = {**(report or {}), "offload": moved}
    except Exception as e:
        log.warning("gpucr: kernel did not answer before the suspend: %s", e)
    finally:
        client.stop_channels()
    return saved, report


@contextlib.asynccontextmanager
async def tensors_back_on_failure(store: Store, kernel_id: str, km: Any, log: Any) -> AsyncIterator[None]:
    """A suspend that fails leaves the kernel running: it takes back the GPU tensors it had
    offloaded for it (before the server reconnects and delivers the held messages)."""
    try:
        yield
    except BaseException:
        if (store.proc_dir(kernel_id) / OFFLOAD_DIR).exists():
            try:
                report = await kernel_rpc.with_client(km, kernel_rpc.reload)
                log.info("gpucr: kernel %s took its GPU tensors back after a failed suspend (%d MiB)", kernel_id,
                         report.get("bytes", 0) >> 20)
            except Exception as e:
                log.error("gpucr: kernel %s could not take its GPU tensors back after a failed suspend: %s",
                          kernel_id, e)
        raise


def remember(store: Store, kernel_id: str, km: Any) -> None:
    """Write down, beside a checkpointable kernel's process files, what a later server needs
    to list it again should this one die before the kernel was ever suspended."""
    if not isinstance(km.provisioner, GPUCRProvisioner):
        return
    write_json_atomic(store.proc_dir(kernel_id) / KERNEL_RECORD, {
        "kernel_id": kernel_id, "kernel_name": km.kernel_name, "connection_info": _jsonable(km.get_connection_info()),
        "cwd": str(getattr(km.provisioner, "cwd", "") or ""), "sessions": []})


def kernel_record(kernel_id: str, km: Any, saved: dict[str, Any], sessions: list[dict[str, Any]]) -> dict[str, Any]:
    """What a later server needs to list the kernel again and answer for it (in the checkpoint's manifest)."""
    return {
        "kernel_id": kernel_id, "kernel_name": km.kernel_name, "connection_info": _jsonable(km.get_connection_info()),
        "kernel_info": saved.get("kernel_info"), "saved_replies": saved, "sessions": sessions,
        "cwd": str(getattr(km.provisioner, "cwd", "") or ""),
        "notebook_path": sessions[0]["path"] if sessions else None,
        "last_activity": km.last_activity.isoformat() if getattr(km, "last_activity", None) else None,
    }


def _jsonable(info: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.decode() if isinstance(v, bytes) else v) for k, v in info.items()}

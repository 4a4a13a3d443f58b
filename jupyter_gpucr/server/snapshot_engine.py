"""The snapshot engine for server kernels, where CRIU cannot run or cannot move the kernel.

The kernel saves its own namespace (``gpucr_hooks.snapshot_save``) into a checkpoint
directory of the store; the process then stops. Restoring starts a fresh kernel process under
the same kernel id and connection info and loads the namespace into it. What could not be
kept (a generator, a socket, an open file) is recorded in the manifest and reported.
"""
from __future__ import annotations

import time
from typing import Any

from ..core.checksums import digest_tree
from . import kernel_rpc as snapshot
from ..core.errors import EngineError
from ..core.store import Checkpoint, Store

PAYLOAD = "snapshot"


async def _with_client(km: Any, fn: Any, *args: Any, **kwargs: Any) -> Any:
    client = km.client()
    client.start_channels()
    try:
        return await fn(client, *args, **kwargs)
    finally:
        client.stop_channels()


class KernelSnapshots:
    """Suspend and restore kernels through their own namespace snapshot."""

    def __init__(self, store: Store, keep_last: int, max_bytes: int | None) -> None:
        self.store = store
        self.keep_last = keep_last
        self.max_bytes = max_bytes

    async def save(self, km: Any, kernel_id: str, extra: dict[str, Any]) -> Checkpoint:
        """Write a complete snapshot checkpoint; the kernel keeps running (the caller stops it)."""
        cid, tmp = self.store.new_checkpoint_dir(kernel_id)
        t0 = time.perf_counter()
        try:
            report = await _with_client(km, snapshot.save, tmp / PAYLOAD, timeout=3600)
            t1 = time.perf_counter()
            files = digest_tree(tmp / PAYLOAD)
            manifest = {
                **extra, "name": kernel_id, "created": time.time(), "engine": "snapshot",
                "size": sum(f["size"] for f in files.values()), "files": files,
                "snapshot": {"kept": report.get("kept", []), "lost": report.get("lost", []), "bytes": report.get("bytes")},
                "gpu": {"used": [], "all": []},
                "timings": {"save": t1 - t0, "checksum": time.perf_counter() - t1, "total": time.perf_counter() - t0},
            }
            ckpt = self.store.commit_checkpoint(cid, tmp, manifest)
        except snapshot.SnapshotError as e:
            self.store.discard(tmp)
            raise EngineError(f"The kernel could not save its namespace: {e}", "The kernel keeps running.") from e
        except BaseException:
            self.store.discard(tmp)
            raise
        self.store.apply_retention(kernel_id, self.keep_last, self.max_bytes)
        return ckpt

    async def load(self, km: Any, ckpt: Checkpoint, device: str | None) -> dict[str, Any]:
        """Load the snapshot into the (fresh, running) kernel behind ``km``."""
        try:
            return await _with_client(km, snapshot.load, ckpt.path / PAYLOAD, device=device, timeout=3600)
        except snapshot.SnapshotError as e:
            raise EngineError(f"The fresh kernel could not load the snapshot: {e}",
                              "The checkpoint is kept; retry, or start a fresh kernel.") from e

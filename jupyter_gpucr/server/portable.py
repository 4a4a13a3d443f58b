"""The portable copy of a whole-process suspend (``c.GPUCR.portable_fallback``): what a node that
cannot run the CRIU image restores instead.

A CRIU image runs only where the CPU has the instruction features the process already chose,
the NVIDIA driver is the same and the GPU model is there (``core/criu/nodecompat.py``). With object
storage the next node is whichever the hub picks, so the suspend can also have the kernel save
its namespace with the snapshot engine's code (``gpucr_hooks.snapshot``) before the dump,
into ``portable/snapshot`` beside the kernel's process files (which travel with the
checkpoint). A node the image cannot run on then starts a fresh kernel and loads that, and the
kernel's state says why and what was lost (open files, threads, what could not be pickled).

It costs a second copy of the kernel's variables at every suspend (the pickling time and the
bytes), which is why it is an option and not the default; the whole-process image stays what a
compatible node restores.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, cast

from ..core.backend import CheckpointBackend
from ..core.storage.checksums import digest_tree
from ..core.storage.store import Checkpoint, Manifest, Store
from . import kernel_rpc
from .kernel_rpc import SNAPSHOT_PAYLOAD

#: The folder, below the kernel's process folder, of the portable copy of its last suspend.
PORTABLE_DIR = "portable"


async def save(km: Any, store: Store, kernel_id: str) -> dict[str, Any]:
    """Have the kernel save its namespace for a node that cannot run the image; the manifest's
    ``portable`` entry. Never fails the suspend: a kernel that cannot save says why, there."""
    proc_dir = store.proc_dir(kernel_id)
    staging = proc_dir / ".portable-new"  # "." : not uploaded while incomplete
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(mode=0o700)
    t0 = time.perf_counter()
    try:
        report = await kernel_rpc.with_client(km, kernel_rpc.save, staging / SNAPSHOT_PAYLOAD, timeout=3600)
    except Exception as e:  # the image is taken all the same: only the fallback is lost
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(proc_dir / PORTABLE_DIR, ignore_errors=True)
        return {"error": f"the kernel could not save its variables ({e})"}
    files = digest_tree(staging / SNAPSHOT_PAYLOAD)
    shutil.rmtree(proc_dir / PORTABLE_DIR, ignore_errors=True)
    staging.rename(proc_dir / PORTABLE_DIR)
    return {"files": files, "kept": report.get("kept", []), "lost": report.get("lost", []),
            "bytes": report.get("bytes"), "seconds": time.perf_counter() - t0}


def fallback(store: Store, ckpt: Checkpoint, why: str) -> Checkpoint | None:
    """The portable copy of ``ckpt`` as a snapshot engine's checkpoint, made for a node that
    cannot run the image (``why``); None when the suspend saved none."""
    portable = cast(dict[str, Any], ckpt.manifest.get("portable") or {})
    folder = store.proc_dir(ckpt.name) / PORTABLE_DIR
    if not portable.get("files") or not (folder / SNAPSHOT_PAYLOAD).is_dir():
        return None
    files: dict[str, Any] = portable["files"]
    manifest = cast(Manifest, {
        **{k: v for k, v in ckpt.manifest.items() if k in ("name", "created", "kernel", "reason")},
        "engine": "snapshot", "engine_reason": f"the whole-process image cannot run on this node: {why}",
        "files": files, "size": sum(int(f["size"]) for f in files.values()),
        "snapshot": {"kept": portable.get("kept", []), "lost": portable.get("lost", []), "bytes": portable.get("bytes")},
        "gpu": {"used": [], "all": []}})
    return Checkpoint(ckpt.id, Path(folder), manifest)


def what_was_lost(why: str, ckpt: Checkpoint) -> str:
    """The warning a kernel restored from its portable copy carries."""
    return (f"Restored from the variables saved at the suspend, not the whole process: {why}. Its running threads, "
            f"open files and connections, and the variables listed as lost, are not back; re-run the cells that made "
            f"them. Checkpoint {ckpt.id} is kept for a node that can run it.")


def instead(checkpointer: CheckpointBackend, ckpt: Checkpoint) -> tuple[Checkpoint, str] | None:
    """The portable copy to restore, and why, when the whole-process image of ``ckpt`` cannot
    run on this node; None when it can (or there is no copy: the restore then says why not)."""
    if ckpt.manifest.get("engine") != "criu" or not (ckpt.manifest.get("portable") or {}).get("files"):
        return None
    why = checkpointer.image_problem(ckpt)
    copy = fallback(checkpointer.store, ckpt, why) if why else None
    return (copy, why) if copy is not None and why else None

"""One checkpoint into the object store and back out; which kernels and checkpoints it holds.

Below the user's prefix (:class:`.bucket.ObjectStore`)::

    NAME/ID/checkpoint/...   the checkpoint's folder (manifest.json with the images' digests, images/)
    NAME/ID/proc/...         the process's folder (record, logs, a kernel's history, offloaded tensors)
    NAME/ID/uploading.json   written before the first object, removed after the last: an upload under way
    NAME/ID/complete.json    written once every object is in the store with its size: the checkpoint is durable
    NAME/lease.json          the node that restored NAME and runs it (:mod:`.leases`)

With an encryption key (``ObjectStore.key``) every object below ``checkpoint/`` and ``proc/`` is
sealed (:mod:`.sealing`); ``complete.json`` stays plaintext, for listing and pruning without the key,
and holds its copy of the manifest sealed (``manifest_sealed``) and how the checkpoint was sealed
(``encryption``: the key's id), so a restore with another key, or none, says so before downloading,
and one sealed with a previous key (``ObjectStore.previous_keys``) is opened with that one.
Its ``objects`` are plaintext sizes; the store lists each one's :meth:`~.ObjectStore.stored_size`.
The leases and ``uploading.json`` name nodes and times only, and stay plaintext.

Locally ``checkpoints/ID/upload.json`` says ``pending`` until ``complete.json`` is written, so a
server killed mid-upload redoes it at its next start from the copy it kept. Only checkpoints with a
``complete.json`` are listed or downloaded; the newest one of a name is the one that counts.
"""
from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Callable, Collection
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, cast

from ..criu.images import read_image
from ..errors import CheckpointDamagedError, PreconditionError
from ..files import make_private_dir, tighten_permissions
from ..jsonfile import read_json, write_json_atomic
from ..process.record import ProcRecord
from ..storage.store import Checkpoint, Manifest, Store, read_manifest
from .bucket import ObjectStore, ObjectStoreError
from .leases import LEASE, node_id
from .sealing import StoreKey, opening_key
from .streamup import StreamingUpload

MARKER = "upload.json"
COMPLETE = "complete.json"
UPLOADING = "uploading.json"

Progress = Callable[[int, int], None]


def _files_below(root: Path, skip: Callable[[Path], bool]) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and not skip(p.relative_to(root)))


def _checkpoint_files(ckpt: Checkpoint) -> list[Path]:
    return _files_below(ckpt.path, lambda rel: rel.name == MARKER)


def _proc_files(proc_dir: Path) -> list[Path]:
    """The process's own files: not its locks, status and pid files (``.*``), nor a fork's restore folder."""
    return _files_below(proc_dir, lambda rel: rel.parts[0].startswith(".") or rel.parts[0] == "restore")


def proc_pairs(proc_dir: Path, folders: Collection[str] | None = None) -> list[tuple[str, str]]:
    """(local file, key below the checkpoint) of each of the process's own files; with ``folders``,
    only those below these folders of its folder."""
    return [(str(p), f"proc/{p.relative_to(proc_dir)}") for p in _proc_files(proc_dir)
            if folders is None or p.relative_to(proc_dir).parts[0] in folders]


def pending(store: Store) -> list[Checkpoint]:
    """Checkpoints whose upload was started and never finished (the server died, or the store failed)."""
    return [c for c in store.list_checkpoints() if (read_json(c.path / MARKER) or {}).get("state") == "pending"]


def mark_pending(ckpt: Checkpoint, remote: ObjectStore) -> None:
    write_json_atomic(ckpt.path / MARKER, {"state": "pending", "store": repr(remote), "since": time.time()})


def upload(remote: ObjectStore, store: Store, ckpt: Checkpoint, progress: Progress | None = None,
           streamed: StreamingUpload | None = None) -> dict[str, Any]:
    """Put the checkpoint and its process's files into the store, check that every object is
    there with its size, then write ``complete.json`` (what older checkpoints go afterwards is
    :mod:`.retention`'s business). The local copy is kept. ``streamed``: what was
    uploaded beside the dump (the images as CRIU wrote them, the files final before it; only what it
    did not finish is sent). Returns what moved. A checkpoint whose images take pages from
    another's (a save point's, ``storage/chain.py``) is refused: the store holds whole checkpoints."""
    if ckpt.manifest.get("parent"):
        raise PreconditionError(f"Checkpoint {ckpt.id} takes its unchanged pages from checkpoint "
                                f"{ckpt.manifest['parent']}, and object storage holds only whole checkpoints.",
                                "Upload a checkpoint of the suspended process instead (its suspend writes one).")
    t0 = time.perf_counter()
    name, proc_dir = ckpt.name, store.proc_dir(ckpt.name)
    mark_pending(ckpt, remote)
    base = f"{name}/{ckpt.id}"
    pairs = [(str(p), f"checkpoint/{p.relative_to(ckpt.path)}") for p in _checkpoint_files(ckpt)]
    pairs += proc_pairs(proc_dir)
    sizes = {key: os.path.getsize(local) for local, key in pairs}
    total = sum(sizes.values())
    already = _streamed(streamed, total, progress) if streamed is not None else {}
    todo = [(local, key) for local, key in pairs if already.get(key) != sizes[key]]
    before = total - sum(sizes[key] for _, key in todo)
    remote.write_json(f"{base}/{UPLOADING}", {"node": node_id(store), "since": time.time(), "bytes": total})
    remote.put_files([(local, f"{base}/{key}") for local, key in todo],
                     (lambda done: progress(before + done, total)) if progress else None)
    there = remote.sizes(base)
    wrong = [f"{key} ({there.get(key, 'no')} bytes in the store, {remote.stored_size(size)} expected)"
             for key, size in sizes.items() if there.get(key) != remote.stored_size(size)]
    if wrong:
        raise ObjectStoreError(f"The upload of checkpoint {ckpt.id} to {remote!r} is incomplete: {'; '.join(wrong[:5])}.",
                               "The checkpoint is kept on this node's disk; the upload is redone at the next server start.")
    manifest: dict[str, Any] = {"manifest": ckpt.manifest} if remote.key is None else {
        "encryption": remote.key.record(),
        "manifest_sealed": remote.key.seal_json(remote.sealed_name(f"{base}/{COMPLETE}"), ckpt.manifest)}
    remote.write_json(f"{base}/{COMPLETE}", {
        "id": ckpt.id, "name": name, "created": ckpt.created, "size": ckpt.size, "bytes": total, "objects": sizes,
        **manifest, "proc_dir": str(proc_dir), "node": node_id(store), "uploaded_at": time.time()})
    remote.delete(f"{base}/{UPLOADING}")
    write_json_atomic(ckpt.path / MARKER, {"state": "done", "store": repr(remote), "at": time.time()})
    return {"bytes": total, "objects": len(pairs), "seconds": time.perf_counter() - t0, "streamed": before,
            "during_dump": streamed.during_dump if streamed is not None else 0}


def _streamed(streamed: StreamingUpload, total: int, progress: Progress | None) -> dict[str, int]:
    """What the upload beside the dump completed, once its last parts are in; until then its
    progress is the upload's (a big image's parts can take most of the upload)."""
    while True:
        try:
            return streamed.result(timeout=0.5)
        except FutureTimeout:
            if progress:
                progress(min(streamed.sent, total), total)


def completed(remote: ObjectStore, name: str) -> list[dict[str, Any]]:
    """The ``complete.json`` of each durable checkpoint of ``name`` in the store, oldest first."""
    found = [remote.read_json(f"{name}/{cid}/{COMPLETE}") for cid in remote.names(name) if cid != LEASE]
    return sorted((c for c in found if c), key=lambda c: (c.get("created", 0), c.get("id", "")))


def latest(remote: ObjectStore, name: str) -> dict[str, Any] | None:
    items = completed(remote, name)
    return items[-1] if items else None


def checkpoints(remote: ObjectStore) -> dict[str, list[dict[str, Any]]]:
    """Every name in the user's prefix that has a durable checkpoint, with the ``complete.json`` of
    each of its durable checkpoints, oldest first."""
    return {name: items for name in remote.names() if (items := completed(remote, name))}


def kernels(remote: ObjectStore) -> dict[str, dict[str, Any]]:
    """Every name in the user's prefix that has a durable checkpoint, with its newest one."""
    return {name: items[-1] for name, items in checkpoints(remote).items()}


def previous_key_use(remote: ObjectStore, found: dict[str, list[dict[str, Any]]]) -> dict[StoreKey, int]:
    """How many of the checkpoints ``found`` (:func:`checkpoints`) each of the store's previous keys
    sealed: a key none of them needs can be dropped after a key rotation."""
    used = [(c.get("encryption") or {}).get("key_id") for items in found.values() for c in items]
    return {k: used.count(k.id) for k in remote.previous_keys}


def missing_here(remote: ObjectStore, store: Store, name: str) -> dict[str, Any] | None:
    """The ``complete.json`` of the newest durable checkpoint of ``name`` when ``store`` lacks it
    (to download), checked to open with the store's key: raises :class:`.sealing.KeyMismatchError`
    otherwise, so a restore can refuse before it claims the kernel."""
    newest = latest(remote, name)
    if newest is None or newest["id"] in store.checkpoint_ids(name):
        return None
    check_readable(remote, newest)
    return newest


def check_readable(remote: ObjectStore, complete: dict[str, Any]) -> StoreKey | None:
    """The key that opens this checkpoint: the store's key or one of its previous keys (None: not
    sealed, and no key is set). Raises :class:`.sealing.KeyMismatchError` when none does: sealed with
    another key, sealed while no key is set, or not sealed while one is."""
    return opening_key(remote.key, remote.previous_keys, complete.get("encryption"),
                       f"Checkpoint {complete.get('id')} of {complete.get('name')} in {remote!r}")


def manifest_of(remote: ObjectStore, complete: dict[str, Any]) -> Manifest:
    """The checkpoint's manifest as ``complete.json`` holds it (opened when sealed)."""
    opener = check_readable(remote, complete)
    if opener is None:
        return cast(Manifest, complete["manifest"])
    key = f"{complete['name']}/{complete['id']}/{COMPLETE}"
    return cast(Manifest, opener.open_json(remote.sealed_name(key), complete["manifest_sealed"], f"{remote!r}/{key}"))


def download(remote: ObjectStore, store: Store, complete: dict[str, Any], progress: Progress | None = None) -> Checkpoint:
    """Bring a durable checkpoint and its process's files into the local store (ranged reads in
    parallel; each chunk authenticated as it arrives when sealed), checked against the sizes
    ``complete.json`` lists and, at restore, the manifest's digests. The process record is
    rewritten for this node: suspended in that checkpoint, and where the process's folder was on
    the node that made it (``moved_from``), so the restore hands the process its files here."""
    name, cid = complete["name"], complete["id"]
    final = store.checkpoints_root / cid
    proc_dir = store.proc_dir(name)
    if not final.is_dir():
        opener = check_readable(remote, complete)  # before anything here is touched
        tmp = make_private_dir(store.checkpoints_root / f".tmp-{cid}")
        objects: dict[str, int] = complete["objects"]
        pairs = []
        for key, size in objects.items():
            section, rel = key.split("/", 1)
            local = (tmp if section == "checkpoint" else proc_dir) / rel
            make_private_dir(local.parent)
            pairs.append((f"{name}/{cid}/{key}", str(local), int(size)))
        total = sum(p[2] for p in pairs)
        try:
            remote.get_files(pairs, (lambda done: progress(done, total)) if progress else None, opener)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        tighten_permissions(tmp)
        try:
            read_manifest(tmp)
        except CheckpointDamagedError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointDamagedError(f"Checkpoint {cid} in {remote!r} is damaged: {e.message}",
                                         "Restore an older checkpoint or start fresh.") from e
        write_json_atomic(tmp / MARKER, {"state": "done", "store": repr(remote), "at": time.time()})
        os.rename(tmp, final)
    rec = cast(ProcRecord, read_json(proc_dir / "run.json") or {"name": name})
    rec = cast(ProcRecord, {k: v for k, v in rec.items() if k != "restoring"})
    rec.update({"state": "checkpointed", "pid": None, "checkpoint": cid})
    if complete.get("proc_dir") and complete["proc_dir"] != str(proc_dir):
        rec["moved_from"] = complete["proc_dir"]
    store.write_proc(name, rec)
    return store.get(cid)


def relocated_files(images: Path, old_dir: str, new_dir: Path) -> dict[str, str]:
    """The files the image has open below the process's folder on the node that made it, each
    mapped to its copy below the folder here (for CRIU's ``--inherit-fd``: the image names the
    paths of the other node)."""
    old = old_dir.rstrip("/") + "/"
    moved = {}
    for f in read_image(images).files:
        path = f.path if f.path.startswith("/") else f"/{f.path}"
        if path.startswith(old) and stat.S_ISREG(f.mode) and (new_dir / path[len(old):]).is_file():
            moved[path] = str(new_dir / path[len(old):])
    return moved

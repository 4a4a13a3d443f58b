"""The server's side of object storage (``c.GPUCR.store = "s3://..."``, see ``core/objectstore/transfer.py``).

Before a suspend the store is asked once whether it answers, so a store that is down or refuses
the credentials leaves the kernel running with the reason. After the dump the kernel is
``uploading`` (its GPU is free, its local copy is kept and restores here) and becomes
``suspended`` once every object is in the store. A restore first claims the kernel's lease and
downloads its newest checkpoint when this node does not have it; while the node holds the kernel
a heartbeat renews the lease, and a lease left unrenewed for ``c.GPUCR.lease_timeout_s`` (a lost
node) is taken over. With S3 the upload begins while CRIU writes the images (``core/objectstore/streamup.py``),
with the kernel's offloaded tensors and saved variables beside them.
At start, uploads an earlier server left unfinished are redone and the kernels other nodes left
in the store are listed. With ``c.GPUCR.encryption_key_file`` every object holding the process
is sealed with that key before it leaves the node (``core/objectstore/sealing.py``); checkpoints sealed with
``c.GPUCR.previous_encryption_key_files`` are opened with those, and the log at start says how
many each previous key still seals. After each upload the user's prefix is pruned
(``c.GPUCR.keep_last``, ``c.GPUCR.max_bucket_bytes``: ``core/objectstore/retention.py``); a kernel
shut down takes its objects with it, once an upload of it under way is over.
"""
from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Collection, Container
from pathlib import Path
from typing import Any

from ..core.backend import CheckpointBackend
from ..core.errors import CheckpointDamagedError, GPUCRError
from ..core.objectstore import leases, transfer
from ..core.objectstore.bucket import ObjectStore, is_url
from ..core.objectstore.retention import apply_retention
from ..core.objectstore.sealing import StoreKey, load_key
from ..core.objectstore.streamup import StreamingUpload
from ..core.storage.checksums import find_mismatches
from ..core.storage.store import Checkpoint, Manifest, Store
from .config import GPUCR
from .lifecycle import SUSPENDED, UPLOADING, KernelLifecycle


def remote_url(config: GPUCR) -> str | None:
    """The object store's URL when ``c.GPUCR.store`` (else ``$GPUCR_STORE``) is one."""
    url = config.store or os.environ.get("GPUCR_STORE", "")
    return url if is_url(url) else None


def store_keys(config: GPUCR) -> tuple[StoreKey | None, list[StoreKey]]:
    """The key objects are sealed with (``c.GPUCR.encryption_key_file``; None without one) and the
    previous keys, which open what they sealed (``c.GPUCR.previous_encryption_key_files``). Raises
    :class:`.sealing.EncryptionKeyError` for a file that is missing, open to others or no key."""
    current = load_key(config.encryption_key_file) if config.encryption_key_file else None
    return current, [load_key(path) for path in config.previous_encryption_key_files]


def connect(config: GPUCR) -> ObjectStore | None:
    """The object store ``c.GPUCR.store`` names, with its options and key; None for a directory."""
    url = remote_url(config)
    if not url:
        return None
    key, previous = store_keys(config)
    return ObjectStore(url, config.store_options, key=key, previous_keys=previous)


def local_root(config: GPUCR) -> str | None:
    """The local store's directory: the cache directory with object storage, else the store itself."""
    return (config.cache_dir or None) if remote_url(config) else (config.store or None)


class RemoteKernels:
    """Uploads, downloads, listing and leases of one server's kernels in one object store."""

    def __init__(self, remote: ObjectStore, store: Store, lifecycle: KernelLifecycle, log: Any, keep_last: int,
                 lease_timeout_s: float = 120.0, max_bytes: int | None = None) -> None:
        self.remote, self.store, self.lifecycle, self.log, self.keep_last = remote, store, lifecycle, log, keep_last
        self.max_bytes = max_bytes  # of the user's prefix (c.GPUCR.max_bucket_bytes); None: no limit
        self.node = leases.node_id(store)
        self.lease_timeout_s = lease_timeout_s
        self._uploads: dict[str, asyncio.Task[None]] = {}
        self._leases: dict[str, leases.Lease] = {}  # the kernels this node holds, renewed by the heartbeat
        self._heartbeat: asyncio.Task[None] | None = None
        self._streams: dict[str, StreamingUpload] = {}  # by checkpoint id, from the dump to the upload
        self._final_folders: Collection[str] = ()  # of a process's folder, uploaded beside its dump
        self._lost: set[str] = set()  # kernels whose lease another node took over while they ran here
        self._forgetting: set[asyncio.Task[None]] = set()  # deletions of kernels shut down, kept referenced
        self._shut_down: set[str] = set()  # kernels shut down whose objects are not deleted yet
        self._from_store: dict[str, dict[str, Any]] = {}  # the complete.json of what a restore here runs, made elsewhere

    def stream_from(self, checkpointer: CheckpointBackend, final_folders: Collection[str] = ()) -> None:
        """Upload each dump of ``checkpointer`` while CRIU writes it (S3; a checkpointer that runs
        CRIU in this process, whose images this server can read), and beside it the files in the
        process's ``final_folders``, written before the dump begins (offloaded tensors, saved variables)."""
        if self.remote.is_s3 and checkpointer.stream_dumps_to(self._stream):
            self._final_folders = final_folders

    def _stream(self, name: str, cid: str, images: Path) -> StreamingUpload:
        final = transfer.proc_pairs(self.store.proc_dir(name), self._final_folders)
        self._streams[cid] = stream = StreamingUpload(self.remote, f"{name}/{cid}", images, self.node, final)
        return stream

    async def check(self) -> None:
        """Raise :class:`ObjectStoreError` (the kernel is not touched) when the store does not answer."""
        await asyncio.to_thread(self.remote.probe)

    # -- suspend ----------------------------------------------------------------------------
    def upload_later(self, kernel_id: str, ckpt: Checkpoint) -> None:
        """Upload in the background; the kernel is ``uploading`` until then (set by the caller)."""
        self._uploads[kernel_id] = task = asyncio.ensure_future(self._upload(kernel_id, ckpt))
        task.add_done_callback(lambda t: self._uploads.pop(kernel_id, None) if self._uploads.get(kernel_id) is t else None)

    async def _upload(self, kernel_id: str, ckpt: Checkpoint) -> None:
        loop = asyncio.get_running_loop()
        streamed = self._streams.pop(ckpt.id, None)
        if kernel_id in self._lost:  # the store's copy is the other node's now: not replaced by this one
            self.lifecycle.transition(
                kernel_id, SUSPENDED, "failed", error=f"Another node took this kernel's lease over while it ran here; it "
                f"is suspended on this node's disk only ({ckpt.path}), not uploaded over the other node's copy.",
                hint="Restore it on this node to keep working here, or shut it down and use the other node's.")
            return

        def report(done: int, total: int) -> None:
            loop.call_soon_threadsafe(self.lifecycle.progress, kernel_id, "uploading", done, total)

        try:
            moved = await asyncio.to_thread(transfer.upload, self.remote, self.store, ckpt, report, streamed)
        except (GPUCRError, OSError) as e:
            if streamed is not None:  # parts sent while CRIU wrote still go out: the upload is over once they are
                await asyncio.to_thread(streamed.result)
            said = e.message if isinstance(e, GPUCRError) else f"Checkpoint {ckpt.id} could not be read for its upload: {e}."
            if kernel_id in self._shut_down:  # its files went to the trash while they were read
                self.log.info("gpucr: kernel %s was shut down while it was uploading: the upload stopped (%s)",
                              kernel_id, said)
                return
            self.log.error("gpucr: kernel %s: %s %s", kernel_id, said, getattr(e, "hint", ""))
            if self.lifecycle.state_of(kernel_id) == UPLOADING:
                self.lifecycle.transition(
                    kernel_id, SUSPENDED, "failed", error=f"{said} The kernel is suspended on this node's disk only "
                    f"({ckpt.path}): it restores here, not on another node.",
                    hint="The upload is redone at the next server start; check the store, then restart the server.")
            return
        self.log.info("gpucr: kernel %s is in %r: %d MiB in %d objects, %d MiB of them sent while CRIU wrote them, "
                      "%d MiB more by the upload beside the dump; done %.2f s after the dump", kernel_id, self.remote,
                      moved["bytes"] >> 20, moved["objects"], moved["during_dump"] >> 20,
                      (moved["streamed"] - moved["during_dump"]) >> 20, moved["seconds"])
        state = self.lifecycle.state_of(kernel_id)
        if state == UPLOADING:
            st = self.lifecycle.get(kernel_id)
            self.lifecycle.transition(kernel_id, SUSPENDED, "done", timings={**st.timings, "upload": moved["seconds"]})
        if state in (UPLOADING, SUSPENDED):  # durable again: any node may restore it now
            await self._release(kernel_id)
        await self._prune(kernel_id)

    async def _prune(self, kernel_id: str) -> None:
        """Apply retention to the user's prefix after an upload of ``kernel_id``, saying in the log
        what went and why; a failure leaves the objects and the kernel as they are."""
        try:
            done = await asyncio.to_thread(apply_retention, self.remote, kernel_id, self.keep_last, self.max_bytes)
        except GPUCRError as e:
            self.log.warning("gpucr: retention in %r was not applied: %s %s", self.remote, e.message, e.hint)
            return
        for d in done.deleted:
            self.log.info("gpucr: deleted checkpoint %s of kernel %s from %r (%d bytes): %s", d.id, d.name, self.remote,
                          d.bytes, d.why)
        if self.max_bytes is not None and done.left is not None and done.left > self.max_bytes:
            self.log.warning("gpucr: the user's prefix %r holds %d bytes, over c.GPUCR.max_bucket_bytes (%d): what is "
                             "left is the newest checkpoint of each kernel and uploads under way, which are never "
                             "deleted; shutting kernels down frees their objects", self.remote, done.left, self.max_bytes)

    async def wait_uploads(self, timeout: float) -> list[str]:
        """Wait (at most ``timeout`` s) for the uploads under way; the kernel ids not done by then."""
        tasks = dict(self._uploads)
        if tasks:
            await asyncio.wait(tasks.values(), timeout=max(timeout, 0.1))
        late = [k for k, t in tasks.items() if not t.done()]
        for kernel_id in late:
            self.log.warning("gpucr: kernel %s is suspended on this node's disk; its upload to %r did not finish in the "
                             "stop budget and is redone at the next start", kernel_id, self.remote)
        return late

    # -- restore ----------------------------------------------------------------------------
    async def fetch(self, kernel_id: str, progress: Any) -> str | None:
        """Claim the kernel for this node (the lease, taken over from a node that stopped renewing
        it), then make sure its newest durable checkpoint is on this node's disk, downloading it if
        needed. What the user should know of a takeover, or None."""
        lease = await asyncio.to_thread(leases.take_lease, self.remote, kernel_id, self.node, self.lease_timeout_s)
        self._leases[kernel_id] = lease
        if self._heartbeat is None or self._heartbeat.done():
            self._heartbeat = asyncio.ensure_future(self._beat())
        note = leases.taken_over_note(lease)
        if note:
            self.log.warning("gpucr: kernel %s: %s", kernel_id, note)
        newest = await asyncio.to_thread(transfer.latest, self.remote, kernel_id)
        local = self.store.latest(kernel_id) if self.store.list_checkpoints(kernel_id) else None
        self._from_store.pop(kernel_id, None)
        if newest is not None and newest.get("node") != self.node and (local is None or local.id == newest["id"]
                                                                        or local.created < newest["created"]):
            self._from_store[kernel_id] = newest
        if newest is None or (local is not None and (local.id == newest["id"] or local.created >= newest["created"])):
            return note
        t0 = time.perf_counter()
        await asyncio.to_thread(transfer.download, self.remote, self.store, newest,
                                lambda done, total: progress("downloading", done, total))
        self.log.info("gpucr: downloaded checkpoint %s of kernel %s from %r (%d MiB in %.2f s)", newest["id"], kernel_id,
                      self.remote, newest.get("bytes", 0) >> 20, time.perf_counter() - t0)
        return note

    async def damaged_in_store(self, kernel_id: str, err: GPUCRError) -> GPUCRError:
        """What to tell of a restore that failed with ``err``: when the checkpoint came from the
        store, made on another node, and its images do not match its manifest's digests (the
        download checked every object's size), the copy in the store is damaged: name its objects."""
        complete = self._from_store.pop(kernel_id, None)
        if not isinstance(err, CheckpointDamagedError) or complete is None or complete["id"] not in err.message:
            return err
        try:
            ckpt = self.store.get(complete["id"])
        except GPUCRError:  # refused while downloading (a sealed object that does not open): said already
            return err
        problems = await asyncio.to_thread(find_mismatches, ckpt.images, ckpt.manifest["files"])
        if not problems:
            return err
        base = f"{self.remote!r}/{kernel_id}/{ckpt.id}/checkpoint/images"
        node = complete.get("node", "another node")
        return CheckpointDamagedError(
            f"The checkpoint in the store is damaged: {'; '.join(f'{base}/{p}' for p in problems[:5])} (checkpoint "
            f"{ckpt.id}, made on {node}).",
            f"The kernel stays suspended. If {node} still holds its own copy, restore the kernel there; else shut it "
            f"down and start fresh. This node's download is kept at {ckpt.path} for inspection.")

    async def give_back(self, kernel_id: str) -> None:
        """A restore failed: the kernel stays suspended, and other nodes may restore it."""
        try:
            await self._release(kernel_id)
        except GPUCRError as e:
            self.log.warning("gpucr: the lease of kernel %s was not released: %s", kernel_id, e)

    async def _release(self, kernel_id: str) -> None:
        self._leases.pop(kernel_id, None)
        await asyncio.to_thread(leases.release_lease, self.remote, kernel_id, self.node)

    async def _beat(self) -> None:
        """Renew every lease this node holds, a quarter of ``lease_timeout_s`` apart, while it holds
        any; a lease another node took over meanwhile (this one was taken for lost) is dropped, said
        in the log and on the kernel."""
        while self._leases:
            await asyncio.sleep(self.lease_timeout_s / 4)
            for kernel_id, lease in list(self._leases.items()):
                try:
                    kept = await asyncio.to_thread(leases.renew_lease, self.remote, lease)
                except GPUCRError as e:
                    self.log.warning("gpucr: the lease of kernel %s was not renewed: %s", kernel_id, e.message)
                    continue
                if not kept and self._leases.get(kernel_id) is lease:
                    del self._leases[kernel_id]
                    self._lost.add(kernel_id)
                    self.log.error("gpucr: kernel %s: another node took its lease over (this node did not renew it "
                                   "within c.GPUCR.lease_timeout_s); its next suspend here stays on this node", kernel_id)

    # -- shutdown ---------------------------------------------------------------------------
    def forget_later(self, kernel_id: str) -> None:
        """The kernel was shut down: its objects go (its local trash keeps what the user may want back),
        after an upload of it under way, which would otherwise write them again once they are gone."""
        uploading = self._uploads.get(kernel_id)
        self._shut_down.add(kernel_id)
        self._from_store.pop(kernel_id, None)

        async def forget() -> None:
            if uploading is not None:
                await asyncio.wait([uploading])
            try:
                await asyncio.to_thread(leases.forget, self.remote, kernel_id, self.node)
            except GPUCRError as e:
                self.log.warning("gpucr: the objects of kernel %s stay in %r: %s", kernel_id, self.remote, e)
            else:
                self.log.info("gpucr: kernel %s was shut down: its objects are deleted from %r", kernel_id, self.remote)
            finally:
                self._shut_down.discard(kernel_id)

        self._forgetting.add(task := asyncio.ensure_future(forget()))
        task.add_done_callback(self._forgetting.discard)

    # -- server start -----------------------------------------------------------------------
    def _log_previous_key_use(self, found: dict[str, list[dict[str, Any]]]) -> None:
        """Say how many checkpoints each previous key still seals: the operator removes a key at 0.
        A kernel's next suspend seals it with the current key, and retention removes the older ones."""
        for key, count in transfer.previous_key_use(self.remote, found).items():
            if count:
                self.log.info("gpucr: %d checkpoint(s) in %r are sealed with the previous encryption key %s (%s); keep "
                              "it in c.GPUCR.previous_encryption_key_files until their kernels are suspended again "
                              "or shut down", count, self.remote, key.id, key.source)
            else:
                self.log.info("gpucr: 0 checkpoints in %r are sealed with the previous encryption key %s (%s); it can "
                              "be removed from c.GPUCR.previous_encryption_key_files", self.remote, key.id, key.source)

    async def relist(self, listed: Container[str], list_on_disk: Callable[[str, Checkpoint], Awaitable[Any]]) -> None:
        """Redo the uploads an earlier server left unfinished, then list (``list_on_disk``) the kernels
        not ``listed`` yet that this user has suspended in the store on other nodes (or before this
        node's cache was emptied)."""
        for ckpt in transfer.pending(self.store):
            if self.lifecycle.state_of(ckpt.name) == SUSPENDED and self.store.latest(ckpt.name).id == ckpt.id:
                self.log.warning("gpucr: kernel %s: redoing the upload an earlier server did not finish", ckpt.name)
                self.lifecycle.transition(ckpt.name, UPLOADING, "uploading")
                self.upload_later(ckpt.name, ckpt)
        try:
            found = await asyncio.to_thread(transfer.checkpoints, self.remote)
        except GPUCRError as e:
            self.log.error("gpucr: the kernels in %r are not listed: %s %s", self.remote, e.message, e.hint)
            return
        self._log_previous_key_use(found)
        for name, items in found.items():
            complete = items[-1]
            if name in listed:
                continue
            try:
                manifest: Manifest = transfer.manifest_of(self.remote, complete)
            except GPUCRError as e:
                self.log.error("gpucr: kernel %s in %r is not listed: %s %s", name, self.remote, e.message, e.hint)
                continue
            if not manifest.get("kernel"):
                continue
            if not self.store.has_proc(name):
                self.store.write_proc(name, {"name": name, "state": "checkpointed", "pid": None, "checkpoint": complete["id"],
                                             "suspended_at": float(complete.get("created") or time.time())})
            await list_on_disk(name, Checkpoint(complete["id"], self.store.checkpoints_root / complete["id"], manifest))
            self.log.info("gpucr: kernel %s is listed from %r (checkpoint %s made on %s)", name, self.remote,
                          complete["id"], complete.get("node"))

"""Upload a checkpoint's images to S3 while CRIU writes them, so the upload ends soon after the dump.

CRIU writes each image file sequentially and never rewrites what it wrote (the digests computed
while it writes rely on the same), so every whole part below a file's current size is final.
Each file becomes a multipart upload as soon as it holds one part: parts go out while the dump
goes on, several at once, read at their offset from a descriptor opened when the file appeared
(the folder is renamed when the checkpoint is committed). Once CRIU has returned, the tails and
the small files go out and each upload is completed; what fails here is left to the upload
after the commit, which sends every file the store does not have complete.

Why not inotify's ``IN_CLOSE_WRITE``: the file that matters, a process's pages, is closed only at
the end of the dump, so close events would start its upload no earlier than now; its growth is
what there is to follow. The folder is looked at every 50 ms.

Files that are final before the dump begins (``final``: a kernel's offloaded tensors, its saved
variables) go out beside it too, in whole parts, in the slots the images leave free. Like the
images' uploads, theirs are completed (and the small ones put) only once CRIU has returned, so a
dump that fails leaves nothing of its checkpoint in the store.

With an encryption key each part is sealed as it is read (a part is whole chunks; the first
carries the header), and every file ends with a last part holding its final chunk, even when the
file ends on a part's boundary.

S3 only (multipart uploads through s3fs's client); other stores upload after the commit.
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from .bucket import MAX_PARTS, PART, STREAMS, ObjectStore, part_spans

#: Parts in flight at once (each is in memory until sent).
IN_FLIGHT = STREAMS


@dataclass
class _File:
    key: str  # below the checkpoint's base: checkpoint/images/..., proc/...
    fd: int
    size: int | None = None  # a file final before the dump: its size; None: CRIU still writes it
    queued: int = 0
    upload_id: str | None = None
    parts: list[Future[dict[str, Any]]] = field(default_factory=list)


class StreamingUpload:
    """Follow ``images`` while CRIU writes it and upload its files below ``base``/checkpoint/images/,
    and the ``final`` files (local file, key below ``base``) beside them (a context manager around
    the dump; :meth:`result` once the tails are in)."""

    def __init__(self, remote: ObjectStore, base: str, images: Path, node: str,
                 final: Sequence[tuple[str, str]] = ()) -> None:
        self.remote, self.base, self.images, self.node = remote, base, images, node
        self._final = list(final)
        self._files: dict[str, _File] = {}
        self._opening = threading.Lock()
        self._pool = ThreadPoolExecutor(STREAMS, thread_name_prefix="gpucr-stream")
        self._slots = threading.Semaphore(IN_FLIGHT)
        self._ended = threading.Event()
        self._wake = threading.Event()  # a slot was freed, or the dump ended
        self._aborted = threading.Event()
        self._result: Future[dict[str, int]] = Future()
        self._thread = threading.Thread(target=self._run, name="gpucr-stream-watch", daemon=True)
        #: Bytes handed to the store while CRIU still wrote (whole parts).
        self.during_dump = 0
        #: Bytes the store has taken so far (parts and whole objects), for the upload's progress.
        self.sent = 0
        self._counting = threading.Lock()

    # -- the dump's side ---------------------------------------------------------------------
    def __enter__(self) -> StreamingUpload:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is not None:  # no checkpoint: nothing of it may complete in the store
            self._aborted.set()
        else:
            self._open_new()  # every file, while the folder still has this name
        self._ended.set()
        self._wake.set()

    def result(self, timeout: float | None = None) -> dict[str, int]:
        """The keys (below ``base``) that are complete in the store, with their sizes."""
        return self._result.result(timeout)

    # -- the watcher -------------------------------------------------------------------------
    def _key(self, f: _File) -> str:
        return f"{self.base}/{f.key}"

    def _open_new(self) -> None:
        with self._opening:
            for p in sorted(self.images.rglob("*")) if self.images.is_dir() else []:
                key = f"checkpoint/images/{p.relative_to(self.images)}"
                if key not in self._files and p.is_file() and not p.is_symlink():
                    try:
                        self._files[key] = _File(key, os.open(p, os.O_RDONLY))
                    except FileNotFoundError:
                        pass

    def _open_final(self) -> None:
        for local, key in self._final:
            try:
                fd = os.open(local, os.O_RDONLY)
            except FileNotFoundError:  # gone: the upload after the commit says so
                continue
            with self._opening:
                self._files[key] = _File(key, fd, os.fstat(fd).st_size)

    def _run(self) -> None:
        done: dict[str, int] = {}
        try:
            self.remote.write_json(f"{self.base}/uploading.json", {"node": self.node, "since": time.time(),
                                                                   "streaming": True})
            self._open_final()
            while not self._ended.is_set():
                self._wake.clear()
                self._open_new()
                for f in list(self._files.values()):
                    if f.size is None:
                        self._queue_whole_parts(f)
                for f in list(self._files.values()):
                    if f.size is not None and not self._queue_final_parts(f, f.size, wait=False):
                        break  # no slot free: the images' next parts go first
                self._wake.wait(0.05)
            self.during_dump = sum(f.queued for f in self._files.values())
            if not self._aborted.is_set():
                done = self._finish()
        except BaseException:  # the upload after the commit sends what is missing
            pass
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)  # no part reads a descriptor closed below
            for f in self._files.values():
                if f.upload_id and f.key not in done:  # incomplete uploads cost storage
                    self._abort(f)
                os.close(f.fd)
            self._result.set_result(done)

    def _queue_whole_parts(self, f: _File) -> None:
        size = os.fstat(f.fd).st_size
        while size - f.queued >= PART and len(f.parts) < MAX_PARTS - 1 and not self._aborted.is_set():
            self._slots.acquire()
            self._queue(f, f.queued, f.queued + PART, False)

    def _queue_final_parts(self, f: _File, size: int, wait: bool) -> bool:
        """Queue the parts of a file whose ``size`` is final (one of several parts; a file of one
        part is put whole at the end); False when ``wait`` is off and no slot is free."""
        spans = part_spans(size)
        while len(spans) > 1 and len(f.parts) < len(spans) and not self._aborted.is_set():
            if not self._slots.acquire(blocking=wait):
                return False
            self._queue(f, *spans[len(f.parts)])
        return True

    def _queue(self, f: _File, start: int, end: int, final: bool) -> None:
        """Send [start, end) of ``f`` as its next part (a slot taken for it), its upload begun first."""
        try:
            if f.upload_id is None:
                f.upload_id = self.remote.call_s3("create_multipart_upload", self._key(f))["UploadId"]
            f.parts.append(self._pool.submit(self._part, f, f.upload_id, len(f.parts) + 1, start, end, final))
        except BaseException:
            self._slots.release()
            raise
        f.queued = end

    def _read(self, f: _File, offset: int, end: int, final: bool) -> bytes:
        return self.remote.stored_bytes(self._key(f), lambda at, n: os.pread(f.fd, n, at), offset, end, final)

    def _part(self, f: _File, upload_id: str, number: int, offset: int, end: int, final: bool) -> dict[str, Any]:
        try:
            data = self._read(f, offset, end, final)
            etag = self.remote.upload_part(self._key(f), upload_id, number, data)
            self._count(end - offset)
            return {"PartNumber": number, "ETag": etag}
        finally:
            self._slots.release()
            self._wake.set()

    def _finish(self) -> dict[str, int]:
        """The tails, the final files' parts not sent yet and the small files, then each multipart
        upload completed; the keys done. Only this thread waits on parts (a part never waits on
        another task of the pool)."""
        wholes: dict[str, Future[int]] = {}
        for f in self._files.values():
            if f.size is None:  # CRIU has returned: the image file is final now
                f.size = os.fstat(f.fd).st_size
                if f.upload_id is not None:
                    self._queue_whole_parts(f)
                    if f.size > f.queued or self.remote.key is not None:  # a sealed file's last chunk may hold nothing
                        self._slots.acquire()
                        self._queue(f, f.queued, f.size, True)
                    continue
            if len(part_spans(f.size)) > 1:
                self._queue_final_parts(f, f.size, wait=True)
            else:
                wholes[f.key] = self._pool.submit(self._whole, f, f.size)
        done = {}
        for f in self._files.values():
            if f.upload_id is None:
                continue
            try:
                parts = [p.result() for p in f.parts]
                self.remote.call_s3("complete_multipart_upload", self._key(f), UploadId=f.upload_id,
                                    MultipartUpload={"Parts": parts})
                done[f.key] = f.queued
            except Exception:
                self._abort(f)
        for key, fut in wholes.items():
            try:
                done[key] = fut.result()
            except Exception:
                pass
        return done

    def _whole(self, f: _File, size: int) -> int:
        self.remote.call_s3("put_object", self._key(f), Body=self._read(f, 0, size, True))
        self._count(size)
        return size

    def _count(self, n: int) -> None:
        with self._counting:
            self.sent += n

    def _abort(self, f: _File) -> None:
        try:
            self.remote.call_s3("abort_multipart_upload", self._key(f), UploadId=f.upload_id)
        except Exception:
            pass
        f.upload_id = None

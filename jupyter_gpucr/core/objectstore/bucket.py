"""Object storage for checkpoints (``s3://``, ``gs://``, ``file://``...): one user's prefix in a bucket.

fsspec with s3fs (gcsfs for ``gs://``) does the talking: the same library pandas, dask and zarr
use for the same URLs, so endpoints and credentials come from where those users already put them
(the ``AWS_*`` variables, ``AWS_ENDPOINT_URL`` included, profiles, instance roles; Google's
``GOOGLE_APPLICATION_CREDENTIALS``, the metadata server, ``STORAGE_EMULATOR_HOST``), and
``c.GPUCR.store_options`` is fsspec's ``storage_options``. A large file goes to S3 as a multipart
upload of parts read as they are sent, several at once across all files, and comes back as ranged
reads in parallel, each written in place; botocore checksums every request, which S3 checks on arrival.

A server only ever lists, reads, writes and deletes below ``URL/USER/`` (:attr:`ObjectStore.root`).

With a key (:mod:`.sealing`) the objects :meth:`ObjectStore.put_files` writes are sealed chunk by
chunk as they are read, and :meth:`ObjectStore.get_files` opens each range as it arrives: the local
files stay plaintext, the store holds only ciphertext. A checkpoint sealed with one of the
operator's previous keys (:attr:`ObjectStore.previous_keys`) is read with that key. Sizes given and
asked for are plaintext sizes; :meth:`ObjectStore.stored_size` is what the store lists. The JSON
records stay plaintext.
"""
from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

from ..errors import GPUCRError
from . import s3threads
from .sealing import StoreKey, sealed_range, sealed_size

#: Files uploaded or downloaded at once (each large one in several parts besides).
STREAMS = 16
#: Bytes one ranged read of a download asks for (whole sealed chunks: a multiple of sealing.CHUNK).
CHUNK = 32 << 20
#: How long a connection to the store may take before the store counts as unreachable.
CONNECT_TIMEOUT_S = 5
#: Plaintext bytes per part of a sealed multipart upload (S3 allows 10,000 parts; larger files get larger parts).
PART = 32 << 20
MAX_PARTS = 10_000


class ObjectStoreError(GPUCRError):
    """The object store could not be reached, refused the credentials, or lost an object."""

    status = 503


def is_url(store: str | None) -> bool:
    """Whether ``c.GPUCR.store`` names object storage (``s3://bucket/prefix``) rather than a directory."""
    return bool(store) and "://" in str(store) and not str(store).startswith("/")


def user_name() -> str:
    """The prefix a server's checkpoints live under: the hub's name for its user, else the login name."""
    import getpass

    return os.environ.get("JUPYTERHUB_USER") or getpass.getuser()


def _defaults(protocol: str) -> dict[str, Any]:
    """Short connect timeouts and few retries: an unreachable store must say so in seconds, while
    the kernel still runs, not after botocore's minutes of retrying."""
    if protocol in ("s3", "s3a"):
        return {"use_listings_cache": False, "skip_instance_cache": True,
                "config_kwargs": {"connect_timeout": CONNECT_TIMEOUT_S, "read_timeout": 120,
                                  "retries": {"max_attempts": 3, "mode": "standard"},
                                  "max_pool_connections": 2 * STREAMS}}  # botocore's 10 would cap the transfers
    if protocol in ("gs", "gcs"):  # every listing asks the store: another node's uploads and leases show at once
        return {"use_listings_cache": False, "skip_instance_cache": True}
    return {"skip_instance_cache": True}


class ObjectStore:
    """One user's prefix in an object store; keys are relative to it. ``key``: seal every object
    :meth:`put_files` writes with it (and open those :meth:`get_files` reads); ``previous_keys``:
    the keys before it, which open only what they sealed (after a key rotation)."""

    def __init__(self, url: str, options: dict[str, Any] | None = None, user: str | None = None,
                 key: StoreKey | None = None, previous_keys: Sequence[StoreKey] = ()) -> None:
        import fsspec

        self.url = url.rstrip("/")
        protocol = self.url.split("://", 1)[0]
        try:
            self.fs, base = fsspec.core.url_to_fs(self.url, **{**_defaults(protocol), **(options or {})})
        except (ImportError, ValueError) as e:
            raise ObjectStoreError(f"The checkpoint store {self.url} cannot be used: {e}",
                                   "Install the object store support: pip install 'jupyter-gpucr[s3]' (s3fs) or 'jupyter-gpucr[gcs]' (gcsfs).") from e
        self.user = user or user_name()
        self.root = f"{base.rstrip('/')}/{self.user}"
        self.key = key
        self.previous_keys = tuple(previous_keys)
        self._threaded: Any = None  # the client upload_part uses (False: s3fs's), made on first use
        self._threaded_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{self.url}/{self.user}"

    def path(self, key: str) -> str:
        return f"{self.root}/{key.lstrip('/')}"

    # -- sealing ----------------------------------------------------------------------------
    def sealed_name(self, key: str) -> str:
        """The name an object is sealed under: below the store's URL, so that a copy in another
        user's prefix does not open."""
        return f"{self.user}/{key.lstrip('/')}"

    def stored_size(self, size: int) -> int:
        """What the store lists for an object of ``size`` plaintext bytes."""
        return size if self.key is None else sealed_size(size)

    def stored_bytes(self, key: str, read: Callable[[int, int], bytes], start: int, end: int, final: bool) -> bytes:
        """What goes into the store for plaintext [start, end) of the object at ``key`` (``read(offset,
        length)`` gives it): those bytes, or sealed (see :meth:`.sealing.StoreKey.seal_span`)."""
        if self.key is not None:
            return self.key.seal_span(self.sealed_name(key), read, start, end, final)
        data = read(start, end - start)
        if len(data) != end - start:
            raise OSError(f"{key}: {len(data)} bytes read at {start}, {end - start} expected")
        return data

    def _failed(self, what: str, e: BaseException) -> ObjectStoreError:
        """Say which store, what was being done, and the store's own words (a refused key, a
        missing bucket, a refused connection)."""
        cause = str(e) or type(e).__name__
        credentials, endpoint = (("GOOGLE_APPLICATION_CREDENTIALS or c.GPUCR.store_options' token", "STORAGE_EMULATOR_HOST")
                                 if self.is_gcs else
                                 ("AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, the profile (AWS_PROFILE) or c.GPUCR.store_options",
                                  "AWS_ENDPOINT_URL"))
        if isinstance(e, PermissionError) or "AccessDenied" in cause or "InvalidAccessKeyId" in cause \
                or "SignatureDoesNotMatch" in cause or "Forbidden" in cause or "credentials" in cause.lower():
            hint = f"The store refused the credentials: check {credentials}, and the bucket's policy for this prefix."
        elif isinstance(e, FileNotFoundError) or "NoSuchBucket" in cause:
            hint = "Check the bucket's name in c.GPUCR.store (GPUCR_STORE) and that it exists."
        else:
            hint = (f"Check that the store answers at its endpoint ({endpoint} or c.GPUCR.store_options' "
                    "endpoint_url) and that this node can reach it.")
        return ObjectStoreError(f"The checkpoint store {self!r} could not be used ({what}): {cause}.", hint)

    def probe(self) -> None:
        """List the user's prefix once: raises :class:`ObjectStoreError` when the store is unreachable or
        refuses the credentials, before anything is suspended into it."""
        try:
            self.fs.ls(self.root, detail=False)
        except FileNotFoundError:
            bucket = self.root.split("/", 1)[0]
            try:
                self.fs.ls(bucket, detail=False)  # an empty prefix is fine; a missing bucket is not
            except BaseException as e:
                raise self._failed("listing the bucket", e) from e
        except BaseException as e:
            raise self._failed("listing the user's prefix", e) from e

    # -- objects --------------------------------------------------------------------------
    def put_files(self, pairs: Sequence[tuple[str, str]], progress: Callable[[int], None] | None = None) -> None:
        """Upload each (local file, key): on S3, or sealed, in parts of :data:`PART` bytes,
        :data:`STREAMS` at once across all files; elsewhere as fsspec puts files."""
        if not pairs:
            return
        if self.key is not None or self.is_s3:
            self._put_parts(pairs, progress)
            return
        try:
            self.fs.put([p[0] for p in pairs], [self.path(p[1]) for p in pairs], batch_size=STREAMS,
                        callback=_counted(progress))
        except BaseException as e:
            raise self._failed("uploading", e) from e

    def _put_parts(self, pairs: Sequence[tuple[str, str]], progress: Callable[[int], None] | None) -> None:
        """Each file in parts, read (and sealed) as they are sent, :data:`STREAMS` parts at once across
        all files, so at most that many are in memory: on S3 a large file is a multipart upload,
        elsewhere (and for one part) a stream. (s3fs's own put held ``batch_size`` files times
        ``max_concurrency`` parts of 50 MiB in memory, and was slower against the same store:
        bench/bench_store_raw.py.)"""
        done = _Added(progress)
        uploads: list[tuple[str, str, list[Future[dict[str, Any]]]]] = []  # (key, upload id, parts) on S3
        pool = ThreadPoolExecutor(STREAMS, thread_name_prefix="gpucr-upload")
        try:
            streams = []
            for local, key in pairs:
                spans = part_spans(os.path.getsize(local))
                if len(spans) == 1 or not self.is_s3:
                    streams.append(pool.submit(self._put_stream, local, key, spans, done))
                    continue
                upload_id = self.call_s3("create_multipart_upload", key)["UploadId"]
                uploads.append((key, upload_id, [pool.submit(self._put_part, local, key, upload_id, number, span, done)
                                                 for number, span in enumerate(spans, 1)]))
            for stream in streams:
                stream.result()
            while uploads:
                key, upload_id, parts = uploads[0]
                self.call_s3("complete_multipart_upload", key, UploadId=upload_id,
                             MultipartUpload={"Parts": [p.result() for p in parts]})
                uploads.pop(0)
        except BaseException as e:
            pool.shutdown(wait=True, cancel_futures=True)  # no part is sent after its upload is aborted
            for key, upload_id, _ in uploads:  # incomplete uploads cost storage
                try:
                    self.call_s3("abort_multipart_upload", key, UploadId=upload_id)
                except Exception:
                    pass
            if isinstance(e, GPUCRError):
                raise
            raise self._failed("uploading", e) from e
        finally:
            pool.shutdown(wait=True)

    def call_s3(self, method: str, key: str, **kwargs: Any) -> Any:
        """One call of S3's API on the object at ``key`` (an S3 store only)."""
        bucket, path, _ = self.fs.split_path(self.path(key))
        return self.fs.call_s3(method, Bucket=bucket, Key=path, **kwargs)

    def upload_part(self, key: str, upload_id: str, number: int, body: bytes) -> str:
        """Send one part of the multipart upload ``upload_id`` to ``key``; its ETag. Through a plain
        botocore client where one matches s3fs's settings, so parts sent by several threads are
        hashed and copied in parallel (see :mod:`.s3threads`)."""
        with self._threaded_lock:
            if self._threaded is None:
                self._threaded = s3threads.threaded_client(self.fs, 2 * STREAMS) or False
        if not self._threaded:
            return self.call_s3("upload_part", key, UploadId=upload_id, PartNumber=number, Body=body)["ETag"]
        bucket, path, _ = self.fs.split_path(self.path(key))
        return s3threads.upload_part(self._threaded, self.fs, bucket, path, upload_id, number, body)

    def _put_stream(self, local: str, key: str, spans: list[tuple[int, int, bool]], done: _Added) -> None:
        fd = os.open(local, os.O_RDONLY)
        try:
            with self.fs.open(self.path(key), "wb") as out:
                for start, end, final in spans:
                    out.write(self.stored_bytes(key, lambda at, n: os.pread(fd, n, at), start, end, final))
                    done.add(end - start)
        finally:
            os.close(fd)

    def _put_part(self, local: str, key: str, upload_id: str, number: int, span: tuple[int, int, bool],
                  done: _Added) -> dict[str, Any]:
        start, end, final = span
        fd = os.open(local, os.O_RDONLY)
        try:
            data = self.stored_bytes(key, lambda at, n: os.pread(fd, n, at), start, end, final)
        finally:
            os.close(fd)
        etag = self.upload_part(key, upload_id, number, data)
        done.add(end - start)
        return {"PartNumber": number, "ETag": etag}

    def get_files(self, pairs: Sequence[tuple[str, str, int]], progress: Callable[[int], None] | None = None,
                  opener: StoreKey | None = None) -> None:
        """Download each (key, local file, size) as ranged reads of :data:`CHUNK` bytes, :data:`STREAMS` at
        once across all files, each written in place as it arrives (opened first when sealed: with
        ``opener``, the key they were sealed with, else the store's key)."""
        opener = opener or self.key
        ranges = [(key, local, start, min(size, start + CHUNK), size) for key, local, size in pairs
                  for start in range(0, max(size, 1), CHUNK)]
        done = _Added(progress)
        fds = {}
        try:
            for _key, local, size in pairs:
                fds[local] = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.ftruncate(fds[local], size)

            def one(r: tuple[str, str, int, int, int]) -> None:
                key, local, start, end, size = r
                data = self._read_range(key, start, end, size, opener)
                os.pwrite(fds[local], data, start)
                done.add(len(data))

            with ThreadPoolExecutor(STREAMS, thread_name_prefix="gpucr-download") as pool:
                list(pool.map(one, ranges))
        except GPUCRError:
            raise
        except BaseException as e:
            raise self._failed("downloading", e) from e
        finally:
            for fd in fds.values():
                os.close(fd)

    def _read_range(self, key: str, start: int, end: int, size: int, opener: StoreKey | None) -> bytes:
        """Plaintext [start, end) of the object at ``key`` (``size`` plaintext bytes), opened with ``opener``."""
        if opener is None:
            data = self.fs.cat_file(self.path(key), start=start, end=end) if end > start else b""
            if len(data) != end - start:
                raise OSError(f"{key}: {len(data)} bytes came back for bytes {start}-{end}")
            return data
        first, last = sealed_range(start, end, size)
        data = self.fs.cat_file(self.path(key), start=first, end=last)
        return opener.open_span(self.sealed_name(key), data, start, end, size, where=f"{self!r}/{key}")

    def sizes(self, prefix: str) -> dict[str, int]:
        """Every object below ``prefix`` (keys relative to it) and its size, as the store reports it."""
        base = self.path(prefix).rstrip("/")
        try:
            found = self.fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
        except BaseException as e:
            raise self._failed("listing", e) from e
        return {path[len(base) + 1:]: int(info.get("size") or 0) for path, info in found.items()
                if info.get("type") != "directory"}

    def names(self, prefix: str = "") -> list[str]:
        """The names one level below ``prefix`` (the kernels, or one kernel's checkpoints)."""
        base = self.path(prefix).rstrip("/")
        try:
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False))
        except FileNotFoundError:
            return []
        except BaseException as e:
            raise self._failed("listing", e) from e

    def read_json(self, key: str) -> dict[str, Any] | None:
        """The JSON object at ``key``; None when there is none."""
        try:
            data = self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            return None
        except BaseException as e:
            raise self._failed(f"reading {key}", e) from e
        try:
            value = json.loads(data)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def write_json(self, key: str, value: dict[str, Any], create: bool = False) -> bool:
        """Write ``value`` at ``key``. ``create``: only if no object is there (S3's ``If-None-Match: *``,
        a local file opened exclusively); False when one was. The store decides, so two writers
        racing for the same key cannot both succeed."""
        data = json.dumps(value, indent=1).encode()
        try:
            self.fs.pipe_file(self.path(key), data, mode="create" if create else "overwrite")
        except FileExistsError:
            return False
        except BaseException as e:
            if create and ("PreconditionFailed" in str(e) or "412" in str(e)):
                return False
            raise self._failed(f"writing {key}", e) from e
        return True

    # -- conditional writes (the lease) --------------------------------------------------------
    @property
    def is_s3(self) -> bool:
        return type(self.fs).__name__ == "S3FileSystem"

    @property
    def is_gcs(self) -> bool:
        protocol = self.fs.protocol
        return "gs" in (protocol if isinstance(protocol, (tuple, list)) else (protocol,))

    def read_json_tagged(self, key: str) -> tuple[dict[str, Any] | None, str | None]:
        """The JSON object at ``key`` and its tag: its ETag on S3, its generation on GCS, elsewhere
        a digest of its bytes; (None, None) when there is none. The tag is read first, so a write
        in between makes a later :meth:`put_json_if` with it fail rather than succeed on stale contents."""
        try:
            tag = None
            if self.is_s3 or self.is_gcs:
                info = self.fs.info(self.path(key))
                tag = str(info.get("ETag") or "") if self.is_s3 else str(info.get("generation") or "")
            data = self.fs.cat_file(self.path(key))
        except FileNotFoundError:
            return None, None
        except BaseException as e:
            raise self._failed(f"reading {key}", e) from e
        try:
            value = json.loads(data)
        except ValueError:
            value = None
        return (value if isinstance(value, dict) else None), tag or hashlib.sha256(data).hexdigest()

    def put_json_if(self, key: str, value: dict[str, Any], etag: str | None) -> str | None:
        """Write ``value`` at ``key`` only if the object there still has ``etag`` (None: only if there
        is none); its new tag, or None when the condition failed. On S3 (``If-Match`` /
        ``If-None-Match``) and GCS (``ifGenerationMatch``) the store decides, so of two writers with
        the same tag one wins; elsewhere the tag is compared, then the object written (not atomic:
        a shared file system)."""
        data = json.dumps(value, indent=1).encode()
        if self.is_gcs:
            return self._put_gcs_if(key, data, etag)
        if not self.is_s3:
            if etag is None:
                return hashlib.sha256(data).hexdigest() if self.write_json(key, value, create=True) else None
            if self.read_json_tagged(key)[1] != etag:
                return None
            self.write_json(key, value)
            return hashlib.sha256(data).hexdigest()
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        try:
            reply = self.call_s3("put_object", key, Body=data, **condition)
        except BaseException as e:
            if _precondition_failed(e) or (etag is not None and isinstance(e, FileNotFoundError)):
                return None
            raise self._failed(f"writing {key}", e) from e
        return str(reply.get("ETag") or "")

    def _put_gcs_if(self, key: str, data: bytes, generation: str | None) -> str | None:
        """One upload of ``data`` with GCS's precondition ``ifGenerationMatch``: 0 creates the object
        only if there is none, a generation replaces only that one; the new generation, or None when
        the store refused (412, which gcsfs raises as FileExistsError). A multipart upload, as
        gcsfs's own small writes are (gcsfs has no argument for a generation to match)."""
        bucket, name, _ = self.fs.split_path(self.path(key))
        boundary = "gpucr-json"
        body = (f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n{json.dumps({'name': name})}\r\n"
                f"--{boundary}\r\nContent-Type: application/json\r\n\r\n").encode() + data + f"\r\n--{boundary}--".encode()
        try:
            reply = self.fs.call("POST", f"{self.fs._location}/upload/storage/v1/b/{quote(bucket, safe='')}/o",
                                 uploadType="multipart", ifGenerationMatch=generation or "0", data=body, json_out=True,
                                 headers={"Content-Type": f"multipart/related; boundary={boundary}"})
        except FileExistsError:
            return None
        except BaseException as e:
            raise self._failed(f"writing {key}", e) from e
        return str(reply["generation"])

    def delete(self, key: str, recursive: bool = False) -> None:
        try:
            self.fs.rm(self.path(key), recursive=recursive)
        except FileNotFoundError:
            pass
        except BaseException as e:
            raise self._failed(f"deleting {key}", e) from e


def _precondition_failed(e: BaseException) -> bool:
    """Whether the store refused a conditional write because its condition did not hold (s3fs
    turns S3's 412 into an OSError with its own words; the cause keeps botocore's code)."""
    said = f"{e} {e.__cause__}"
    return any(w in said for w in ("PreconditionFailed", "412", "pre-conditions", "ConditionalRequestConflict"))


def part_spans(size: int) -> list[tuple[int, int, bool]]:
    """A file of ``size`` bytes as (start, end, last) parts of :data:`PART` bytes or more, whole chunks each."""
    part = max(PART, -(-size // (MAX_PARTS - 1) // PART) * PART)
    return [(start, min(size, start + part), start + part >= size) for start in range(0, max(size, 1), part)]


class _Added:
    """Bytes done, added up across threads, each new total reported."""

    def __init__(self, progress: Callable[[int], None] | None) -> None:
        self.progress, self.total, self.lock = progress, 0, threading.Lock()

    def add(self, n: int) -> None:
        with self.lock:
            self.total += n
            total = self.total
        if self.progress is not None:
            self.progress(total)


def _counted(progress: Callable[[int], None] | None) -> Any:
    """An fsspec callback adding up the bytes every transfer reports, for ``progress(total_so_far)``."""
    from fsspec.callbacks import Callback, NoOpCallback

    if progress is None:
        return NoOpCallback()
    report = progress
    lock = threading.Lock()
    done = [0]

    class _File(Callback):
        def relative_update(self, inc: int = 1) -> None:
            with lock:
                done[0] += inc
                total = done[0]
            report(total)

        def call(self, *args: Any, **kwargs: Any) -> None:
            pass

    class _All(Callback):
        def branched(self, path_1: str, path_2: str, **kwargs: Any) -> Callback:
            return _File()

        def call(self, *args: Any, **kwargs: Any) -> None:
            pass

    return _All()

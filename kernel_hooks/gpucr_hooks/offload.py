"""Move live PyTorch CUDA tensors out of GPU memory before a suspend, and back after the restore.

The CUDA driver's checkpoint copies device memory to pageable host memory at about 2 GB/s, and
CRIU then writes all of it again. For a model's weights and KV cache that is most of a suspend.
Here every CUDA storage reachable from Python objects is copied through small pinned staging
buffers (about 50 GB/s) into host memory backed by transparent huge pages (faulting those in is
faster than 4 KiB pages or fresh tmpfs pages), then shrunk to zero bytes so its memory goes back
to the allocator: the GPU can be released at once. Each chunk is written from the host copy into
one file of the checkpoint store as soon as it is there (parallel writes); a background thread
waits for the writes, fsyncs the file, unmaps the copy and leaves a marker (``<file>.written``:
``ok`` or the error) that the server waits for before CRIU dumps the process, so the image never
holds the tensors twice. Without enough free host memory the storages go straight to the file
instead (slower GPU release).

After the restore each storage is given its size back and refilled from the file. What is not
found here (tensors only C++ holds, CUDA graphs' pools) still goes through the driver's
checkpoint: correctness never depends on finding every tensor.

A storage's device address changes across this (as after any reallocation): code that cached raw
pointers (CUDA graphs) must re-capture; ``c.GPUCR.offload_gpu_tensors = False`` turns this off.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

CHUNK = 64 << 20
WRITERS = min(8, os.cpu_count() or 1)
MIN_BYTES = 1 << 20  # small storages are not worth a round trip; the driver takes them
WRITTEN = ".written"  # suffix of the marker the server waits for before the dump (engines.OFFLOAD_WRITTEN)
HOST_HEADROOM = 1 << 30  # host memory left free beside the host copy

#: (storage, offset in the file, size) of each storage currently off the GPU; kept in the
#: process, so a restored process knows what to refill (CRIU restores this list with the rest).
_offloaded: list[tuple[Any, int, int]] = []
_file: str | None = None
_host: _HostCopy | None = None  # the host copy while it is being written (or when writing failed)
_writer: threading.Thread | None = None


def offload_tensors(path: str, early_free: bool = True) -> dict[str, Any]:
    """Move every large CUDA storage out of the GPU into ``path`` and free its device memory;
    with ``early_free`` (and the host memory for it) return once the bytes are in host memory
    and write the file in the background. Reports the bytes moved."""
    global _file, _host, _writer
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized() or _offloaded:
        return {"bytes": 0, "storages": 0}
    storages = list(_cuda_storages(torch))
    total = sum(st.nbytes() for st in storages)
    if not storages:
        return {"bytes": 0, "storages": 0}
    if os.path.exists(path + WRITTEN):  # from an earlier suspend whose refill failed
        os.unlink(path + WRITTEN)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    host = _HostCopy.allocate(total, fd, path) if early_free and _room_for_host_copy(path, total) else None
    try:
        os.ftruncate(fd, total)
        _download(torch, storages, fd, host)
        if host is None:
            os.fsync(fd)
    except BaseException:  # nothing has left the GPU yet: drop the partial file and copy
        _offloaded.clear()
        if host is not None:
            host.abandon()
        os.close(fd)
        os.unlink(path)
        raise
    for st, _offset, _size in _offloaded:  # the bytes are safe in host memory or the file: free the GPU
        st.resize_(0)
    _file = path
    torch.cuda.empty_cache()
    if host is None:
        os.close(fd)
        _mark_written(path, "ok")
    else:
        _host = host
        _writer = threading.Thread(target=host.finish, name="gpucr-offload-writer", daemon=True)
        _writer.start()
    return {"bytes": total, "storages": len(storages), "file": path, "early_free": host is not None}


def reload_tensors() -> dict[str, Any]:
    """Refill every offloaded storage (after a restore, or a suspend that failed)."""
    if _file is None:
        return {"bytes": 0, "storages": 0}
    return reload_tensors_from(_file)


def reload_tensors_from(path: str) -> dict[str, Any]:
    global _file, _host, _writer
    torch = sys.modules["torch"]
    if _writer is not None:  # a suspend failed while the file was still being written
        _writer.join()
        _writer = None
    count, total = len(_offloaded), sum(size for _st, _off, size in _offloaded)
    host = _host
    fd = os.open(path, os.O_RDONLY) if host is None else -1
    read: Callable[[int, int, int], None] = (
        (lambda dst, n, offset: _pread(fd, dst, n, offset)) if host is None else host.read_into)
    try:
        for st, _offset, size in _offloaded:
            st.resize_(size)
        targets = [(_bytes_of(torch, st), offset, size) for st, offset, size in _offloaded]
        with _Staging(torch) as staging, ThreadPoolExecutor(WRITERS) as pool:
            staging.upload(pool, read, targets)  # reads run ahead across storages, many are small
        torch.cuda.synchronize()
        _offloaded.clear()
    finally:
        if fd >= 0:
            os.close(fd)
    if host is not None:
        host.release()
        _host = None
    for name in (path, path + WRITTEN):
        if os.path.exists(name):
            os.unlink(name)
    _file = None
    return {"bytes": total, "storages": count}


def _download(torch: Any, storages: list[Any], fd: int, host: _HostCopy | None) -> None:
    """Every storage's bytes into the file ``fd`` or the host copy, streamed through the staging
    buffers; the copies out of the staging buffers run in parallel behind the device copies."""
    offset = 0
    pending = []
    with _Staging(torch) as staging, ThreadPoolExecutor(WRITERS) as pool:
        for st in storages:
            size = st.nbytes()
            for chunk_off, n, buf, done in staging.download(_bytes_of(torch, st), size):
                args = (buf.data_ptr(), n, offset + chunk_off)
                if host is None:
                    pending.append(pool.submit(_then_set, done, _pwrite, *args, fd))
                else:
                    pending.append(pool.submit(_then_set, done, host.copy_in, *args))
            _offloaded.append((st, offset, size))
            offset += size
    for future in pending:
        future.result()  # a failed write raises here


def _then_set(done: threading.Event, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn`` and free its staging buffer whatever happens (a failure is seen by the caller)."""
    try:
        fn(*args)
    finally:
        done.set()


def _mark_written(path: str, status: str) -> None:
    tmp = path + WRITTEN + ".tmp"
    with open(tmp, "w") as f:
        f.write(status)
    os.replace(tmp, path + WRITTEN)


def _room_for_host_copy(path: str, total: int) -> bool:
    """Whether memory holds the host copy beside everything else, the file itself included when
    the store is in memory (tmpfs): a suspend must never push the machine into the OOM killer."""
    need = total + HOST_HEADROOM + (total if _in_memory_fs(path) else 0)
    return need < _available_memory()


def _available_memory() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    return 0


def _in_memory_fs(path: str) -> bool:
    """Whether ``path`` lies on tmpfs/ramfs (the mount with the longest matching prefix)."""
    path = os.path.realpath(path)
    best, fstype = "", ""
    with open("/proc/self/mounts") as f:
        for line in f:
            fields = line.split()
            mount = fields[1].replace("\\040", " ")
            if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                best, fstype = mount, fields[2]
    return fstype in ("tmpfs", "ramfs")


class _HostCopy:
    """Anonymous host memory for the tensors' bytes on their way to the file ``fd``: mapped
    outside Python's allocators (so it is unmapped the moment it is written), backed by
    transparent huge pages where the kernel allows it, and written out chunk by chunk as the
    chunks arrive."""

    _libc = ctypes.CDLL(None, use_errno=True)
    _libc.mmap.restype = ctypes.c_void_p
    _libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    _libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]

    def __init__(self, address: int, size: int, fd: int, path: str) -> None:
        self.address, self.size, self.fd, self.path = address, size, fd, path
        self.writers = ThreadPoolExecutor(WRITERS)
        self.writes: list[Future[None]] = []

    @classmethod
    def allocate(cls, size: int, fd: int, path: str) -> _HostCopy | None:
        import mmap

        address = cls._libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
                                 -1, 0)
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        cls._libc.madvise(address, size, mmap.MADV_HUGEPAGE)  # best effort: THP may be off
        return cls(address, size, fd, path)

    def copy_in(self, src: int, n: int, offset: int) -> None:
        """A chunk from a staging buffer; its write to the file starts at once."""
        ctypes.memmove(self.address + offset, src, n)  # releases the GIL: the copies run in parallel
        self.writes.append(self.writers.submit(_pwrite, self.address + offset, n, offset, self.fd))

    def finish(self) -> None:
        """Background: wait for the writes, fsync, unmap, mark the file written (or failed,
        keeping the copy: the tensors are refilled from it)."""
        global _host
        try:
            for write in self.writes:
                write.result()
            os.fsync(self.fd)
        except BaseException as e:
            _mark_written(self.path, f"{type(e).__name__}: {e}")
            return
        finally:
            self.writers.shutdown()
            os.close(self.fd)
        _host = None
        self.release()
        _mark_written(self.path, "ok")

    def abandon(self) -> None:
        self.writers.shutdown(cancel_futures=True)
        self.release()

    def read_into(self, dst: int, n: int, offset: int) -> None:
        ctypes.memmove(dst, self.address + offset, n)

    def release(self) -> None:
        if self.address:
            self._libc.munmap(self.address, self.size)
            self.address = 0


def _cuda_storages(torch: Any) -> Iterator[Any]:
    """Distinct, resizable CUDA storages of plain tensors and parameters, largest first."""
    gc.collect()
    seen: dict[tuple[int, int], Any] = {}
    for obj in gc.get_objects():
        if type(obj) is not torch.Tensor and type(obj) is not torch.nn.Parameter:
            continue
        try:
            if not obj.is_cuda or obj.is_sparse:
                continue
            st = obj.untyped_storage()
        except (RuntimeError, NotImplementedError):  # meta, sparse and other storage-less tensors
            continue
        if st.nbytes() >= MIN_BYTES and st.resizable():
            seen.setdefault((st.device.index, st.data_ptr()), st)
    yield from sorted(seen.values(), key=lambda s: -s.nbytes())


def _bytes_of(torch: Any, st: Any) -> Any:
    """The storage as one flat uint8 tensor on its device."""
    return torch.empty(0, dtype=torch.uint8, device=st.device).set_(st, 0, (st.nbytes(),))


def _pwrite(src: int, n: int, offset: int, fd: int) -> None:
    view = memoryview((ctypes.c_char * n).from_address(src))
    written = 0
    while written < n:
        written += os.pwrite(fd, view[written:], offset + written)


class _Staging:
    """A few pinned host buffers that chunks go through, each reused once its I/O finished."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.buffers = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(WRITERS)]
        self.free = [threading.Event() for _ in self.buffers]
        for e in self.free:
            e.set()
        self.next = 0

    def __enter__(self) -> _Staging:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:  # after a failure, buffers of chunks that never ran stay taken
            self.drain()

    def _take(self) -> tuple[Any, threading.Event]:
        i = self.next
        self.next = (i + 1) % len(self.buffers)
        self.free[i].wait()
        self.free[i].clear()
        return self.buffers[i], self.free[i]

    def download(self, src: Any, size: int) -> Iterator[tuple[int, int, Any, threading.Event]]:
        """Device bytes into staging buffers, chunk by chunk; the consumer writes and sets ``done``."""
        for off in range(0, size, CHUNK):
            n = min(CHUNK, size - off)
            buf, done = self._take()
            buf[:n].copy_(src[off:off + n])  # synchronous: the buffer holds the bytes when this returns
            yield off, n, buf, done

    def upload(self, pool: ThreadPoolExecutor, read: Callable[[int, int, int], None],
               targets: list[tuple[Any, int, int]]) -> None:
        """Bytes at each ``(dst, offset, size)`` into ``dst``; ``read(address, n, offset)`` fills a
        staging buffer (from the file or the host copy) and runs ahead on the pool while earlier
        chunks are copied up."""
        chunks: list[tuple[Any, int, int, Any, threading.Event, Any]] = []
        for dst, offset, size in targets:
            for off in range(0, size, CHUNK):
                n = min(CHUNK, size - off)
                buf, done = self._take() if len(chunks) < len(self.buffers) else self._upload_one(chunks.pop(0))
                chunks.append((dst, off, n, buf, done, pool.submit(read, buf.data_ptr(), n, offset + off)))
        while chunks:
            _buf, done = self._upload_one(chunks.pop(0))
            done.set()

    def _upload_one(self, chunk: tuple[Any, int, int, Any, threading.Event, Any]) -> tuple[Any, threading.Event]:
        """Copy one chunk up once it is read; its buffer is free again (returned for reuse)."""
        dst, off, n, buf, done, read = chunk
        read.result()
        dst[off:off + n].copy_(buf[:n])  # synchronous from pinned memory: the buffer is free after
        return buf, done

    def drain(self) -> None:
        for e in self.free:
            e.wait()


def _pread(fd: int, dst: int, n: int, offset: int) -> None:
    view = memoryview((ctypes.c_char * n).from_address(dst))
    got = 0
    while got < n:
        chunk = os.preadv(fd, [view[got:]], offset + got)
        if chunk == 0:
            raise OSError(f"the offload file ends early at byte {offset + got}")
        got += chunk

"""Move live PyTorch CUDA tensors out of GPU memory before a suspend, and back after the restore.

The CUDA driver's checkpoint copies device memory to pageable host memory at about 2 GB/s, and
CRIU then writes all of it again. For a model's weights and KV cache that is most of a suspend.
Here every CUDA storage reachable from Python objects is copied through small pinned staging
buffers (about 50 GB/s) into one file of the checkpoint store, written by parallel threads, then
shrunk to zero bytes so its memory goes back to the allocator; the driver and CRIU then handle the
CUDA context and the rest only. After the restore each storage is given its size back and refilled
from the file. What is not found here (tensors only C++ holds, CUDA graphs' pools) still goes
through the driver's checkpoint: correctness never depends on finding every tensor.

A storage's device address changes across this (as after any reallocation): code that cached raw
pointers (CUDA graphs) must re-capture; ``c.GPUCR.offload_gpu_tensors = False`` turns this off.
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

CHUNK = 64 << 20
WRITERS = min(8, os.cpu_count() or 1)
MIN_BYTES = 1 << 20  # small storages are not worth a round trip; the driver takes them

#: (storage, offset in the file, size) of each storage currently on disk; kept in the process,
#: so a restored process knows what to refill (CRIU restores this list with everything else).
_offloaded: list[tuple[Any, int, int]] = []
_file: str | None = None


def offload_tensors(path: str) -> dict[str, Any]:
    """Write every large CUDA storage to ``path`` and free its device memory; report the bytes."""
    global _file
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized() or _offloaded:
        return {"bytes": 0, "storages": 0}
    storages = list(_cuda_storages(torch))
    total = sum(st.nbytes() for st in storages)
    if not storages:
        return {"bytes": 0, "storages": 0}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.ftruncate(fd, total)
        offset = 0
        with _Staging(torch) as staging, ThreadPoolExecutor(WRITERS) as pool:
            for st in storages:  # every chunk streams out; the writers run in parallel behind the copies
                size = st.nbytes()
                for chunk_off, n, buf, done in staging.download(_bytes_of(torch, st), size):
                    pool.submit(_pwrite, fd, buf, n, offset + chunk_off, done)
                _offloaded.append((st, offset, size))
                offset += size
            staging.drain()
        os.fsync(fd)
    except BaseException:  # nothing has left the GPU yet: drop the partial file
        _offloaded.clear()
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    for st, _offset, _size in _offloaded:  # the bytes are safe in the file: free the GPU memory
        st.resize_(0)
    _file = path
    torch.cuda.empty_cache()
    return {"bytes": total, "storages": len(storages), "file": path}


def reload_tensors() -> dict[str, Any]:
    """Refill every offloaded storage from its file (after a restore, or a failed suspend)."""
    if _file is None:
        return {"bytes": 0, "storages": 0}
    return reload_tensors_from(_file)


def reload_tensors_from(path: str) -> dict[str, Any]:
    global _file
    torch = sys.modules["torch"]
    count, total = len(_offloaded), sum(size for _st, _off, size in _offloaded)
    fd = os.open(path, os.O_RDONLY)
    try:
        for st, _offset, size in _offloaded:
            st.resize_(size)
        targets = [(_bytes_of(torch, st), offset, size) for st, offset, size in _offloaded]
        with _Staging(torch) as staging, ThreadPoolExecutor(WRITERS) as pool:
            staging.upload(pool, fd, targets)  # reads run ahead across storages, many are small
        torch.cuda.synchronize()
        _offloaded.clear()
    finally:
        os.close(fd)
    os.unlink(path)
    _file = None
    return {"bytes": total, "storages": count}


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


def _pwrite(fd: int, buf: Any, n: int, offset: int, done: threading.Event) -> None:
    view = (ctypes.c_char * n).from_address(buf.data_ptr())
    written = 0
    while written < n:
        written += os.pwrite(fd, memoryview(view)[written:], offset + written)
    done.set()


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

    def __exit__(self, *exc: object) -> None:
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

    def upload(self, pool: ThreadPoolExecutor, fd: int, targets: list[tuple[Any, int, int]]) -> None:
        """File bytes into each ``(dst, file offset, size)``: reads run ahead on the pool while
        earlier chunks are copied up."""
        chunks: list[tuple[Any, int, int, Any, threading.Event, Any]] = []
        for dst, offset, size in targets:
            for off in range(0, size, CHUNK):
                n = min(CHUNK, size - off)
                buf, done = self._take() if len(chunks) < len(self.buffers) else self._upload_one(chunks.pop(0))
                chunks.append((dst, off, n, buf, done, pool.submit(_pread, fd, buf, n, offset + off)))
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


def _pread(fd: int, buf: Any, n: int, offset: int) -> None:
    view = memoryview((ctypes.c_char * n).from_address(buf.data_ptr()))
    got = 0
    while got < n:
        chunk = os.preadv(fd, [view[got:]], offset + got)
        if chunk == 0:
            raise OSError(f"the offload file ends early at byte {offset + got}")
        got += chunk

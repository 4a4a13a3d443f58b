"""Move live PyTorch CUDA tensors out of GPU memory before a suspend, and back after the restore.

The CUDA driver's checkpoint copies device memory to pageable host memory at about 2 GB/s, and
CRIU then writes all of it again. For a model's weights and KV cache that is most of a suspend.
Here every CUDA storage reachable from Python objects is copied through small pinned staging
buffers (about 50 GB/s) and written in parallel into a folder of the checkpoint store, one file
per writer thread (writes into one file queue on its lock: on the H200 machine tmpfs took 2.3 GB/s
into one file, 17.7 GB/s into eight); then each storage is shrunk to zero bytes so its memory goes
back to the allocator and the GPU can be released. The bytes are then in the page cache (or tmpfs),
which is the host copy: the server makes the files durable while CRIU dumps the rest (the process
is only stopped for good once both are), so the image never holds the tensors twice. A full disk
fails the writes before anything left the GPU.

The GPU's thread-stack reservation is given back too (``stacks``). After the restore each storage
is given its size back and refilled from the files, and the stack limit put back. What is not
found here (tensors only C++ holds, CUDA graphs' pools) still goes through the driver's
checkpoint: correctness never depends on finding every tensor.

A storage's device address changes across this (as after any reallocation): code that cached raw
pointers (CUDA graphs) must re-capture; ``c.GPUCR.offload_gpu_tensors = False`` turns this off.

Save points (``remember``, ``reuse``): the storages' fingerprints (``fingerprints``) are kept with
where their bytes went; the next save point takes a storage whose fingerprint is unchanged from
the earlier save point's files (hard links into its folder) instead of writing it again. Files are
named uniquely per offload, so a link always holds the bytes it was recorded with.
"""

from __future__ import annotations

import ctypes
import gc
import os
import queue
import secrets
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from . import gpu_ids, idle, stacks
from .fingerprints import Fingerprint, bytes_of, fingerprints

CHUNK = 16 << 20  # 32 staging buffers of it: 512 MiB to fault in and register (1 GiB took 0.15 s)
WRITERS = min(16, os.cpu_count() or 1)  # one file each: writes into fresh tmpfs pages scale with threads
READERS = min(16, os.cpu_count() or 1)
BUFFERS_PER_THREAD = 2  # a thread's next chunk is copied while it writes (reads) the one before
MIN_BYTES = 1 << 20  # small storages are not worth a round trip; the driver takes them

#: (storage, offset, size) of each storage currently off the GPU, its bytes numbered as if the
#: storages lay end to end, and where each of their chunks went (by that offset: file name, offset
#: in it); kept in the process, so a restored process knows what to refill (CRIU restores these).
_offloaded: list[tuple[Any, int, int]] = []
_placed: dict[int, tuple[str, int]] = {}
_folder: str | None = None
#: The last save point's storages by fingerprint: where each chunk of their bytes is (its offset in
#: the storage, its length, file name, offset in the file), for the next save point to link to.
_kept: dict[Fingerprint, list[tuple[int, int, str, int]]] = {}
#: One tensor of each large CUDA storage, found while the kernel was idle (weakly held), and how
#: many cells had started then: a suspend before the next cell need not search the heap for them.
_census: tuple[int, list[weakref.ref[Any]]] | None = None


def offload_tensors(path: str, collect: bool = True, reuse: list[str] | None = None,
                    remember: bool = False) -> dict[str, Any]:
    """Move every large CUDA storage out of the GPU into the folder ``path`` and free its device
    memory; return once the bytes are written (not yet durable: see the module's docstring).
    ``collect=False`` skips the garbage collection (the caller just ran one; with ``collect`` it is
    skipped too when the kernel collected while idle, see ``idle``). ``remember`` (a save point):
    keep the storages' fingerprints for the next offload, which takes those still unchanged from
    the files in the folders ``reuse`` (the save points'): a save point's, or a suspend's. Reports
    the bytes moved (``bytes``, of which ``linked`` were taken by reference) and where the time went."""
    global _folder, _kept
    t0 = time.perf_counter()
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized() or _offloaded:
        return {"bytes": 0, "storages": 0}
    if collect:
        idle.collect_unless_clean()
    with ThreadPoolExecutor(1) as early:
        pending = early.submit(_Staging, torch, WRITERS * BUFFERS_PER_THREAD)  # faulted in while the storages are found
        try:
            storages = _storages_found_while_idle()
            found_while_idle = storages is not None
            if storages is None:
                storages = _storages_of(_cuda_tensors(torch))
        finally:
            staging = pending.result()
    t_found = time.perf_counter()
    prints = fingerprints(torch, storages) if remember or (reuse and _kept) else [None] * len(storages)
    t_printed = time.perf_counter()
    with staging:
        if not storages:
            return {"bytes": 0, "storages": 0}
        stripes = _Stripes.create(path, WRITERS)
        try:
            linked = _link_unchanged(storages, prints, stripes, reuse or [])
            _download([st for st in storages if id(st) not in linked], stripes, staging)
        except BaseException:  # nothing has left the GPU yet: drop the partial files
            _offloaded.clear()
            _placed.clear()
            stripes.remove()
            raise
        stripes.close()
    if remember:
        where = {id(st): (offset, size) for st, offset, size in _offloaded}
        _kept = {fp: _chunks_at(*where[id(st)]) for st, fp in zip(storages, prints) if fp is not None}
    t_copied = time.perf_counter()
    used_devices = {st.device.index for st, _offset, _size in _offloaded}
    for st, _offset, _size in _offloaded:  # the bytes are safe in the page cache: free the GPU
        st.resize_(0)
    _folder = path
    torch.cuda.empty_cache()
    stacks.release(torch, used_devices)
    t_freed = time.perf_counter()
    return {"bytes": sum(size for _st, _offset, size in _offloaded), "storages": len(storages), "files": WRITERS,
            "linked": sum(linked.values()), "bytes_by_gpu": _bytes_by_gpu(),
            "seconds": round(time.perf_counter() - t0, 3), "find_s": round(t_found - t0, 3),
            "found_while_idle": found_while_idle, "fingerprint_s": round(t_printed - t_found, 3),
            "copy_s": round(t_copied - t_printed, 3), "free_s": round(t_freed - t_copied, 3),
            "reserved_left": sum(torch.cuda.memory_reserved(d) for d in range(torch.cuda.device_count())),
            # what the driver's checkpoint still copies: the context itself, beside the allocator's rest
            # (asked only of devices the tensors were on: asking another would create a context there)
            "device_used_left": sum(total - free for free, total in map(torch.cuda.mem_get_info, used_devices))}


def reload_tensors() -> dict[str, Any]:
    """Refill every offloaded storage (after a restore, or a suspend that failed)."""
    if _folder is None:
        return {"bytes": 0, "storages": 0}
    return reload_tensors_from(_folder)


def reload_tensors_from(path: str) -> dict[str, Any]:
    global _folder
    t0 = time.perf_counter()
    torch = sys.modules["torch"]
    count, total = len(_offloaded), sum(size for _st, _off, size in _offloaded)
    stripes = _Stripes.open(path)
    try:
        for st, _offset, size in _offloaded:
            st.resize_(size)
        t_allocated = time.perf_counter()
        targets = [(bytes_of(torch, st), offset, size) for st, offset, size in _offloaded]
        with _Staging(torch, READERS * BUFFERS_PER_THREAD, lazy=True) as staging, ThreadPoolExecutor(READERS) as pool:
            t_staged = time.perf_counter()
            staging.upload(pool, stripes.read_placed, targets)  # reads run ahead across storages, many are small
            waits = {"read_wait_s": round(staging.read_wait, 3), "copy_up_s": round(staging.copy_time, 3)}
        torch.cuda.synchronize()
        stacks.restore(torch)
        _offloaded.clear()
        _placed.clear()
    finally:
        stripes.close()
    _Stripes.discard_folder(path)
    _folder = None
    return {"bytes": total, "storages": count, "seconds": round(time.perf_counter() - t0, 3),
            "alloc_s": round(t_allocated - t0, 3), "staging_s": round(t_staged - t_allocated, 3), **waits}


def _link_unchanged(storages: list[Any], prints: list[Fingerprint | None], stripes: _Stripes,
                    reuse: list[str]) -> dict[int, int]:
    """Storages whose bytes an earlier save point kept unchanged (by fingerprint) are placed in its
    files, linked into this offload's folder; returns their sizes by ``id``. One whose files are not
    all found in ``reuse`` (that save point is gone) is written instead."""
    linked: dict[int, int] = {}
    for st, fp in zip(storages, prints):
        chunks = _kept.get(fp) if fp is not None else None
        if chunks and all(stripes.link_from(reuse, name) for _off, _n, name, _at in chunks):
            offset = _next_offset()
            for off, _n, name, at in chunks:
                _placed[offset + off] = (name, at)
            _offloaded.append((st, offset, st.nbytes()))
            linked[id(st)] = st.nbytes()
    return linked


def _next_offset() -> int:
    """Where the next storage's bytes start in the end-to-end numbering."""
    return _offloaded[-1][1] + _offloaded[-1][2] if _offloaded else 0


def _chunks_at(offset: int, size: int) -> list[tuple[int, int, str, int]]:
    """Where the chunks of the storage offloaded at ``offset`` are (see ``_kept``)."""
    return [(off, min(CHUNK, size - off), *_placed[offset + off]) for off in range(0, size, CHUNK)]


def _download(storages: list[Any], stripes: _Stripes, staging: _Staging) -> None:
    """Every storage's bytes into the files, streamed through the staging buffers; the writes
    out of the staging buffers run in parallel behind the device copies."""
    offset = _next_offset()
    pending = []
    with ThreadPoolExecutor(WRITERS) as pool:
        for st in storages:
            size = st.nbytes()
            for chunk_off, n, buf, done in staging.download(bytes_of(staging.torch, st), size):
                pending.append(pool.submit(_then_set, done, stripes.write_placed, buf.data_ptr(), n, offset + chunk_off))
            _offloaded.append((st, offset, size))
            offset += size
    for future in pending:
        future.result()  # a failed write raises here


def _bytes_by_gpu() -> dict[str, int]:
    """The offloaded bytes of each GPU, by its UUID: the restore must find room for them beside
    what the driver restores (it sees only the latter), on the GPU it picks for each."""
    by_index: dict[int, int] = {}
    for st, _offset, size in _offloaded:
        by_index[st.device.index] = by_index.get(st.device.index, 0) + size
    return {uuid: n for index, n in by_index.items() if (uuid := gpu_ids.device_uuid(index))}


def _then_set(done: threading.Event, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn`` and free its staging buffer whatever happens (a failure is seen by the caller)."""
    try:
        fn(*args)
    finally:
        done.set()


class _Stripes:
    """The offload's files in one folder, one per writer (named for this offload alone): each
    write takes a file no other thread is writing, appends the chunk and records where it went in
    ``_placed`` (by the chunk's offset in the storages' end-to-end numbering), so parallel writes
    never wait on each other. Reads open every file of the folder, linked ones included."""

    def __init__(self, folder: str, fds: dict[str, int]) -> None:
        self.folder, self.fds = folder, fds
        self.names = list(fds)
        self.ends = [0] * len(fds)
        self.idle: queue.SimpleQueue[int] = queue.SimpleQueue()
        for i in range(len(fds)):
            self.idle.put(i)

    @classmethod
    def create(cls, folder: str, count: int) -> _Stripes:
        cls.remove_folder(folder)  # left by an earlier suspend that failed
        os.mkdir(folder, 0o700)
        tag = secrets.token_hex(6)
        names = [f"{tag}-{i}.bin" for i in range(count)]
        return cls(folder, {n: os.open(os.path.join(folder, n), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
                            for n in names})

    @classmethod
    def open(cls, folder: str) -> _Stripes:
        return cls(folder, {n: os.open(os.path.join(folder, n), os.O_RDONLY)
                            for n in os.listdir(folder) if n.endswith(".bin")})

    def link_from(self, folders: list[str], name: str) -> bool:
        """``name`` from the first of ``folders`` that has it, linked into this folder; False if none."""
        if os.path.exists(os.path.join(self.folder, name)):
            return True
        for folder in folders:
            try:
                os.link(os.path.join(folder, name), os.path.join(self.folder, name))
                return True
            except FileNotFoundError:
                continue
        return False

    def write_placed(self, src: int, n: int, offset: int) -> None:
        i = self.idle.get()
        try:
            _pwrite(src, n, self.ends[i], self.fds[self.names[i]])
            _placed[offset] = (self.names[i], self.ends[i])
            self.ends[i] += n
        finally:
            self.idle.put(i)

    def read_placed(self, dst: int, n: int, offset: int) -> None:
        name, at = _placed[offset]
        _pread(self.fds[name], dst, n, at)

    def close(self) -> None:
        for fd in self.fds.values():
            os.close(fd)
        self.fds = {}

    def remove(self) -> None:
        self.close()
        self.remove_folder(self.folder)

    @classmethod
    def discard_folder(cls, folder: str) -> None:
        """Out of the way at once (a rename), deleted in the background: freeing 6 GB of tmpfs
        took about 0.5 s on the H200 machine, which the first cell after a restore waited for."""
        gone = f"{folder}.old-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(folder, gone)
        threading.Thread(target=cls.remove_folder, args=(gone,), name="gpucr-offload-remove", daemon=True).start()

    @staticmethod
    def remove_folder(folder: str) -> None:
        if os.path.isdir(folder):
            for name in os.listdir(folder):
                os.unlink(os.path.join(folder, name))
            os.rmdir(folder)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


MADV_POPULATE_WRITE = 23  # Linux 5.14+


def _map_huge(size: int, fault_in: bool = True) -> int | None:
    """Anonymous memory outside Python's allocators (unmapped the moment it is done with), backed
    by transparent huge pages where the kernel allows it (they fault in 2-4x faster than 4 KiB
    pages) and, with ``fault_in``, faulted in by several threads at once (one thread zeroes about
    4 GB/s); None if the mapping fails."""
    import mmap

    address = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    if address in (None, ctypes.c_void_p(-1).value):
        return None
    _libc.madvise(address, size, mmap.MADV_HUGEPAGE)  # best effort: THP may be off
    if fault_in:
        slices = [(address + off, min(CHUNK, size - off)) for off in range(0, size, CHUNK)]
        with ThreadPoolExecutor(min(len(slices), os.cpu_count() or 1)) as pool:
            list(pool.map(lambda sl: _fault_in(*sl), slices))
    return int(address)


def _fault_in(address: int, size: int) -> None:
    if _libc.madvise(address, size, MADV_POPULATE_WRITE) != 0:  # an older kernel: touch it
        ctypes.memset(address, 0, size)


def take_census() -> None:
    """After the idle collection: remember the tensors a suspend would search the heap for
    (0.17-0.2 s in W2, a fifth of the time to free the GPU). No cell has run when a suspend uses
    them; a tensor made since by a thread of the kernel goes through the driver's checkpoint."""
    global _census
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized() or _offloaded:
        _census = None
        return
    _census = (idle.cells_started(), [weakref.ref(t) for t, _st in _one_per_storage(_cuda_tensors(torch))])


idle.after_idle_collection(take_census)


def _storages_found_while_idle() -> list[Any] | None:
    """The census's storages if no cell started since it was taken (None otherwise), as they
    are now: tensors gone since are left out, and storages are checked again."""
    global _census
    census, _census = _census, None  # used once: the storages are offloaded after this
    if census is None or census[0] != idle.cells_started():
        return None
    return _storages_of(t for t in (ref() for ref in census[1]) if t is not None)


def _cuda_tensors(torch: Any) -> list[Any]:
    """Plain tensors and parameters on a GPU, from one pass over the heap (in C-speed bytecode:
    the heap is large)."""
    kinds = {torch.Tensor, torch.nn.Parameter}
    return [o for o in gc.get_objects() if type(o) in kinds and o.is_cuda]


def _storages_of(tensors: Iterable[Any]) -> list[Any]:
    """Distinct, resizable CUDA storages of ``tensors`` of at least ``MIN_BYTES``, largest first."""
    return sorted((st for _t, st in _one_per_storage(tensors)), key=lambda s: -s.nbytes())


def _one_per_storage(tensors: Iterable[Any]) -> list[tuple[Any, Any]]:
    """One of ``tensors`` for each distinct, resizable CUDA storage of at least ``MIN_BYTES``,
    with that storage (a census of a heap of many small tensors stays small)."""
    seen: dict[tuple[int, int], tuple[Any, Any]] = {}
    for t in tensors:
        try:
            if not t.is_cuda or t.is_sparse:
                continue
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # meta, sparse and other storage-less tensors
            continue
        if st.nbytes() >= MIN_BYTES and st.resizable():
            seen.setdefault((st.device.index, st.data_ptr()), (t, st))
    return list(seen.values())


def _pwrite(src: int, n: int, offset: int, fd: int) -> None:
    view = memoryview((ctypes.c_char * n).from_address(src))
    written = 0
    while written < n:
        written += os.pwrite(fd, view[written:], offset + written)


class _Staging:
    """A few pinned host buffers that chunks go through, each reused once its I/O finished.

    They are carved from one huge-page mapping registered with the driver (cudaHostRegister):
    pinning already faulted huge pages took 0.17 s for 6 GB on the H200 machine, where a pinned
    allocation (cudaHostAlloc, ``pin_memory=True``) took 4.4 s, and PyTorch's cache of pinned
    memory is emptied before a suspend anyway. With ``lazy`` (the refill) nothing is faulted in
    up front: the reads that fill a buffer fault its pages in, in parallel, and the uploading
    thread registers each buffer the first time it copies from it (faulting in and registering
    512 MiB first took 0.07-0.10 s; most of the faulting moved into the reads, the refill gained
    0.03 s: docs/dev/benchmarks.md). Reusable as a context manager once."""

    def __init__(self, torch: Any, count: int, lazy: bool = False) -> None:
        self.torch = torch
        self.size = count * CHUNK
        self.address = _map_huge(self.size, fault_in=not lazy)
        self.registered: list[int] = []  # base addresses to unregister
        self.unregistered: set[int] = set()  # (lazy) buffers not registered yet, by index
        if self.address is not None and not lazy:
            if self._register(self.address, self.size):
                self.registered.append(self.address)
            else:
                _libc.munmap(self.address, self.size)
                self.address = None
        if self.address is None:  # no mapping or no registration: PyTorch's pinned allocations
            self.buffers = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(count)]
        else:
            whole = torch.frombuffer((ctypes.c_char * self.size).from_address(self.address), dtype=torch.uint8)
            self.buffers = [whole[i * CHUNK:(i + 1) * CHUNK] for i in range(count)]
            if lazy:
                self.unregistered.update(range(count))
        self.free = [threading.Event() for _ in self.buffers]
        for e in self.free:
            e.set()
        self.next = 0
        self.read_wait = self.copy_time = 0.0  # seconds the uploading thread waited for reads, and copied

    def _register(self, address: int, size: int) -> bool:
        """Pin host memory for DMA; cudaHostRegisterPortable: for every GPU's context, whichever
        thread registers it."""
        return int(self.torch.cuda.cudart().cudaHostRegister(address, size, 1)) == 0

    def _register_once(self, buf: Any) -> None:
        """(lazy) Register a buffer its reads have faulted in, before the first copy from it. Left
        unregistered if that fails: the copy then goes through the driver's own staging (slower,
        the same bytes)."""
        i = (buf.data_ptr() - self.address) // CHUNK
        if i in self.unregistered:
            self.unregistered.discard(i)
            if self._register(buf.data_ptr(), CHUNK):
                self.registered.append(buf.data_ptr())

    def __enter__(self) -> _Staging:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        """Callers leave their thread pool first, so no I/O uses a buffer any more."""
        if exc_type is None:  # after a failure, buffers of chunks that never ran stay taken
            self.drain()
        self.buffers = []
        if self.address is not None:
            for base in self.registered:
                self.torch.cuda.cudart().cudaHostUnregister(base)
            _libc.munmap(self.address, self.size)
            self.address = None

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
               targets: list[tuple[Any, int, int]], landed: Callable[[int], None] | None = None) -> None:
        """Bytes at each ``(dst, offset, size)`` into ``dst``; ``read(address, n, offset)`` fills a
        staging buffer (from the files) and runs ahead on the pool while earlier
        chunks are copied up. ``landed(i)`` is called once all of ``targets[i]`` is on its device."""
        chunks: list[tuple[Any, int, int, Any, threading.Event, Any, int | None]] = []
        for i, (dst, offset, size) in enumerate(targets):
            for off in range(0, size, CHUNK):
                n = min(CHUNK, size - off)
                buf, done = self._take() if len(chunks) < len(self.buffers) else self._upload_one(chunks.pop(0), landed)
                chunks.append((dst, off, n, buf, done, pool.submit(read, buf.data_ptr(), n, offset + off),
                               i if off + n == size else None))
        while chunks:
            _buf, done = self._upload_one(chunks.pop(0), landed)
            done.set()

    def _upload_one(self, chunk: tuple[Any, int, int, Any, threading.Event, Any, int | None],
                    landed: Callable[[int], None] | None) -> tuple[Any, threading.Event]:
        """Copy one chunk up once it is read; its buffer is free again (returned for reuse)."""
        dst, off, n, buf, done, read, last_of = chunk
        t0 = time.perf_counter()
        read.result()
        if self.unregistered:
            self._register_once(buf)
        t1 = time.perf_counter()
        dst[off:off + n].copy_(buf[:n])  # synchronous from pinned memory: the buffer is free after
        self.read_wait += t1 - t0
        self.copy_time += time.perf_counter() - t1
        if last_of is not None and landed is not None:
            landed(last_of)
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

"""A snapshot's PyTorch storages, read from its data file ahead of the unpickler that asks for them.

Tensor bytes are most of a snapshot. Read one storage at a time when the unpickler meets it, the
disk, the copies to the GPU and the unpickling (which imports the modules of the model's classes
as it goes) wait for each other. Here every storage is allocated on its device when the load
starts, then filled in the background, in the data file's order, by several threads with large
positioned reads (they release the GIL) while the unpickler rebuilds the objects around them: a
CPU storage is read straight into its memory; GPU storages go through pinned staging buffers, as
the offload's refill does (reads run ahead of the copies). The unpickler takes each storage once
its bytes are in.

A kernel started ahead of its restore (``snapshot_prepare``) creates the CUDA context of each GPU
the load will use and its staging buffers before the restore (:func:`prepare`), and frees the
allocation that made the context: it holds the context and host memory, no GPU memory.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .devicemap import DeviceMap
from .files import pread_into
from .offload import BUFFERS_PER_THREAD, CHUNK, READERS, _Staging

#: Staging buffers made by :func:`prepare` for the load that follows.
_prepared: _Staging | None = None


@dataclass(frozen=True)
class Storage:
    """Where one storage's bytes are in the data file, and the device it goes to."""

    offset: int
    nbytes: int
    device: str


def torch_storages(table: list[list[Any] | None], devices: DeviceMap, cuda_count: int) -> dict[int, Storage]:
    """The PyTorch storages of a blob table, by blob index, with the device each is loaded on.
    Empty for a table written before entries said what they hold."""
    found = {}
    for index, entry in enumerate(table):
        if entry is not None and len(entry) >= 4 and entry[2] == "torch":
            found[index] = Storage(entry[0], entry[1], devices.resolve(entry[3], cuda_count))
    return found


def prepare(table: list[list[Any] | None], devices: DeviceMap) -> dict[str, Any]:
    """Ahead of a load (a kernel started before its restore): create the CUDA context (and cuBLAS) of every GPU
    the snapshot's storages will go to, and the pinned staging buffers, kept for that load. Nothing
    when no storage goes to a GPU. Returns the GPUs and the seconds it took."""
    global _prepared
    t0 = time.perf_counter()
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    gpus = sorted({s.device for s in torch_storages(table, devices, count).values() if s.device != "cpu"})
    if not gpus:
        return {"devices": [], "seconds": time.perf_counter() - t0}
    for device in gpus:  # GPU only: a first allocation creates the context; freed at once
        torch.empty(1, device=device).zero_()
        for dtype in (torch.bfloat16, torch.float32):  # cuBLAS's handle and workspace, which a first cell would wait for
            square = torch.ones(64, 64, device=device, dtype=dtype)
            torch.mm(square, square, out=square.clone())
        torch.cuda.synchronize(device)
    torch.cuda.empty_cache()  # the context stays, its first block of memory goes back
    if _prepared is None:
        _prepared = _Staging(torch, READERS * BUFFERS_PER_THREAD)
    return {"devices": gpus, "staging_bytes": _prepared.size, "seconds": time.perf_counter() - t0}


def discard_prepared() -> None:
    """Free staging :func:`prepare` made that no load used (the load put no tensor on a GPU)."""
    global _prepared
    if _prepared is not None:
        staging, _prepared = _prepared, None
        with staging:
            pass


def _staging(torch: Any) -> _Staging:
    """The staging :func:`prepare` made, else buffers that fault in and pin as the reads fill them."""
    global _prepared
    if _prepared is not None:
        staging, _prepared = _prepared, None
        return staging
    return _Staging(torch, READERS * BUFFERS_PER_THREAD, lazy=True)


class Readahead:
    """Fills ``storages`` from the data file at ``path`` in the background; :meth:`take` hands each
    one over once its bytes are in. Close it (a context manager) to stop the reads and free what
    was not taken."""

    def __init__(self, torch: Any, path: Path, storages: Mapping[int, Storage]) -> None:
        t0 = time.perf_counter()
        self._torch = torch
        self._flat = {i: torch.empty(s.nbytes, dtype=torch.uint8, device=s.device) for i, s in storages.items()}
        self._landed = {i: threading.Event() for i in storages}
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self.waited = 0.0  # seconds take() waited for bytes
        self.started = time.perf_counter()
        self.setup_s = self.started - t0  # allocating the storages (a fresh kernel: creating CUDA contexts)
        self.done_s: float | None = None  # when the last byte was in, from ``started``
        self.nbytes = sum(s.nbytes for s in storages.values())
        self._left = len(storages)
        self._lock = threading.Lock()
        self._fd = os.open(path, os.O_RDONLY)
        self._pool = ThreadPoolExecutor(READERS, thread_name_prefix="gpucr-readahead")
        in_order = sorted(storages.items(), key=lambda item: item[1].offset)
        gpu = [(i, (self._flat[i], s.offset, s.nbytes)) for i, s in in_order if s.device != "cpu" and s.nbytes]
        for i, s in in_order:
            if s.device == "cpu" and s.nbytes:
                self._read_on_cpu(i, s)
            elif not s.nbytes:
                self._landed_one(i)
        self._uploading = threading.Thread(target=self._upload, args=(gpu,), name="gpucr-upload", daemon=True)
        if gpu:
            self._uploading.start()

    def __enter__(self) -> Readahead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __contains__(self, index: int) -> bool:
        return index in self._landed

    def take(self, index: int) -> Any:
        """Storage ``index`` as a flat uint8 tensor, once its bytes are in (raises if they never will)."""
        landed = self._landed[index]
        if not landed.is_set():
            t0 = time.perf_counter()
            landed.wait()
            self.waited += time.perf_counter() - t0
        flat = self._flat.pop(index, None)
        if flat is None:
            raise RuntimeError(f"storage #{index} could not be read") from self._error
        return flat

    def close(self) -> None:
        """Stop reading, wait for reads under way, and free the storages nobody took."""
        self._stop.set()
        if self._uploading.is_alive():
            self._uploading.join()
        self._pool.shutdown(cancel_futures=True)
        os.close(self._fd)
        if self._flat:
            cuda = any(f.is_cuda for f in self._flat.values())
            self._flat.clear()
            if cuda:  # GPU only
                self._torch.cuda.empty_cache()

    # -- the reads ------------------------------------------------------------------------
    def _read_on_cpu(self, index: int, storage: Storage) -> None:
        """Read a CPU storage in CHUNK pieces on the pool, straight into its memory."""
        flat = self._flat[index]
        base = flat.data_ptr()
        pieces = list(range(0, storage.nbytes, CHUNK))
        left = [len(pieces)]

        def piece(start: int) -> None:
            try:
                if self._stop.is_set():
                    raise RuntimeError("the load stopped")
                pread_into(self._fd, base + start, min(CHUNK, storage.nbytes - start), storage.offset + start)
            except BaseException as exc:  # the storage is not handed out; take() says why
                self._failed(index, exc)
                return
            with self._lock:
                left[0] -= 1
                whole = left[0] == 0
            if whole:
                self._landed_one(index)

        for start in pieces:
            self._pool.submit(piece, start)

    def _upload(self, gpu: list[tuple[int, tuple[Any, int, int]]]) -> None:
        """GPU only: each ``(index, (storage, offset, nbytes))`` through the staging buffers, in file order."""
        order = [i for i, _target in gpu]
        targets = [target for _i, target in gpu]
        try:  # the pool is left first: no read fills a staging buffer once it is unmapped
            with _staging(self._torch) as staging, ThreadPoolExecutor(READERS, thread_name_prefix="gpucr-upload") as pool:
                staging.upload(pool, self._read_to, targets, landed=lambda t: self._landed_one(order[t]))
        except BaseException as exc:  # the storages not in yet are not handed out; take() says why
            for i in order:
                if not self._landed[i].is_set():
                    self._failed(i, exc)

    def _read_to(self, address: int, n: int, offset: int) -> None:
        if self._stop.is_set():
            raise RuntimeError("the load stopped")
        pread_into(self._fd, address, n, offset)

    def _landed_one(self, index: int) -> None:
        with self._lock:
            self._left -= 1
            if self._left == 0:
                self.done_s = time.perf_counter() - self.started
        self._landed[index].set()

    def _failed(self, index: int, exc: BaseException) -> None:
        with self._lock:
            self._error = self._error or exc
            self._flat.pop(index, None)
        self._landed[index].set()

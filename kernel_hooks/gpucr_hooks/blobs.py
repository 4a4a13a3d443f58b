"""Arrays and tensors travel outside the pickle stream, as raw bytes in one data file.

Raw bytes are written as fast as the disk takes them, do not depend on the device they came
from, and on load each array is read straight into its own buffer on the device that the
:class:`~gpucr_hooks.devicemap.DeviceMap` picks (PyTorch storages are read ahead of the unpickler,
``readahead``). The pickle keeps only a small persistent id: ``(kind, index, dtype,
shape/device...)``; ``index`` points into a table of ``[offset, nbytes, kind, device]`` stored in
the manifest (snapshots written before have ``[offset, nbytes]``: their storages are read one at a
time, when the unpickler asks).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from .devicemap import DeviceMap
from .files import readinto_exactly
from .readahead import Readahead, discard_prepared, torch_storages

CHUNK = 64 << 20
"""Size of the pinned host buffer that stages GPU <-> disk copies (pageable copies are far slower)."""


@dataclass
class _Source:
    obj: Any  # what is written; holding it keeps ids of registered objects unique
    nbytes: int
    kind: str  # "numpy", "torch", "cupy", "jax"
    device: str
    write: Callable[[Any, BinaryIO, _Staging], None]


class _Staging:
    """One pinned host buffer, made on first use and reused for every GPU copy."""

    def __init__(self) -> None:
        self._buffer: Any = None

    def buffer(self, torch: Any) -> Any:
        if self._buffer is None:
            self._buffer = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
        return self._buffer


class BlobWriter:
    """Collects the arrays met while pickling and writes the ones a kept pickle refers to."""

    def __init__(self) -> None:
        self.sources: list[_Source] = []
        self._index: dict[Any, int] = {}
        self._staging = _Staging()
        self._np = sys.modules.get("numpy")
        torch = sys.modules.get("torch")
        self._storages = (torch.storage.TypedStorage, torch.UntypedStorage) if torch else ()
        self._cupy = sys.modules.get("cupy")
        self._jax = sys.modules.get("jax")

    def persistent_id(self, obj: Any) -> tuple[Any, ...] | None:
        """The persistent id for an array or tensor storage, None for anything else."""
        np = self._np
        if np is not None and type(obj) is np.ndarray and not obj.dtype.hasobject and obj.dtype.itemsize:
            fortran = bool(obj.flags.f_contiguous and not obj.flags.c_contiguous)
            index = self._add(("numpy", id(obj)), obj, obj.nbytes, "cpu", _write_numpy)
            return ("numpy", index, obj.dtype, obj.shape, fortran)
        if self._storages and isinstance(obj, self._storages):
            typed = isinstance(obj, self._storages[0])
            untyped = obj._untyped_storage if typed else obj
            if untyped.device.type in ("cpu", "cuda"):
                device = str(untyped.device)
                index = self._add(("torch", untyped._cdata), untyped, untyped.nbytes(), device, _write_torch)
                return ("torch", index, obj.dtype if typed else None, device)
        if self._cupy is not None and isinstance(obj, self._cupy.ndarray):
            device = f"cuda:{obj.device.id}"
            index = self._add(("cupy", id(obj)), obj, obj.nbytes, device, _write_cupy)
            return ("cupy", index, obj.dtype, obj.shape, device)
        if self._jax is not None and isinstance(obj, self._jax.Array):
            device = str(next(iter(obj.devices())))
            index = self._add(("jax", id(obj)), obj, obj.nbytes, device, _write_jax)
            return ("jax", index, obj.dtype, obj.shape, device)
        return None

    def device_bytes(self, indices: Iterable[int]) -> dict[str, int]:
        """Bytes per device over the given blobs."""
        totals: dict[str, int] = {}
        for i in indices:
            totals[self.sources[i].device] = totals.get(self.sources[i].device, 0) + self.sources[i].nbytes
        return totals

    def write(self, f: BinaryIO, used: Iterable[int]) -> list[list[Any] | None]:
        """Write the used blobs back to back; return ``[offset, nbytes, kind, device]`` per index
        (None: unused)."""
        table: list[list[Any] | None] = [None] * len(self.sources)
        for index in sorted(used):
            source = self.sources[index]
            offset = f.tell()
            source.write(source.obj, f, self._staging)
            if f.tell() - offset != source.nbytes:
                raise RuntimeError(f"wrote {f.tell() - offset} bytes for an array of {source.nbytes}")
            table[index] = [offset, source.nbytes, source.kind, source.device]
        return table

    def _add(self, key: Any, obj: Any, nbytes: int, device: str,
             write: Callable[[Any, BinaryIO, _Staging], None]) -> int:
        index = self._index.get(key)
        if index is None:
            index = self._index[key] = len(self.sources)
            self.sources.append(_Source(obj, int(nbytes), key[0], device, write))
        return index


class BlobReader:
    """Turns persistent ids back into arrays, each read once even if referred to many times, from
    the data file at ``path``. A context manager: closing it stops the reads ahead."""

    def __init__(self, path: Path, table: list[list[Any] | None], devices: DeviceMap) -> None:
        self._table = table
        self.devices = devices
        self._loaded: dict[int, Any] = {}
        self._staging = _Staging()
        self._f = open(path, "rb")
        try:
            self._readahead = self._read_ahead(path)
        except BaseException:
            self._f.close()
            raise

    def __enter__(self) -> BlobReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._readahead is not None:
            self._readahead.close()
        discard_prepared()
        self._f.close()

    def timings(self) -> dict[str, float]:
        """How the reads ahead went: bytes, seconds to allocate the storages (creating CUDA contexts
        in a fresh kernel), until the last byte was in, and that the unpickler waited for bytes."""
        ahead = self._readahead
        if ahead is None:
            return {}
        return {"storage_bytes": ahead.nbytes, "storage_setup_s": ahead.setup_s,
                "storage_in_s": ahead.done_s if ahead.done_s is not None else -1.0, "storage_wait_s": ahead.waited}

    def _read_ahead(self, path: Path) -> Readahead | None:
        """Start reading the snapshot's PyTorch storages ahead; None where there are none (or
        their table predates this), or where PyTorch cannot give them memory: then each is read
        when the unpickler asks, and what cannot be loaded is reported as before."""
        if not any(entry is not None and len(entry) >= 4 and entry[2] == "torch" for entry in self._table):
            return None
        try:
            import torch
        except ImportError:  # the unpickler reports the variables that need it
            return None
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        storages = torch_storages(self._table, self.devices, count)
        try:
            return Readahead(torch, path, storages)
        except (RuntimeError, OSError):  # out of GPU memory, a GPU that fails: loaded one by one
            return None

    def load(self, pid: tuple[Any, ...]) -> Any:
        kind, index, *rest = pid
        if index not in self._loaded:
            self._loaded[index] = getattr(self, f"_load_{kind}")(index, *rest)
        return self._loaded[index]

    def _seek(self, index: int) -> int:
        """Position the data file at blob ``index``; return its size."""
        entry = self._table[index]
        if entry is None:
            raise ValueError(f"data.bin has no array #{index}")
        self._f.seek(entry[0])
        return entry[1]

    def _load_numpy(self, index: int, dtype: Any, shape: tuple[int, ...], fortran: bool) -> Any:
        import numpy as np

        array = np.empty(shape, dtype, order="F" if fortran else "C")
        raw = _raw_bytes(array)
        if self._seek(index) != raw.size:
            raise ValueError(f"array #{index} in data.bin does not match its {dtype} {shape}")
        readinto_exactly(self._f, raw.data)
        return array

    def _load_torch(self, index: int, dtype: Any, saved_device: str) -> Any:
        import torch

        if self._readahead is not None and index in self._readahead:
            flat = self._readahead.take(index)
        else:
            flat = self._read_torch(index, saved_device)
        untyped = flat.untyped_storage()
        if dtype is None:
            return untyped
        return torch.storage.TypedStorage(wrap_storage=untyped, dtype=dtype, _internal=True)

    def _read_torch(self, index: int, saved_device: str) -> Any:
        """A storage read when the unpickler asks (a snapshot whose table predates read ahead)."""
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        device = self.devices.resolve(saved_device, count)
        nbytes = self._seek(index)
        flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
        if flat.is_cuda:
            stage = self._staging.buffer(torch)
            for start in range(0, nbytes, CHUNK):
                size = min(CHUNK, nbytes - start)
                readinto_exactly(self._f, stage[:size].numpy().data)
                flat[start:start + size].copy_(stage[:size])
        else:
            readinto_exactly(self._f, flat.numpy().data)
        return flat

    def _load_cupy(self, index: int, dtype: Any, shape: tuple[int, ...], saved_device: str) -> Any:
        host = self._load_numpy(index, dtype, shape, False)
        try:
            import cupy
        except ImportError:
            self.devices.warn("CuPy is not installed: CuPy arrays were loaded as NumPy arrays")
            return host
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception:  # no driver or no device: CuPy raises its own runtime error
            count = 0
        device = self.devices.resolve(saved_device, count)
        if device == "cpu":
            self.devices.warn("CuPy arrays were loaded as NumPy arrays (no GPU)")
            return host
        with cupy.cuda.Device(int(device.partition(":")[2])):
            return cupy.asarray(host)

    def _load_jax(self, index: int, dtype: Any, shape: tuple[int, ...], saved_device: str) -> Any:
        host = self._load_numpy(index, dtype, shape, False)
        try:
            import jax
        except ImportError:
            self.devices.warn("JAX is not installed: JAX arrays were loaded as NumPy arrays")
            return host
        return jax.device_put(host)  # JAX's default device; JAX places computations itself

def _raw_bytes(array: Any) -> Any:
    """A flat uint8 view of a C- or Fortran-contiguous NumPy array, in memory order."""
    import numpy as np

    return (array if array.flags.c_contiguous else array.T).reshape(-1).view(np.uint8)


def _write_numpy(array: Any, f: BinaryIO, _staging: _Staging) -> None:
    if not (array.flags.c_contiguous or array.flags.f_contiguous):
        array = array.copy(order="C")
    f.write(_raw_bytes(array).data)


def _write_torch(untyped: Any, f: BinaryIO, staging: _Staging) -> None:
    torch = sys.modules["torch"]
    flat = torch.empty(0, dtype=torch.uint8, device=untyped.device).set_(untyped)
    if not flat.is_cuda:
        f.write(flat.numpy().data)
        return
    stage = staging.buffer(torch)
    for start in range(0, flat.numel(), CHUNK):
        size = min(CHUNK, flat.numel() - start)
        stage[:size].copy_(flat[start:start + size])
        f.write(stage[:size].numpy().data)


def _write_cupy(array: Any, f: BinaryIO, staging: _Staging) -> None:
    _write_numpy(sys.modules["cupy"].ascontiguousarray(array).get(), f, staging)


def _write_jax(array: Any, f: BinaryIO, staging: _Staging) -> None:
    import numpy as np

    _write_numpy(np.ascontiguousarray(array), f, staging)

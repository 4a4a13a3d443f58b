"""The cuda engine: GPU memory out of and back into a process through the driver's
checkpoint API (r570+, remapping r580+), driven from outside the process.

Flow: lock -> checkpoint (GPU memory moves to host memory, the GPU is free)
-> CRIU dump ... CRIU restore -> restore with a map covering every GPU -> unlock.
"""
from __future__ import annotations

import ctypes
from typing import Any

from ..errors import EngineError, PreconditionError

try:
    from cuda.bindings import driver as _driver
except ImportError:
    _driver = None

_REQUIRED = ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore",
             "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState", "CUcheckpointRestoreArgs")
_initialised = False


def unavailable_reason() -> str | None:
    """None when the driver checkpoint API can be used, else why not and how to fix it."""
    global _initialised
    if _driver is None:
        return "cuda-bindings is not installed (pip install 'jupyter-gpucr[cuda]')."
    missing = [n for n in _REQUIRED if not hasattr(_driver, n)]
    if missing:
        return f"cuda-bindings lacks {', '.join(missing)}; install cuda-bindings 13.0.2+ (not 13.3.0)."
    if not _initialised:
        (err,) = _driver.cuInit(0)
        if err != _driver.CUresult.CUDA_SUCCESS:
            return f"The CUDA driver did not initialise ({_err_name(err)}): no NVIDIA GPU or driver here."
        _initialised = True
    err, version = _driver.cuDriverGetVersion()
    if version < 12080:
        return f"The NVIDIA driver supports CUDA {version // 1000}.{version % 1000 // 10}; the checkpoint API needs r570+ (CUDA 12.8)."
    return None


def _err_name(err: Any) -> str:
    try:
        return _driver.cuGetErrorName(err)[1].decode()
    except Exception:
        return str(err)


def _call(what: str, pid: int, fn: Any, *args: Any) -> Any:
    result = fn(pid, *args)
    err = result[0]
    if err != _driver.CUresult.CUDA_SUCCESS:
        raise EngineError(f"CUDA driver {what} of process {pid} failed: {_err_name(err)}.", _HINTS.get(_err_name(err), ""))
    return result[1] if len(result) > 1 else None


_HINTS = {
    "CUDA_ERROR_INVALID_VALUE": "The GPU map must name every GPU of the machine, each once.",
    "CUDA_ERROR_TIMEOUT": "The process kept the GPU busy past the lock timeout; retry when it is idle.",
    "CUDA_ERROR_NOT_SUPPORTED": "This process uses a feature the driver cannot checkpoint (UVM, IPC memory, MPS, MIG).",
}


def _require() -> None:
    reason = unavailable_reason()
    if reason:
        raise PreconditionError("The CUDA checkpoint API is not available.", reason)


def state(pid: int) -> str | None:
    """'running', 'locked', 'checkpointed', 'failed', or None for a process without CUDA."""
    if unavailable_reason():
        return None
    err, st = _driver.cuCheckpointProcessGetState(pid)
    if err != _driver.CUresult.CUDA_SUCCESS:
        return None
    names = {_driver.CUprocessState.CU_PROCESS_STATE_RUNNING: "running",
             _driver.CUprocessState.CU_PROCESS_STATE_LOCKED: "locked",
             _driver.CUprocessState.CU_PROCESS_STATE_CHECKPOINTED: "checkpointed",
             _driver.CUprocessState.CU_PROCESS_STATE_FAILED: "failed"}
    return names.get(st, str(st))


def uses_cuda(pid: int) -> bool:
    """Cheap pre-filter (libcuda mapped), confirmed by the driver."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            if "libcuda.so" not in f.read():
                return False
    except OSError:
        return False
    return state(pid) is not None


def lock(pid: int, timeout_ms: int) -> None:
    _require()
    args = _driver.CUcheckpointLockArgs()
    args.timeoutMs = timeout_ms
    _call("lock", pid, _driver.cuCheckpointProcessLock, args)


def checkpoint(pid: int) -> None:
    _call("checkpoint", pid, _driver.cuCheckpointProcessCheckpoint, None)


def _uuid(text: str, keep: list[Any]) -> Any:
    raw = bytes.fromhex(text.removeprefix("GPU-").replace("-", ""))
    buf = ctypes.create_string_buffer(raw, 16)
    keep.append(buf)
    return _driver.CUuuid(ctypes.addressof(buf))


def restore(pid: int, gpu_map: dict[str, str] | None = None) -> None:
    """Bring GPU memory back; ``gpu_map`` (old UUID -> new UUID) must cover every GPU."""
    _require()
    args = None
    if gpu_map:
        keep: list[Any] = []
        pairs = []
        for old, new in gpu_map.items():
            pair = _driver.CUcheckpointGpuPair()
            pair.oldUuid = _uuid(old, keep)
            pair.newUuid = _uuid(new, keep)
            pairs.append(pair)
        args = _driver.CUcheckpointRestoreArgs()
        args.gpuPairs = pairs
        args.gpuPairsCount = len(pairs)
    _call("restore", pid, _driver.cuCheckpointProcessRestore, args)


def unlock(pid: int) -> None:
    _call("unlock", pid, _driver.cuCheckpointProcessUnlock, None)


def put_back(pids: list[int], gpu_map: dict[str, str] | None = None) -> list[str]:
    """Undo lock/checkpoint on ``pids`` (after a failed suspend, or for recovery after a killed
    suspend or restore: then ``gpu_map`` is the placement the restore had chosen); processes
    without CUDA or already running are left alone. Return what could not be undone."""
    problems = []
    for pid in pids:
        try:
            st = state(pid)
            if st == "checkpointed":
                restore(pid, gpu_map)
                st = "locked"
            if st == "locked":
                unlock(pid)
        except Exception as e:  # keep going: every other process must still be put back
            problems.append(str(e))
    return problems

"""GPU discovery (NVML) and placement: which GPU a process is on, which GPU it can go to."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from ..errors import IncompatibleCheckpointError, PreconditionError

try:
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency; tolerate broken installs for doctor's sake
    pynvml = None


@dataclass
class Gpu:
    index: int
    uuid: str
    name: str
    memory_total: int
    memory_used: int
    memory_free: int
    processes: dict[int, int] = field(default_factory=dict)  # host pid -> bytes used

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["processes"] = {str(k): v for k, v in self.processes.items()}
        return d


_initialised: bool | None = None


def nvml_ready() -> bool:
    """Initialise NVML once; False on machines without an NVIDIA driver."""
    global _initialised
    if _initialised is None:
        try:
            pynvml.nvmlInit()
            _initialised = True
        except Exception:
            _initialised = False
    return _initialised


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def driver_version() -> str | None:
    return _text(pynvml.nvmlSystemGetDriverVersion()) if nvml_ready() else None


def cuda_driver_version() -> int | None:
    return int(pynvml.nvmlSystemGetCudaDriverVersion_v2()) if nvml_ready() else None


def list_gpus() -> list[Gpu]:
    if not nvml_ready():
        return []
    gpus = []
    for i in range(pynvml.nvmlDeviceGetCount()):
        h = pynvml.nvmlDeviceGetHandleByIndex(i)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h)
        procs = {}
        try:
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                procs[int(p.pid)] = int(p.usedGpuMemory or 0)
        except pynvml.NVMLError:
            pass
        gpus.append(Gpu(i, _text(pynvml.nvmlDeviceGetUUID(h)), _text(pynvml.nvmlDeviceGetName(h)),
                        int(mem.total), int(mem.used), int(mem.free), procs))
    return gpus


class GpuUse(TypedDict):
    """A GPU a process tree has memory on, and how much."""

    index: int
    uuid: str
    name: str
    memory_used: int


def gpus_of(pids: list[int], gpus: list[Gpu] | None = None) -> list[GpuUse]:
    """The GPUs any of ``pids`` has memory on, with how much."""
    used: list[GpuUse] = []
    for gpu in list_gpus() if gpus is None else gpus:
        mem = sum(b for p, b in gpu.processes.items() if p in pids)
        if any(p in pids for p in gpu.processes):
            used.append({"index": gpu.index, "uuid": gpu.uuid, "name": gpu.name, "memory_used": mem})
    return used


def parse_gpu_spec(spec: str | int | None, gpus: list[Gpu]) -> Gpu | None:
    """Resolve ``auto``/None (None returned), an index or a UUID (prefix) to a GPU."""
    if spec is None or spec == "auto":
        return None
    text = str(spec)
    if text.isdigit():
        match = [g for g in gpus if g.index == int(text)]
    else:
        match = [g for g in gpus if g.uuid == text or g.uuid.startswith(text)]
    if len(match) != 1:
        known = ", ".join(f"{g.index} ({g.uuid})" for g in gpus) or "none"
        raise PreconditionError(f"No GPU matches {text!r}.", f"GPUs on this machine: {known}. Use an index, a UUID or 'auto'.")
    return match[0]


def plan_placement(used: list[dict[str, Any]], all_old: list[str], spec: str | int | None,
                   gpus: list[Gpu], margin: int = 256 << 20) -> dict[str, str]:
    """Map every GPU UUID of the checkpoint's machine to a GPU here.

    The driver needs a map covering every GPU of the machine (one naming only the moved GPU fails
    with CUDA_ERROR_INVALID_VALUE): the GPUs the process used go to the chosen targets, the rest
    fill the remaining GPUs in order.
    """
    if not used:
        return {}
    if not gpus:
        raise PreconditionError("The checkpoint holds GPU memory but this machine has no usable NVIDIA GPU.",
                                "Restore on a machine with a GPU of the same model, or use the snapshot engine.")
    model = used[0]["name"]
    wanted = parse_gpu_spec(spec, gpus)
    if wanted is not None and len(used) > 1:
        raise PreconditionError("The process used several GPUs; a single target GPU cannot hold it.", "Use --gpu auto.")
    targets: list[Gpu] = []
    for u in used:
        need = int(u["memory_used"]) + margin
        if wanted is not None:
            cands = [wanted]
        else:
            cands = sorted((g for g in gpus if g not in targets),
                           key=lambda g: (g.uuid != u["uuid"], -g.memory_free))
        fit = [g for g in cands if g.name == u["name"] and g.memory_free >= need and g not in targets]
        if not fit:
            detail = ", ".join(f"GPU {g.index} {g.name}: {g.memory_free >> 20} MiB free" for g in cands)
            if all(g.name != model for g in cands):
                raise IncompatibleCheckpointError(
                    f"The checkpoint was made on {model}; no such GPU is available here ({detail}).",
                    "Restore on a machine with that GPU model, or suspend with the snapshot engine.")
            raise PreconditionError(
                f"No {model} has the {need >> 20} MiB free this process needs ({detail}).",
                "Free GPU memory, pick another GPU with --gpu, or retry later.")
        targets.append(fit[0])
    mapping = {u["uuid"]: t.uuid for u, t in zip(used, targets)}
    rest_old = [u for u in all_old if u not in mapping]
    rest_new = [g.uuid for g in gpus if g.uuid not in mapping.values()]
    mapping.update(zip(rest_old, rest_new))
    return mapping

"""Whether a bench_room run fits the machine, worked out before any kernel starts.

Room is made where the kernels' memory is counted (GPU 0, or the host memory budget with
``--host``): ``resident`` kernels fit there at once, the others are suspended. The store holds, at
its fullest, every kernel's newest image (gpucr keeps it after a restore: ``c.GPUCR.keep_last``),
one more being written, and the tensors moved out beside the images of the suspended kernels,
plus those of the kernel whose restore waits while a victim is suspended for it. A store in memory
(tmpfs) adds all that to what the resident kernels hold in host memory. Each check keeps a tenth
to spare: the per-kernel figures are estimates until the run measures them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

GiB = 1 << 30
IN_MEMORY = {"tmpfs", "ramfs"}
SPARE = 0.10  # of the store's free space, and of the host's memory, left unplanned


@dataclass(frozen=True)
class KernelSize:
    """One kernel's bytes, as the plan counts them."""

    declared: int  # where room is made: c.GPUCR.kernel_gpu_memory (kernel_memory with --host)
    moved_out: int  # written beside its image by a suspend: its GPU tensors
    image: int  # its image: the host memory it dumps and what the driver's checkpoint copies
    host_rss: int  # host memory it holds while it runs


@dataclass(frozen=True)
class Machine:
    """Where room is made and where the suspended kernels go, as measured now."""

    where: str  # "GPU 0 (NVIDIA H200)", "the host memory budget"
    total: int  # the GPU's memory, or the budget: what the kernels' sum is compared with
    room: int  # free there for kernels now
    margin: int  # kept free beside each kernel (room.GPU_MARGIN on a GPU)
    store: str
    store_medium: str
    store_free: int
    store_in_memory: bool
    ram_total: int
    ram_available: int


@dataclass(frozen=True)
class Plan:
    kernels: int
    size: KernelSize
    machine: Machine
    overhead: int  # host memory of the server, CRIU and the staging buffers of a suspend and a restore

    @property
    def resident(self) -> int:
        return min(self.kernels, self.machine.room // (self.size.declared + self.machine.margin))

    @property
    def ratio(self) -> float:
        return self.kernels * self.size.declared / self.machine.total

    @property
    def suspended_at_most(self) -> int:
        """Suspended kernels at the fullest moment: a victim written while the kernel it makes room
        for is still suspended."""
        return 0 if self.kernels <= self.resident else self.kernels - self.resident + 1

    @property
    def store_peak(self) -> int:
        if not self.suspended_at_most:
            return 0
        return (self.kernels + 1) * self.size.image + self.suspended_at_most * self.size.moved_out

    @property
    def host_peak(self) -> int:
        return (self.store_peak if self.machine.store_in_memory else 0) + self.resident * self.size.host_rss + self.overhead

    def problems(self) -> list[str]:
        """Why the run would not fit; empty: it fits."""
        m, out = self.machine, []
        if self.store_peak > m.store_free * (1 - SPARE):
            out.append(f"the store ({m.store} on {m.store_medium}) has {_g(m.store_free)} free and the suspended kernels "
                       f"need {_g(self.store_peak)} at the fullest ({SPARE:.0%} of it kept to spare)")
        if self.host_peak > m.ram_available - SPARE * m.ram_total:
            out.append(f"host memory: {_g(m.ram_available)} available, the run needs {_g(self.host_peak)} and "
                       f"{_g(SPARE * m.ram_total)} is kept free")
        return out

    def lines(self) -> list[str]:
        """The arithmetic, as printed before the run."""
        m, s = self.machine, self.size
        per = f"({_g(s.declared)} + {_g(m.margin)} kept beside each)" if m.margin else f"({_g(s.declared)} each)"
        out = [f"{self.kernels} kernels x {_g(s.declared)} declared on {m.where} of {_g(m.total)} = "
               f"{_g(self.kernels * s.declared)}: {self.ratio:.2f}x its memory",
               f"{self.resident} fit at once in the {_g(m.room)} free {per}; {self.suspended_at_most} suspended at the fullest"]
        if self.suspended_at_most:
            tensors = f" + {self.suspended_at_most} x {_g(s.moved_out)} moved out" if s.moved_out else ""
            out.append(f"store {m.store} on {m.store_medium}: {self.kernels + 1} images x {_g(s.image)}{tensors} = "
                       f"{_g(self.store_peak)} at the fullest; {_g(m.store_free)} free")
        store = f"the store {_g(self.store_peak)} (in memory) + " if m.store_in_memory else ""
        out.append(f"host memory: {store}{self.resident} running kernels x {_g(s.host_rss)} + {_g(self.overhead)} "
                   f"(server, CRIU, staging) = {_g(self.host_peak)}; {_g(m.ram_available)} available of {_g(m.ram_total)}")
        return out

    def as_dict(self) -> dict:
        return {**asdict(self), "resident": self.resident, "ratio": self.ratio, "suspended_at_most": self.suspended_at_most,
                "store_peak": self.store_peak, "host_peak": self.host_peak, "problems": self.problems()}


def store_medium(path: Path) -> tuple[str, bool]:
    """The file system and device the store is on, as a person reads it, and whether it is memory."""
    path.mkdir(parents=True, exist_ok=True)
    resolved = str(path.resolve())
    best = max((p for p in psutil.disk_partitions(all=True)
                if resolved == p.mountpoint or resolved.startswith(p.mountpoint.rstrip("/") + "/")),
               key=lambda p: len(p.mountpoint), default=None)
    if best is None:
        return "unknown", False
    return f"{best.fstype} ({best.device} at {best.mountpoint})", best.fstype in IN_MEMORY


def _g(n: float) -> str:
    return f"{n / GiB:.2f} GiB"

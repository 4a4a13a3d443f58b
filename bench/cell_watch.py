"""What the machine's CPUs and GPU 0 did while a cell ran. The W2 cell's main thread is on a CPU
all the time (launching kernels, or spinning while it waits for the GPU), so a cell that runs
slower after a restore either got less CPU (other processes, the hypervisor's steal time, being
preempted), or waited for a GPU that was busy or clocked down (its utilization and SM clock), or
did the same work slower on the CPU. ``CellWatch`` samples every 100 ms; ``window`` sums a span.
The watched process is looked up at every sample (a restored kernel has a new PID).
"""
from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil

from jupyter_gpucr.core.gpu import gpus

PERIOD = 0.1
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class _Sample:
    at: float  # time.time(): the kernel's reply dates are on the same clock
    system: Any  # psutil.cpu_times()
    pid: int | None  # the watched process then
    main_cpu: float  # the watched thread's user + system seconds
    main_preempted: int  # its involuntary context switches
    main_faults: tuple[int, int]  # its minor and major page faults
    gpu: tuple[int, int] | None  # GPU 0's utilization (%) and SM clock (MHz), where NVML answers
    procs: dict[int, tuple[str, float]] = field(default_factory=dict)  # pid: (name, CPU seconds)


class CellWatch:
    """Samples the whole machine, GPU 0 and one thread (the main thread of the process
    ``find_pid`` names) until ``stop``."""

    def __init__(self, find_pid: Callable[[], int | None]) -> None:
        self.find_pid = find_pid
        self.pid: int | None = None
        self.samples: list[_Sample] = []
        self._stop = threading.Event()
        self._gpu = gpus.pynvml.nvmlDeviceGetHandleByIndex(0) if gpus.nvml_ready() and gpus.list_gpus() else None
        self._thread = threading.Thread(target=self._run, name="cell-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self._sample())
            self._stop.wait(PERIOD)

    def _sample(self) -> _Sample:
        procs = {}
        for p in psutil.process_iter(["name", "cpu_times"]):
            times = p.info["cpu_times"]
            if times is not None:
                procs[p.pid] = (p.info["name"], times.user + times.system)
        try:
            self.pid = self.find_pid()
        except psutil.Error:  # its tree changed while it was walked (a suspend, a restore)
            self.pid = None
        cpu, preempted, faults = 0.0, 0, (0, 0)
        try:
            with open(f"/proc/{self.pid}/task/{self.pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            cpu = (int(fields[11]) + int(fields[12])) / _TICKS  # utime, stime
            faults = (int(fields[7]), int(fields[9]))  # minflt, majflt
            with open(f"/proc/{self.pid}/task/{self.pid}/status") as f:
                preempted = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))
        except (OSError, StopIteration, IndexError, ValueError):
            pass
        return _Sample(time.time(), psutil.cpu_times(), self.pid, cpu, preempted, faults, self._gpu_now(), procs)

    def _gpu_now(self) -> tuple[int, int] | None:
        if self._gpu is None:
            return None
        nvml = gpus.pynvml
        try:
            return (nvml.nvmlDeviceGetUtilizationRates(self._gpu).gpu,
                    nvml.nvmlDeviceGetClockInfo(self._gpu, nvml.NVML_CLOCK_SM))
        except nvml.NVMLError:
            return None

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def window(self, start: float, end: float) -> dict | None:
        """The span from the last sample before ``start`` to the first after ``end``: wall seconds,
        the watched thread's CPU seconds, preemptions and page faults, the machine's busy cores outside that
        thread, its steal and iowait seconds, the three processes that used the most CPU, and
        GPU 0's mean utilization and lowest and mean SM clock.
        A process restored just before ``start`` may be seen only some samples later: then the
        span starts there (``late_s`` after ``start``). None if no sample of one process covers it."""
        deadline = time.monotonic() + 5 * PERIOD
        while self.samples[-1].at < end and time.monotonic() < deadline:  # the sample after it is due
            time.sleep(PERIOD / 5)
        b = next((s for s in self.samples if s.at >= end), None)
        same = [s for s in self.samples if b is not None and b.pid is not None and s.pid == b.pid and s.at < end]
        a = next((s for s in reversed(same) if s.at <= start), None) or (same[0] if same else None)
        if a is None or b is None:
            return None
        wall = b.at - a.at
        busy = sum(getattr(b.system, k) - getattr(a.system, k) for k in ("user", "system", "nice", "irq", "softirq"))
        main = b.main_cpu - a.main_cpu
        used = sorted(((cpu - a.procs.get(pid, (name, cpu))[1], name, pid) for pid, (name, cpu) in b.procs.items()),
                      reverse=True)
        return {"wall_s": round(wall, 3), "late_s": round(max(0.0, a.at - start), 3), "main_thread_cpu_s": round(main, 3),
                "main_thread_preempted": b.main_preempted - a.main_preempted,
                "main_thread_faults": (b.main_faults[0] - a.main_faults[0], b.main_faults[1] - a.main_faults[1]),
                "other_busy_cores": round((busy - main) / wall, 2) if wall > 0 else None,
                "steal_s": round(b.system.steal - a.system.steal, 3),
                "iowait_s": round(b.system.iowait - a.system.iowait, 3),
                "top": [(name, pid, round(cpu, 2)) for cpu, name, pid in used[:3]], **_gpu_summary(self.samples, a, b)}


def _gpu_summary(samples: list[_Sample], a: _Sample, b: _Sample) -> dict[str, float]:
    seen = [s.gpu for s in samples if a.at < s.at <= b.at and s.gpu is not None]
    if not seen:
        return {}
    return {"gpu_util_pct": round(sum(u for u, _ in seen) / len(seen)),
            "sm_mhz_min": min(c for _, c in seen), "sm_mhz_mean": round(sum(c for _, c in seen) / len(seen))}


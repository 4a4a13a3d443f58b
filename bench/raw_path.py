"""The raw driver + CRIU path every gpucr figure is compared with: driver lock
and checkpoint, ``criu dump``; ``criu restore -d``, driver restore and unlock. Nothing else."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr.core.criu import commands as criu_engine  # noqa: E402
from jupyter_gpucr.core.gpu import cuda  # noqa: E402

OPTS = ["--shell-job", "--tcp-established", "--network-lock", "nftables"]


def checkpoint(proc: subprocess.Popen, images: Path, gpu: bool) -> tuple[float | None, float]:
    """Checkpoint the process into ``images`` (it is gone afterwards): (GPU free after, total) seconds."""
    criu = criu_engine.find_criu()
    t0 = time.perf_counter()
    gpu_free = None
    if gpu:
        cuda.lock(proc.pid, 10_000)
        cuda.checkpoint(proc.pid)
        gpu_free = time.perf_counter() - t0
    subprocess.run([criu, "dump", "-t", str(proc.pid), "-D", str(images), *OPTS], check=True)
    total = time.perf_counter() - t0
    proc.wait()
    return gpu_free, total


def restore(pid: int, images: Path, gpu: bool) -> None:
    """Bring the process back under its old PID, GPU state included."""
    subprocess.run([criu_engine.find_criu(), "restore", "-D", str(images), "-d", *OPTS], check=True)
    if gpu:
        cuda.restore(pid)
        cuda.unlock(pid)

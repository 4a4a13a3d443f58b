"""What the host memory of the W2 process is made of (what CRIU writes into the image), after
gpucr's offload of its GPU tensors and after the driver's checkpoint of the rest.

    python3 bench/bench_image_parts.py        (on the GPU machine; kernel_hooks on PYTHONPATH)

Runs the W2 state (bench/w2_workload.py) in a child process, offloads its tensors as a suspend
does, then prints the child's anonymous memory by mapping (from /proc/PID/smaps) and its largest
regions; then locks and checkpoints the child through the driver, prints the same again, and
puts the GPU state back.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from w2_workload import GPU_CELL, GPU_SETUP  # noqa: E402

from jupyter_gpucr.core.gpu import cuda  # noqa: E402

OFFLOAD = "/dev/shm/gpucr-image-parts"
CHILD = "import json\n" + GPU_SETUP + GPU_CELL + f"""
import sys, gc, gpucr_hooks.offload as off
gc.collect()
print("offload", json.dumps(off.offload_tensors({OFFLOAD!r})), flush=True)
sys.stdin.readline()
"""
MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def regions(pid: int) -> list[tuple[str, str, int]]:
    """(address range, mapped file or '', anonymous bytes) of each mapping of ``pid``."""
    found: list[list] = []
    for line in open(f"/proc/{pid}/smaps"):
        if MAPPING.match(line):
            fields = line.split()
            found.append([fields[0], fields[5] if len(fields) > 5 else "", 0])
        elif line.startswith("Anonymous:"):
            found[-1][2] += int(line.split()[1]) << 10
    return [(r[0], r[1], r[2]) for r in found]


def report(title: str, pid: int) -> None:
    rs = regions(pid)
    by_file: dict[str, int] = {}
    for _, path, anon in rs:
        key = Path(path).name if path.startswith("/") else (path or "[anon]")
        by_file[key] = by_file.get(key, 0) + anon
    print(f"{title}: {sum(a for *_, a in rs) >> 20} MiB anonymous in {len(rs)} mappings")
    print("  by mapping: " + ", ".join(f"{k} {v >> 20}" for k, v in sorted(by_file.items(), key=lambda kv: -kv[1])[:8]))
    print("  largest regions (MiB): " + ", ".join(f"{r} {p or '-'} {a >> 20}" for r, p, a in sorted(rs, key=lambda r: -r[2])[:8]))


def main() -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin and child.stdout
    try:
        while not (line := child.stdout.readline()).startswith("offload"):
            if not line:
                sys.exit("the W2 process died")
        print(line.strip())
        report("after the offload", child.pid)
        cuda.unavailable_reason()
        t0 = time.perf_counter()
        cuda.lock(child.pid, 10_000)
        cuda.checkpoint(child.pid)
        print(f"driver checkpoint {time.perf_counter() - t0:.2f} s")
        report("after the driver's checkpoint", child.pid)
        cuda.restore(child.pid)
        cuda.unlock(child.pid)
        child.stdin.write("\n")
        child.stdin.flush()
        child.wait(60)
    finally:
        child.kill()
        shutil.rmtree(OFFLOAD, ignore_errors=True)


if __name__ == "__main__":
    main()

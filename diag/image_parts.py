"""One-off: what the W2 process's host memory (the CRIU image) is made of, after the offload and
after the driver's checkpoint. Not part of the product."""
import json, os, subprocess, sys, time, re
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from w2_workload import GPU_SETUP, GPU_CELL

CHILD = GPU_SETUP + GPU_CELL + """
import sys, gpucr_hooks.offload as off, gc
gc.collect()
print("offload", json.dumps(off.offload_tensors("/dev/shm/diag-offload")), flush=True)
sys.stdin.readline()
"""

def smaps(pid):
    parts = {}
    cur = None
    for line in open(f"/proc/{pid}/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            f = line.split()
            cur = f[5] if len(f) > 5 else "[anon]"
            cur = re.sub(r"/.*/", "", cur)
            parts.setdefault(cur, [0, 0])
        elif line.startswith("Anonymous:"):
            parts[cur][0] += int(line.split()[1]) << 10
        elif line.startswith("Private_Dirty:") or line.startswith("Shared_Dirty:"):
            parts[cur][1] += int(line.split()[1]) << 10
    tot = sum(a for a, _ in parts.values())
    top = sorted(parts.items(), key=lambda kv: -max(kv[1]))[:18]
    return tot, [(k, a >> 20, d >> 20) for k, (a, d) in top]

def anon_regions(pid, n=12):
    regs = []
    cur = None
    for line in open(f"/proc/{pid}/smaps"):
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            f = line.split(); cur = [f[0], f[1], f[5] if len(f) > 5 else "", 0]
            regs.append(cur)
        elif line.startswith("Anonymous:"):
            cur[3] = int(line.split()[1]) << 10
    regs.sort(key=lambda r: -r[3])
    return [(r[0], r[1], r[2], r[3] >> 20) for r in regs[:n]], len(regs)

import json
p = subprocess.Popen([sys.executable, "-c", "import json\n" + CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
line = ""
while not line.startswith("offload"):
    line = p.stdout.readline()
    print("child:", line.strip()[:300], flush=True)
    if not line: sys.exit("child died")
print("after offload", smaps(p.pid)); print(anon_regions(p.pid))
from jupyter_gpucr.core import cuda
cuda.unavailable_reason()
t = time.perf_counter(); cuda.lock(p.pid, 10000); cuda.checkpoint(p.pid); print("driver checkpoint", time.perf_counter() - t)
print("after driver checkpoint", smaps(p.pid)); print(anon_regions(p.pid))
cuda.restore(p.pid); cuda.unlock(p.pid)
p.stdin.write("\n"); p.stdin.flush(); p.wait()
subprocess.run(["rm", "-rf", "/dev/shm/diag-offload"])

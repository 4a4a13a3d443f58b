"""The CUDA driver's share of "GPU free": how long its lock + checkpoint takes for a process that
holds only its context (after PyTorch ran bf16 matrix products and emptied its cache, with the
thread-stack reservation given back as a suspend does), and with some live tensors beside it.

Every tensor gpucr moves out still leaves the context, which only the driver's checkpoint can take
off the GPU, so the context-only figure is a floor under any suspend's "GPU free" on this driver.
Prints one line per round and a JSON summary. Needs a GPU, PyTorch and cuda-bindings:

    python3 bench/bench_driver_floor.py --gib 0 1 4 --rounds 3
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from jupyter_gpucr.core.gpu import cuda  # noqa: E402

HOLDER = """
import sys, time, torch
sys.path.insert(0, {hooks!r})
from gpucr_hooks import stacks
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(4):
    a = (a @ a).clamp_(-1, 1)  # loads cuBLAS and its workspace, as a notebook's model does
keep = torch.empty({nbytes}, dtype=torch.uint8, device="cuda").fill_(7) if {nbytes} else None
del a
torch.cuda.synchronize(); torch.cuda.empty_cache()
stacks.release(torch, {{0}})
print("used", torch.cuda.mem_get_info()[1] - torch.cuda.mem_get_info()[0], flush=True)
sys.stdin.read()  # until the parent closes it
print("intact", keep is None or bool((keep[::1 << 20] == 7).all()), flush=True)
"""


def one_round(gib: float) -> dict[str, float | bool]:
    """Start a holder, checkpoint it through the driver and put it back; the seconds of each step."""
    code = HOLDER.format(hooks=str(ROOT / "kernel_hooks"), nbytes=int(gib * (1 << 30)))
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        used = int(proc.stdout.readline().split()[1])
        t0 = time.perf_counter()
        cuda.lock(proc.pid, 10_000)
        t1 = time.perf_counter()
        cuda.checkpoint(proc.pid)
        t2 = time.perf_counter()
        cuda.restore(proc.pid)
        t3 = time.perf_counter()
        cuda.unlock(proc.pid)
        t4 = time.perf_counter()
        out, _ = proc.communicate("", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"gib": gib, "device_mib": round(used / (1 << 20)), "lock_s": round(t1 - t0, 3),
            "checkpoint_s": round(t2 - t1, 3), "restore_s": round(t3 - t2, 3), "unlock_s": round(t4 - t3, 3),
            "intact": "intact True" in out}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, nargs="+", default=[0.0, 1.0, 4.0], help="live tensors beside the context")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()
    if reason := cuda.unavailable_reason():
        sys.exit(f"needs the CUDA checkpoint API: {reason}")
    rounds = []
    for gib in args.gib:
        for _ in range(args.rounds):
            r = one_round(gib)
            print(json.dumps(r), flush=True)
            rounds.append(r)
    summary = {str(g): {k: statistics.median(r[k] for r in rounds if r["gib"] == g)
                        for k in ("device_mib", "lock_s", "checkpoint_s", "restore_s", "unlock_s")}
               for g in args.gib}
    summary["all_intact"] = all(r["intact"] for r in rounds)
    print(json.dumps({"median": summary}))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"rounds": rounds, "median": summary}, indent=1))


if __name__ == "__main__":
    main()

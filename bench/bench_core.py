"""Checkpoint/restore figures for a CPU process of N GB and a GPU process of N GB, through
gpucr and through the raw driver + CRIU path (the baseline gpucr must not be slower than).

    python bench/bench_core.py --cpu-gb 1 --gpu-gb 2 [--store DIR] [--json-out FILE]

Prints a table and the same figures as JSON. Needs root and CRIU; the GPU rows need a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr import Checkpointer  # noqa: E402
from jupyter_gpucr.core import (
    cuda,
    gpus,  # noqa: E402
)
from jupyter_gpucr.core.storage.store import dir_size  # noqa: E402
from tests.conftest import agent_command, ask, wait_for_line  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import raw_path  # noqa: E402


def gpucr_round(store: Path, kind: str, size_gb: float) -> dict:
    cr = Checkpointer(store)
    name = f"bench-{kind}"
    cmd = agent_command("cpu_agent.py", str(int(size_gb * 1024))) if kind == "cpu" else agent_command("gpu_agent.py", str(size_gb))
    os.environ["AGENT_FILE"] = str(store / f"{name}.counts")
    cr.run(name, cmd)
    hello = wait_for_line(cr.store.proc_dir(name) / "stdout.log", timeout=300)
    before = ask(hello["port"])
    t0 = time.perf_counter()
    ckpt = cr.checkpoint(name)
    wall_ckpt = time.perf_counter() - t0
    t0 = time.perf_counter()
    running = cr.restore(name)
    wall_restore = time.perf_counter() - t0
    ok = ask(hello["port"])["checksum"] == before["checksum"]
    t = ckpt.manifest["timings"]
    used = ckpt.manifest["gpu"]["used"]
    row = {"path": "gpucr", "kind": kind, "size_gb": size_gb, "gpu_mib": sum(u["memory_used"] for u in used) >> 20,
           "image_bytes": ckpt.size, "gpu_free_s": t.get("gpu_free"), "dump_s": t["dump"], "checksum_s": t["checksum"],
           "checkpoint_s": wall_ckpt, "restore_s": wall_restore, "criu_restore_s": running.timings["criu_restore"],
           "gpu_restore_s": running.timings.get("gpu_restore"), "verify_s": running.timings.get("verify_wait", 0.0), "state_ok": ok}
    cr.remove(name, kill=True)
    return row


def raw_round(store: Path, kind: str, size_gb: float) -> dict:
    """The same process through the bare driver API + CRIU commands (lock, checkpoint, dump; restore, driver restore, unlock)."""
    images = store / f"raw-{kind}"
    images.mkdir(parents=True, exist_ok=True)
    cmd = agent_command("cpu_agent.py", str(int(size_gb * 1024))) if kind == "cpu" else agent_command("gpu_agent.py", str(size_gb))
    log = store / f"raw-{kind}.out"
    os.environ["AGENT_FILE"] = str(store / f"raw-{kind}.counts")
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    hello = wait_for_line(log, timeout=300)
    before = ask(hello["port"])
    gpu_free, ckpt_s = raw_path.checkpoint(proc, images, kind == "gpu")
    t0 = time.perf_counter()
    raw_path.restore(proc.pid, images, kind == "gpu")
    restore_s = time.perf_counter() - t0
    ok = ask(hello["port"])["checksum"] == before["checksum"]
    size = dir_size(images)
    subprocess.run(["kill", "-9", str(proc.pid)], check=False)
    shutil.rmtree(images, ignore_errors=True)
    return {"path": "raw", "kind": kind, "size_gb": size_gb, "image_bytes": size, "gpu_free_s": gpu_free,
            "checkpoint_s": ckpt_s, "restore_s": restore_s, "state_ok": ok}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-gb", type=float, default=1.0)
    ap.add_argument("--gpu-gb", type=float, default=2.0)
    ap.add_argument("--store", default=None, help="store directory (default: a temporary one)")
    ap.add_argument("--json-out")
    ap.add_argument("--no-raw", action="store_true")
    args = ap.parse_args()
    store = Path(args.store or tempfile.mkdtemp(prefix="gpucr-bench-"))
    cuda.unavailable_reason()  # cuInit once, outside every timed round (a server does it at start)
    kinds = [("cpu", args.cpu_gb)] + ([("gpu", args.gpu_gb)] if gpus.list_gpus() and not cuda.unavailable_reason() else [])
    rows = []
    for kind, size in kinds:
        if size <= 0:
            continue
        rows.append(gpucr_round(store, kind, size))
        if not args.no_raw:
            rows.append(raw_round(store, kind, size))
    fmt = "{:6} {:4} {:>5} {:>9} {:>10} {:>10} {:>10} {:>10} {:>6}"
    print(fmt.format("path", "kind", "GB", "image MiB", "gpu free s", "ckpt s", "restore s", "gpu MiB", "ok"))
    for r in rows:
        print(fmt.format(r["path"], r["kind"], r["size_gb"], r["image_bytes"] >> 20,
                         f"{r['gpu_free_s']:.2f}" if r.get("gpu_free_s") is not None else "-",
                         f"{r['checkpoint_s']:.2f}", f"{r['restore_s']:.2f}", r.get("gpu_mib", "-"), r["state_ok"]))
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
              "cpus": os.cpu_count(), "store": str(store), "gpus": [g.name for g in gpus.list_gpus()],
              "driver": gpus.driver_version(), "rows": rows}
    print(json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

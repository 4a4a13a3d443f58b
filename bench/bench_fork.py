"""Fork of a kernel into 2 copies through the real server, against a single restore of the same kernel.

    python bench/bench_fork.py --cpu-gb 2 [--rounds 3] [--json-out FILE]
    python bench/bench_fork.py --gpu --model-gb 5.4 ...     # W2's Llama-architecture model (bf16, random weights)

A jupyter server with gpucr runs as a separate process; its kernel builds the state (``--cpu-gb`` of
NumPy; ``--gpu``: bench/w2_workload.py's W2 setup with as many layers as make ``--model-gb`` GB of
weights, its KV cache and its cached 4 GiB temporary on cuda:0). Each round, all from the page
cache (the checkpoint was just written):

- fork of the running kernel: ``POST /api/gpucr/kernels/{id}/fork`` with ``{"count": 2}`` (the
  source paused for its checkpoint, its GPU tensors moved out and back as in a suspend, then two
  restores side by side), then the cell in both copies at once: the time until both answered, and
  how long the source was paused;
- the same fork of the kernel suspended (its checkpoint restored twice; the dump is not part of it);
- a single restore: the cell on the suspended kernel, which restores it: the time until it answered.

Every answer must equal the source's first one. Prints a table and JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import websocket

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_w2 import TOKEN, Server, run_cell  # noqa: E402
from w2_workload import GPU_CELL, gpu_setup, layers_for  # noqa: E402

from jupyter_gpucr.core.gpu import cuda, gpus  # noqa: E402

CPU_SETUP = """
import hashlib, numpy as np
rng = np.random.default_rng(0)
arrays = [rng.random(1 << 27) for _ in range({chunks})]   # 1 GiB of float64 each
"""
CPU_CELL = """
print(hashlib.sha256(b"".join(a[::4096].tobytes() for a in arrays)).hexdigest()[:16], len(arrays))
"""


def connect(server: Server, kernel_id: str) -> websocket.WebSocket:
    return websocket.create_connection(
        f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}",
        header=[f"Authorization: token {TOKEN}"], timeout=3600)


def answer(server: Server, kernel_id: str, cell: str) -> tuple[str, float]:
    """The cell's output in ``kernel_id`` and when it came (perf_counter)."""
    ws = connect(server, kernel_id)
    try:
        out = run_cell(ws, cell)
    finally:
        ws.close()
    return out, time.perf_counter()


def fork_round(server: Server, kid: str, cell: str) -> dict:
    """Fork ``kid`` into 2 and run the cell in both at once: the seconds to the fork's answer and
    to both cells' answers, the answers, and, when it was running, how long the source was paused
    and where that went (the server's answer says). The copies are shut down after."""
    t0 = time.perf_counter()
    made = server.rest(f"api/gpucr/kernels/{kid}/fork", "POST", {"count": 2, "gpu": "auto"})
    forked = time.perf_counter() - t0
    paused = made.get("source") or {}
    ids = [k["id"] for k in made["kernels"]]
    try:
        with ThreadPoolExecutor(len(ids)) as pool:
            answers = list(pool.map(lambda k: answer(server, k, cell), ids))
    finally:
        for k in ids:
            server.rest(f"api/kernels/{k}", "DELETE")
    return {"fork_s": forked, "both_answered_s": max(at for _, at in answers) - t0,
            "source_paused_s": paused.get("paused_s"), "source": paused, "answers": [out for out, _ in answers]}


def rounds(server: Server, setup: str, cell: str, count: int) -> tuple[str, list[dict]]:
    kid, ws = server.kernel("fork.ipynb")
    run_cell(ws, setup)
    reference = run_cell(ws, cell)
    ws.close()
    rows = []
    for i in range(count):
        running = fork_round(server, kid, cell)
        server.rest(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        suspended = fork_round(server, kid, cell)
        t0 = time.perf_counter()
        single, at = answer(server, kid, cell)  # restores the source
        rows.append({"round": i + 1, "fork_running": running, "fork_suspended": suspended,
                     "single_restore_answered_s": at - t0,
                     "same": all(a == reference for a in (*running["answers"], *suspended["answers"], single))})
    server.rest(f"api/kernels/{kid}", "DELETE")
    return reference, rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpu", action="store_true", help="a Llama-architecture model on cuda:0 (W2's, --model-gb of it)")
    ap.add_argument("--model-gb", type=float, default=5.4, help="GB of bf16 weights (5.4: W2's 2.7 B parameters)")
    ap.add_argument("--cpu-gb", type=int, default=2, help="GiB of NumPy arrays in the CPU kernel")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--store", help="checkpoint store (default: a temporary directory)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.gpu:
        layers = layers_for(args.model_gb)
        setup, cell, what = gpu_setup(layers), GPU_CELL, f"GPU: Llama-architecture model, {layers} layers, ~{args.model_gb} GB bf16"
    else:
        setup, cell, what = CPU_SETUP.format(chunks=args.cpu_gb), CPU_CELL, f"CPU: {args.cpu_gb} GiB of NumPy"
    store = Path(args.store or tempfile.mkdtemp(prefix="gpucr-fork-"))
    work = Path(tempfile.mkdtemp(prefix="gpucr-fork-root-"))
    cuda.unavailable_reason()
    server = Server(work, store / "gpucr", work / "server.log")
    try:
        reference, rows = rounds(server, setup, cell, args.rounds)
    finally:
        server.stop()
    fmt = "{:6} {:>16} {:>14} {:>16} {:>18} {:>18} {:>6}"
    print(what)
    print(fmt.format("round", "fork (running)", "source paused", "both answered", "fork (suspended)",
                     "single restore", "same"))
    for r in rows:
        running, suspended = r["fork_running"], r["fork_suspended"]
        print(fmt.format(r["round"], f"{running['fork_s']:.2f}", f"{running['source_paused_s'] or 0:.2f}",
                         f"{running['both_answered_s']:.2f}", f"{suspended['both_answered_s']:.2f}",
                         f"{r['single_restore_answered_s']:.2f}", str(r["same"])))
    best = {k: min(f(r) for r in rows) for k, f in (
        ("fork_running", lambda r: r["fork_running"]["both_answered_s"]),
        ("fork_suspended", lambda r: r["fork_suspended"]["both_answered_s"]),
        ("single", lambda r: r["single_restore_answered_s"]))}
    print(f"best: both forks answered {best['fork_running']:.2f} s (running source), {best['fork_suspended']:.2f} s "
          f"(suspended source); a single restore answered {best['single']:.2f} s; ratio "
          f"{best['fork_running'] / best['single']:.2f}x / {best['fork_suspended'] / best['single']:.2f}x")
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(), "cpus": os.cpu_count(),
              "workload": what, "gpus": [g.name for g in gpus.list_gpus()], "driver": gpus.driver_version(),
              "reference": reference, "rounds": rows, "best": best}
    print(json.dumps(result, indent=2, default=str))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    shutil.rmtree(work, ignore_errors=True)
    if not args.store:
        shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()

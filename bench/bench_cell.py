"""How long the W2 cell itself takes, and whether running it in a kernel costs anything.

    python bench/bench_cell.py [--kind gpu|cpu] [--rounds 5] [--gap 3] [--json-out FILE]

Issue 11's "resume + cell" is the restore plus the user's cell, and the cell's time varies from
machine to machine. This runs the same W2 state (bench/w2_workload.py) in three processes side by
side and times the cell in each, round-robin so that they share the machine's drift: a plain Python
process, an ipykernel, and an ipykernel with gpucr's hooks loaded as the server loads them. Each
cell reports its wall time and its main thread's CPU time (a cell that waits for the CPU shows
wall > CPU) and the machine's steal time over it. Prints a table and JSON.
"""
from __future__ import annotations

import argparse
import json
import platform
import queue
import subprocess
import sys
import time
from pathlib import Path
from statistics import median

from jupyter_client.manager import KernelManager

sys.path.insert(0, str(Path(__file__).resolve().parent))
from w2_workload import code  # noqa: E402

TIMED = "import time as _gpucr_t\n_gpucr_w, _gpucr_c = _gpucr_t.perf_counter(), _gpucr_t.thread_time()\n{cell}\n" \
        "print('@@', _gpucr_t.perf_counter() - _gpucr_w, _gpucr_t.thread_time() - _gpucr_c)\n"

PLAIN = """
import sys, io, contextlib, json
ns = {"__name__": "__main__"}
for line in sys.stdin:
    source = json.loads(line)
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile(source, "cell", "exec"), ns)
    print(json.dumps(buf.getvalue()), flush=True)
"""


class Plain:
    """The cell in a plain Python process (no kernel, no event loop, no other threads of ours)."""

    name = "plain process"
    before_cell = ""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", PLAIN], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True)

    def run(self, source: str) -> str:
        assert self.proc.stdin and self.proc.stdout
        self.proc.stdin.write(json.dumps(source) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} died (exit {self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Kernel:
    """The cell in an ipykernel, optionally with gpucr's hooks (its idle collection and census)."""

    def __init__(self, hooks: bool, before_cell: str = "", name: str = "") -> None:
        self.name = name or ("ipykernel + gpucr_hooks" if hooks else "ipykernel")
        self.before_cell = before_cell  # run untimed before each timed cell
        self.km = KernelManager(kernel_name="python3")
        extra = ["--InteractiveShellApp.extra_extensions=gpucr_hooks"] if hooks else []
        self.km.start_kernel(extra_arguments=extra)
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=120)

    def run(self, source: str) -> str:
        msg_id = self.kc.execute(source)
        out: list[str] = []
        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=600)
            except queue.Empty:
                raise RuntimeError(f"{self.name}: no output in 600 s") from None
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                out.append(content["text"])
            elif kind == "error":
                raise RuntimeError("\n".join(content["traceback"]))
            elif kind == "status" and content["execution_state"] == "idle":
                return "".join(out)

    def close(self) -> None:
        self.kc.stop_channels()
        self.km.shutdown_kernel(now=True)


def steal_ticks() -> int:
    """The machine's stolen CPU time so far (clock ticks): a VM's vCPUs waiting for the host."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) if len(fields) > 8 else 0


def timed(runner: Plain | Kernel, cell: str) -> dict:
    if runner.before_cell:
        runner.run(runner.before_cell)
    steal = steal_ticks()
    out = runner.run(TIMED.format(cell=cell))
    digest, stamp = out.strip().rsplit("\n", 1)
    _, wall, cpu = stamp.split()
    return {"digest": digest.strip(), "wall_s": float(wall), "cpu_s": float(cpu), "steal_ticks": steal_ticks() - steal}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap", type=float, default=3.0, help="seconds between rounds (the hooks' idle collection runs 2 s after a cell)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    setup, cell = code(args.kind)
    runners: list[Plain | Kernel] = [Plain(), Kernel(hooks=False), Kernel(hooks=True)]
    if args.kind == "gpu":
        runners.append(Kernel(hooks=True, before_cell="import torch; torch.cuda.empty_cache()",
                              name="+ allocator emptied first"))
    try:
        t0 = time.perf_counter()
        for r in runners:
            r.run(setup)
        print(f"set up {len(runners)} processes in {time.perf_counter() - t0:.1f} s", flush=True)
        reference = timed(runners[0], cell)["digest"]
        results: dict[str, list[dict]] = {r.name: [] for r in runners}
        for i in range(args.rounds):
            order = runners[i % len(runners):] + runners[:i % len(runners)]  # each goes first in turn
            for r in order:
                time.sleep(args.gap)
                results[r.name].append(timed(r, cell))
    finally:
        for r in runners:
            r.close()
    same = all(c["digest"] == reference for cells in results.values() for c in cells)
    print(f"\nW2 cell ({args.kind}), {args.rounds} rounds, {args.gap} s apart; digests identical: {same}")
    print(f"{'':26} {'wall (each round)':40} {'median':>7} {'CPU (main thread), median':>26} {'steal ticks':>12}")
    for name, cells in results.items():
        walls = [c["wall_s"] for c in cells]
        print(f"{name:26} {' '.join(f'{w:.2f}' for w in walls):40} {median(walls):7.2f} "
              f"{median(c['cpu_s'] for c in cells):26.2f} {sum(c['steal_ticks'] for c in cells):12}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": platform.node(), "kind": args.kind, "gap_s": args.gap,
                                                   "same_digest": same, "cells": results}, indent=1))


if __name__ == "__main__":
    main()

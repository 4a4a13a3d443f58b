"""How fast gpucr's page daemon copies a restored process's memory in, by thread count: a CPU
agent of N MB is checkpointed and restored eagerly once per count, its memory checked each time.

    python bench/bench_pagefill.py --mb 1600 --threads 1,2,4,8,16 [--store DIR]

Prints one line per restore: the restore's timings and the daemon's own account (bytes, seconds,
time spent reading the image and copying in, summed over the threads). Needs root and CRIU.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr import Checkpointer  # noqa: E402
from jupyter_gpucr.core.criu.commands import LAZY_LOG, Criu  # noqa: E402
from tests.conftest import agent_command, ask, wait_for_line  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1600)
    ap.add_argument("--threads", default="1,2,4,8,16")
    ap.add_argument("--store", default=None)
    args = ap.parse_args()
    store = Path(args.store or tempfile.mkdtemp(prefix="gpucr-pagefill-", dir="/dev/shm"))
    made = args.store is None
    os.environ["AGENT_FILE"] = str(store / "agent.counts")
    cr = Checkpointer(store, lazy_restore=False, verify=False)
    fill_argv = Criu.page_fill_argv
    cr.run("pagefill", agent_command("cpu_agent.py", str(args.mb)))
    hello = wait_for_line(cr.store.proc_dir("pagefill") / "stdout.log", timeout=300)
    try:
        for threads in [int(t) for t in args.threads.split(",")]:
            cr.criu.page_fill_argv = lambda images, workdir, t=threads: [*fill_argv(images, workdir), "--threads", str(t)]  # type: ignore[method-assign]
            ckpt = cr.checkpoint("pagefill")
            t0 = time.perf_counter()
            restored = cr.restore("pagefill")
            wall = time.perf_counter() - t0
            same = ask(hello["port"])["checksum"] == hello["checksum"]
            said = [line for line in (ckpt.path / LAZY_LOG).read_text().splitlines() if "copied in" in line]
            print(f"threads {threads:2d}: restore {wall:.3f} s {json.dumps({k: round(v, 3) for k, v in restored.timings.items()})} "
                  f"same={same} | {said[-1] if said else '?'}", flush=True)
    finally:
        cr.remove("pagefill", kill=True)
        if made:
            shutil.rmtree(store, ignore_errors=True)


if __name__ == "__main__":
    main()

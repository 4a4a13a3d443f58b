"""Repeated suspend/restore of one CPU process: does a restored process dump as fast as a fresh
one? CRIU restores memory in 4 KiB pages; gpucr collapses it into huge pages again after each
restore (core/hugepages.py). Prints each round's dump time and the process's huge pages, with the
collapse and without it (for comparison only: replaced by a no-op).

    python bench/bench_repeat.py [--mb 1700] [--rounds 5] [--gap 5] [--store /dev/shm/gpucr-repeat]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr import Checkpointer  # noqa: E402
from jupyter_gpucr.core import hugepages  # noqa: E402

AGENT = Path(__file__).resolve().parents[1] / "tests" / "agents" / "cpu_agent.py"


def huge_mib(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(text.split("AnonHugePages:")[1].split()[0]) >> 10


def rounds(store: Path, mb: int, count: int, gap: float) -> list[dict[str, float]]:
    shutil.rmtree(store, ignore_errors=True)
    cr = Checkpointer(store)
    env = dict(os.environ, AGENT_FILE=str(store.parent / f"{store.name}.counts"))
    subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store), "run", "--name", "agent",
                    "--", sys.executable, str(AGENT), str(mb)], check=True, env=env, capture_output=True)
    time.sleep(3 + mb / 500)  # the agent fills its array
    out = []
    try:
        for _ in range(count):
            huge = huge_mib(cr.status("agent")["pid"])
            ckpt = cr.checkpoint("agent")
            running = cr.restore("agent")
            out.append({"huge_mib_before": huge, "dump_s": ckpt.manifest["timings"]["dump"],
                        "restore_s": running.timings["total"]})
            time.sleep(gap)
    finally:
        cr.remove("agent", kill=True)
        shutil.rmtree(store, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1700)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap", type=float, default=5.0, help="seconds between a restore and the next suspend")
    ap.add_argument("--store", default="/dev/shm/gpucr-repeat")
    args = ap.parse_args()
    result: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                                 "machine": platform.node(), "cpus": os.cpu_count(), "mb": args.mb, "gap_s": args.gap}
    with_collapse = rounds(Path(args.store), args.mb, args.rounds, args.gap)
    hugepages.start = lambda pids: None  # the comparison: restored processes keep their 4 KiB pages
    without = rounds(Path(args.store), args.mb, args.rounds, args.gap)
    result.update(with_collapse=with_collapse, without_collapse=without)
    for label, rows in (("huge pages collapsed after each restore", with_collapse), ("left in 4 KiB pages", without)):
        print(f"{label}:")
        for i, r in enumerate(rows):
            print(f"  round {i + 1}: {r['huge_mib_before']:5d} MiB in huge pages, dump {r['dump_s']:.2f} s, "
                  f"restore {r['restore_s']:.2f} s")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

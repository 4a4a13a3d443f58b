"""Repeated suspend/restore of one CPU process: does a restored process dump as fast as a fresh
one? CRIU restores memory in 4 KiB pages; gpucr collapses it into huge pages again after each
restore (core/criu/hugepages.py). Prints each round's dump time and the process's huge pages, with the
collapse and without it (for comparison only: replaced by a no-op), each also with ``--pretouch``
GB written and freed just before every dump: on a VM whose host takes back the memory the guest
frees (virtio-balloon free page reporting), a dump into memory the host has taken back pays for
the host faulting it in again, whatever the dumped process's pages are. Then what the huge pages
buy the process itself: a sum and a random gather over an array of ``--mb`` in either page size.

    python bench/bench_repeat.py [--mb 1700] [--rounds 5] [--gap 5] [--pretouch 4] [--store /dev/shm/gpucr-repeat]
"""
from __future__ import annotations

import argparse
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from jupyter_gpucr import Checkpointer  # noqa: E402
from jupyter_gpucr.core.criu import hugepages  # noqa: E402
from jupyter_gpucr.core.hostmemory import free_page_reporting  # noqa: E402

AGENT = Path(__file__).resolve().parents[1] / "tests" / "agents" / "cpu_agent.py"


def huge_mib(pid: int) -> int:
    text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    return int(text.split("AnonHugePages:")[1].split()[0]) >> 10


def touch_and_free(gb: float) -> None:
    """Write ``gb`` GB in a child process that then exits: the guest's free memory is backed by
    the host again for a while (until it is reported free once more)."""
    subprocess.run([sys.executable, "-c", f"b = b'\\x01' * {int(gb * (1 << 30))}"], check=True)


def rounds(store: Path, mb: int, count: int, gap: float, pretouch_gb: float) -> list[dict[str, float]]:
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
            if pretouch_gb:
                touch_and_free(pretouch_gb)
            ckpt = cr.checkpoint("agent")
            running = cr.restore("agent")
            out.append({"huge_mib_before": huge, "dump_s": ckpt.manifest["timings"]["dump"],
                        "memwrite_s": ckpt.manifest["timings"].get("criu_memwrite", 0.0),
                        "restore_s": running.timings["total"]})
            time.sleep(gap)
    finally:
        cr.remove("agent", kill=True)
        shutil.rmtree(store, ignore_errors=True)
    return out


def compute_speed(mb: int) -> dict[str, dict[str, float]]:
    """Best of a few: a sum and a gather of 20 M random elements over ``mb`` of float64 in 4 KiB
    pages and in huge pages (what the collapse after a restore gives back)."""
    out = {}
    rng = np.random.default_rng(0)
    for advice, label in ((mmap.MADV_NOHUGEPAGE, "4 KiB pages"), (mmap.MADV_HUGEPAGE, "huge pages")):
        area = mmap.mmap(-1, mb << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        area.madvise(advice)
        a = np.frombuffer(area, dtype=np.float64)
        a[:] = 1.0
        idx = rng.integers(0, a.size, 20_000_000)
        sums, gathers = [], []
        for _ in range(5):
            t0 = time.perf_counter()
            a.sum()
            t1 = time.perf_counter()
            a[idx].sum()
            sums.append(t1 - t0)
            gathers.append(time.perf_counter() - t1)
        out[label] = {"sum_s": min(sums), "gather_s": min(gathers)}
        del a
        area.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=1700)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gap", type=float, default=5.0, help="seconds between a restore and the next suspend")
    ap.add_argument("--pretouch", type=float, default=4.0, help="GB written and freed before each dump in the second pair of runs")
    ap.add_argument("--store", default="/dev/shm/gpucr-repeat")
    args = ap.parse_args()
    result: dict[str, object] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
                                 "cpus": os.cpu_count(), "mb": args.mb, "gap_s": args.gap,
                                 "free_page_reporting": free_page_reporting()}
    collapse = hugepages.start
    runs = {}
    for pretouch in (0.0, args.pretouch):
        hugepages.start = collapse
        runs[("huge pages collapsed after each restore", pretouch)] = rounds(Path(args.store), args.mb, args.rounds, args.gap, pretouch)
        hugepages.start = lambda *a, **k: None  # the comparison: restored processes keep their 4 KiB pages
        runs[("left in 4 KiB pages", pretouch)] = rounds(Path(args.store), args.mb, args.rounds, args.gap, pretouch)
    hugepages.start = collapse
    speed = compute_speed(args.mb)
    result.update(runs=[{"label": label, "pretouch_gb": pretouch, "rounds": rows} for (label, pretouch), rows in runs.items()],
                  compute=speed)
    print(f"free page reporting offered to this VM: {result['free_page_reporting']}")
    for (label, pretouch), rows in runs.items():
        print(f"{label}{f', {pretouch:g} GB written and freed before each dump' if pretouch else ''}:")
        for i, r in enumerate(rows):
            print(f"  round {i + 1}: {r['huge_mib_before']:5d} MiB in huge pages, dump {r['dump_s']:.2f} s "
                  f"(CRIU writing pages {r['memwrite_s']:.2f} s), restore {r['restore_s']:.2f} s")
    for label, t in speed.items():
        print(f"{args.mb} MiB in {label}: sum {t['sum_s']:.3f} s, random gather of 20 M {t['gather_s']:.3f} s")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""What restoring ahead of the run saves: the first cell of a suspended kernel holding --gb of
state in a real jupyter server, run at once (the restore starts with the run), or after the "about
to use it" hint (POST .../resume {"wait": false}, what JupyterLab sends when the user types into a
cell) and --think seconds of typing; against the same cell on a kernel that never left.

    python bench/bench_restore_ahead.py --gb 1 [--think 3] [--rounds 3] [--json-out FILE]
    python bench/bench_restore_ahead.py --w2 [--engine criu|snapshot] ...   # the W2 GPU notebook

Times are from the cell's request to its output, as the user sees them. Also how long the hint's
answer took. Prints a table and the same figures as JSON.

The cost side, ``--leave IDLE_S``: the user types (the hint restores the kernel) and leaves without
running anything, under an idle timeout of IDLE_S (``c.GPUCR.idle_timeout``, checked every
``--check`` s). How long the restore took, how long the kernel then stays resident before the idle
check suspends it again, what it holds meanwhile (the RSS of its process, sampled every 0.2 s), and
how long that suspend took:

    python bench/bench_restore_ahead.py --gb 1 --leave 30 --check 5 --rounds 3
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from bench.w2_workload import GPU_CELL, GPU_SETUP  # noqa: E402
from jupyter_gpucr.agents import about_to_use  # noqa: E402
from tests.kernel_ws import execute  # noqa: E402
from tests.server.test_server_lifecycle import RealServer  # noqa: E402

CELL = "print(round(float(a[::4096].sum()), 3))"


async def cell(server: RealServer, kid: str, code: str) -> tuple[float, str]:
    ws = await server.ws(kid)
    t0 = time.perf_counter()
    _, out, _ = await execute(ws, code, timeout=600)
    took = time.perf_counter() - t0
    ws.close()
    return took, out


async def main(gb: float, think: float, rounds: int, w2: bool, engine: str) -> dict[str, object]:
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-ahead-"))
    root = tmp / "root"
    root.mkdir()
    server = RealServer(root, tmp / "store", tmp / "server.log")
    times: dict[str, list[float]] = {"warm": [], "restore on run": [], f"hint, {think:g} s, run": [], "hint answer": []}
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        setup = GPU_SETUP if w2 else f"import numpy as np\na = np.random.default_rng(0).random(int({gb} * 2**30 / 8))"
        code = GPU_CELL if w2 else CELL
        await execute(ws, setup, timeout=600)
        ws.close()
        _, expected = await cell(server, kid, code)
        for _ in range(rounds):
            took, out = await cell(server, kid, code)
            times["warm"].append(took)
            await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {"engine": engine})
            took, out = await cell(server, kid, code)
            assert out == expected
            times["restore on run"].append(took)
            await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {"engine": engine})
            t0 = time.perf_counter()
            await asyncio.to_thread(about_to_use, kid, server.url, "secret-token")
            times["hint answer"].append(time.perf_counter() - t0)
            await asyncio.sleep(think)  # the user types
            took, out = await cell(server, kid, code)
            assert out == expected
            times[f"hint, {think:g} s, run"].append(took)
    finally:
        server.sigterm()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "workload": "W2" if w2 else f"{gb:g} GiB numpy", "engine": engine,
            "think_s": think, "rounds": rounds, **{f"{k} (median s)": statistics.median(v) for k, v in times.items()},
            "raw": times}


def kernel_rss(kid: str) -> int:
    """The RSS of the kernel's processes (their command line names its connection file)."""
    total = 0
    for p in psutil.process_iter(["cmdline", "memory_info"]):
        if any(f"kernel-{kid}.json" in part for part in p.info["cmdline"] or ()) and p.info["memory_info"]:
            total += p.info["memory_info"].rss
    return total


async def leave(gb: float, idle_s: float, check_s: int, rounds: int) -> dict[str, object]:
    """Typing without a run: the hint restores the kernel, nothing runs, the idle check puts it back."""
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-leave-"))
    root = tmp / "root"
    root.mkdir()
    server = RealServer(root, tmp / "store", tmp / "server.log", f"--GPUCR.idle_timeout={idle_s:g}",
                        f"--GPUCR.idle_check_interval={check_s}")
    figures: dict[str, list[float]] = {"restore (s)": [], "resident (s)": [], "RSS held, mean (GiB)": [],
                                       "RSS held, max (GiB)": [], "held (GiB x s)": [], "suspend again (s)": []}
    try:
        await server.wait_ready()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        ws = await server.ws(kid)
        await execute(ws, f"import numpy as np\na = np.random.default_rng(0).random(int({gb} * 2**30 / 8))", timeout=600)
        ws.close()
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        for _ in range(rounds):  # each starts with the kernel on disk, where the idle check left it
            t0 = time.monotonic()
            await asyncio.to_thread(about_to_use, kid, server.url, "secret-token")  # the user types, then leaves
            samples: list[float] = []
            running_at = leaving_at = None
            while True:
                st = await server.get(f"api/gpucr/kernels/{kid}")
                state, now = st["state"], time.monotonic()
                assert now - t0 < 10 * idle_s + 120, f"still {state}"
                if state == "running":
                    running_at = running_at or now
                    samples.append(kernel_rss(kid) / 2**30)
                elif running_at and state != "running":
                    leaving_at = leaving_at or now
                    if state == "suspended":
                        break
                await asyncio.sleep(0.2)
            assert running_at is not None and leaving_at is not None
            figures["restore (s)"].append(running_at - t0)
            figures["resident (s)"].append(leaving_at - running_at)
            figures["RSS held, mean (GiB)"].append(statistics.mean(samples))
            figures["RSS held, max (GiB)"].append(max(samples))
            figures["held (GiB x s)"].append(statistics.mean(samples) * (leaving_at - running_at))
            figures["suspend again (s)"].append((st.get("timings") or {}).get("total") or now - leaving_at)
            reason = (st.get("checkpoint") or {}).get("reason")
            assert reason == "idle", reason
    finally:
        server.sigterm()
        shutil.rmtree(tmp, ignore_errors=True)
    return {"machine": platform.node(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "workload": f"{gb:g} GiB numpy", "idle_timeout_s": idle_s, "idle_check_interval_s": check_s,
            "rounds": rounds, **{f"{k}, median": statistics.median(v) for k, v in figures.items()}, "raw": figures}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0)
    parser.add_argument("--think", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--w2", action="store_true", help="the W2 GPU notebook (bench/w2_workload.py) instead of --gb")
    parser.add_argument("--engine", choices=["criu", "snapshot"], default="criu")
    parser.add_argument("--leave", type=float, metavar="IDLE_S",
                        help="typing without a run, under c.GPUCR.idle_timeout=IDLE_S (the cost of restoring ahead)")
    parser.add_argument("--check", type=int, default=5, help="--leave: c.GPUCR.idle_check_interval")
    parser.add_argument("--json-out")
    args = parser.parse_args()
    if args.leave:
        figures = asyncio.run(leave(args.gb, args.leave, args.check, args.rounds))
    else:
        figures = asyncio.run(main(args.gb, args.think, args.rounds, args.w2, args.engine))
    for k, v in figures.items():
        if k != "raw":
            print(f"{k:34} {v:.3f}" if isinstance(v, float) else f"{k:34} {v}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(figures, indent=1))

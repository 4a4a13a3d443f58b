"""Suspend/resume latency of a real kernel holding N GB of state in a real jupyter server,
against what users do today: shut it down, start a new kernel and re-run the cells. Also the
first cell after a suspend when the image is not in memory (a cold page cache, as after a reboot),
with and without the prefetch that opening the notebook starts.

    python bench/bench_server.py --gb 1 [--json-out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.kernel_ws import execute  # noqa: E402
from tests.pagecache import evict, resident_fraction  # noqa: E402
from tests.server.test_server_lifecycle import RealServer  # noqa: E402

CELLS = [
    "import numpy as np",
    "a = np.random.default_rng(0).random(int({gb} * 2**30 / 8))",
    "table = {{i: str(i) for i in range(200_000)}}",
    "print(round(float(a.sum()), 3), len(table))",
]


async def run_cells(server: RealServer, kid: str, gb: float) -> tuple[float, str]:
    ws = await server.ws(kid)
    t0 = time.perf_counter()
    out = ""
    for cell in CELLS:
        _, out, _ = await execute(ws, cell.format(gb=gb), timeout=600)
    ws.close()
    return time.perf_counter() - t0, out.strip().splitlines()[-1]


async def cold_first_cell(server: RealServer, kid: str, store: Path, expected: str,
                          prefetch: bool) -> dict[str, float]:
    """Suspend, drop the image from the page cache, then run a cell at once, or first open the
    notebook (a websocket: the server prefetches) and wait until the image is in memory."""
    await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
    files = [f for f in (store / "checkpoints").rglob("*") if f.is_file()]
    evict(files)
    evicted = resident_fraction(files)
    t0 = time.perf_counter()
    ws = await server.ws(kid)
    prefetch_s = 0.0
    if prefetch:
        while resident_fraction(files) < 0.99 and time.perf_counter() - t0 < 300:
            await asyncio.sleep(0.05)
        prefetch_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    _, out, _ = await execute(ws, "print(round(float(a.sum()), 3), len(table))", timeout=600)
    ws.close()
    assert out.strip().splitlines()[-1] == expected, (out, expected)
    return {"resident_after_evict": evicted, "prefetch_s": prefetch_s, "first_cell_s": time.perf_counter() - t0}


async def main(gb: float, json_out: str | None) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-server-"))
    (tmp / "root").mkdir()
    server = RealServer(tmp / "root", tmp / "store", tmp / "server.log")
    try:
        await server.wait_ready()
        t0 = time.perf_counter()
        kid = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        build_s, expected = await run_cells(server, kid, gb)
        t0 = time.perf_counter()
        st = await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        suspend_s = time.perf_counter() - t0
        # transparent path: the next cell restores the kernel
        ws = await server.ws(kid)
        t0 = time.perf_counter()
        _, out, _ = await execute(ws, "print(round(float(a.sum()), 3), len(table))", timeout=600)
        first_cell_s = time.perf_counter() - t0
        ws.close()
        assert out.strip().splitlines()[-1] == expected, (out, expected)
        t0 = time.perf_counter()
        await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        await server.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
        resume_round_s = time.perf_counter() - t0
        cold = {prefetch: await cold_first_cell(server, kid, tmp / "store", expected, prefetch)
                for prefetch in (False, True)}
        # today's way: shut down, start a fresh kernel, re-run everything
        t0 = time.perf_counter()
        await server.request(f"api/kernels/{kid}", "DELETE")
        kid2 = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        rerun_s, out2 = await run_cells(server, kid2, gb)
        cold_s = time.perf_counter() - t0
        assert out2 == expected
    finally:
        server.sigterm()
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
              "cpus": os.cpu_count(), "state_gb": gb, "image_bytes": st["checkpoint"]["size"],
              "build_cells_s": build_s, "suspend_s": suspend_s, "first_cell_after_suspend_s": first_cell_s,
              "suspend_plus_resume_s": resume_round_s, "shutdown_start_rerun_s": cold_s,
              "cold_page_cache": cold[False], "cold_page_cache_prefetched": cold[True],
              "suspend_timings": st["timings"]}
    print(f"state {gb} GB, image {st['checkpoint']['size'] >> 20} MiB")
    print(f"  suspend (REST)                       {suspend_s:6.2f} s")
    print(f"  first cell after suspend (restores)  {first_cell_s:6.2f} s")
    print(f"  suspend + resume (REST)              {resume_round_s:6.2f} s")
    print(f"  first cell, image not in memory      {cold[False]['first_cell_s']:6.2f} s")
    print(f"  the same after opening the notebook  {cold[True]['first_cell_s']:6.2f} s "
          f"(prefetch took {cold[True]['prefetch_s']:.2f} s)")
    print(f"  shutdown + new kernel + re-run cells {cold_s:6.2f} s")
    print(json.dumps(result, indent=2))
    if json_out:
        Path(json_out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)  # its store holds the kernel's memory; kept (with the log) when the bench failed


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--json-out")
    a = ap.parse_args()
    asyncio.run(main(a.gb, a.json_out))

"""Save points of a running kernel (issue 44): how long the kernel is paused for each, how long the
request takes, how big each is, and how long going back takes. A CPU kernel (numpy) holding
``--mb`` MiB; between save points a cell changes ``--change`` percent of it. Every save point is a
full CRIU dump (--leave-running): incremental dumps (pre-dump / --track-mem with --prev-images-dir)
are not implemented yet, so the second save point costs what the first does.

    python bench/bench_savepoints.py [--mb 1024] [--count 3] [--change 1] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.agent_servers import Served, kill_leftovers  # noqa: E402
from tests.kernel_ws import execute  # noqa: E402


async def _run(served: Served, kid: str, code: str) -> str:
    ws = await served.ws(kid)
    try:
        reply, out, _ = await execute(ws, code)
    finally:
        ws.close()
    assert reply["content"]["status"] == "ok", out
    return out


async def bench(mb: int, count: int, change: float) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-sp-"))
    served = Served("server", tmp / "root", tmp / "store")
    try:
        await served.wait_ready()
        kid = await served.start_kernel()
        await _run(served, kid, f"import numpy as np\nstate = np.ones({mb} * 2**20 // 8)\nprint('ready')")
        points = []
        step = max(1, int(mb * 2**20 // 8 * change / 100))
        for i in range(count):
            await _run(served, kid, f"state[{i * step}:{(i + 1) * step}] = {i + 2}")
            t0 = time.perf_counter()
            sp = await served.request(f"api/gpucr/kernels/{kid}/savepoints", "POST", {"name": f"sp{i}"})
            points.append({"request_s": round(time.perf_counter() - t0, 3), "paused_s": sp["paused_s"],
                           "dump_s": round((sp["pause"].get("dump") or {}).get("dump", 0), 3),
                           "size_mib": sp["size"] >> 20})
        first = (await served.request(f"api/gpucr/kernels/{kid}/savepoints"))[0]
        t0 = time.perf_counter()
        back = await served.request(f"api/gpucr/kernels/{kid}/savepoints/{first['id']}/restore", "POST", {})
        go_back_s = round(time.perf_counter() - t0, 3)
        check = await _run(served, kid, f"print(int(state[0]), int(state[{step}]))")
        assert check.split() == ["2", "1"], check
        return {"mb": mb, "change_pct": change, "save_points": points, "go_back_s": go_back_s,
                "go_back_restore_total_s": round(back.get("timings", {}).get("total", 0), 3),
                "host": platform.node(), "cpus": __import__("os").cpu_count()}
    finally:
        served.stop()
        kill_leftovers(tmp)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=1024)
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--change", type=float, default=1.0, help="percent of the state changed between save points")
    p.add_argument("--json-out")
    args = p.parse_args()
    result = asyncio.run(bench(args.mb, args.count, args.change))
    print(json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

"""Agent kernels through a Kernel Gateway with gpucr: each agent runs a cell (work), thinks (idles
long enough to be suspended, its websocket still open, as autogen-ext keeps it) and runs the next
cell (wake), for a fixed time. Reports the time from the agent's request to its first output
(p50/p95, for requests to a kernel on disk and to a running one), the share of time the kernels
were on disk, errors (a wrong answer, an error message or a timeout; must be 0), and the memory
freed: the kernels' resident memory (and GPU memory with --gpu) all running against on average.

    python bench/bench_agents.py [--agents 8] [--minutes 10] [--think 12] [--idle-timeout 4] [--gpu] [--json-out FILE]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr.core.gpu import gpus  # noqa: E402
from tests.agent_servers import Served, kill_leftovers  # noqa: E402
from tests.kernel_ws import request, send  # noqa: E402

SETUP_CPU = "import numpy as np\nstate = np.ones({mb} * 2**20 // 8)\nn = 0\nprint('ready')"
SETUP_GPU = ("import torch\nstate = torch.ones({mb} * 2**20 // 4, device='cuda')\n"
             "torch.cuda.synchronize()\nn = 0\nprint('ready')")
WORK_CPU = "n += 1\nprint(n, float(state[:1000].sum()))"
WORK_GPU = "n += 1\nprint(n, float(state[:1000].sum().item()))"


class Agent:
    """One agent: a kernel, one websocket kept open, a cycle of work and think."""

    def __init__(self, gw: Served, index: int, gpu: bool, mb: int) -> None:
        self.gw, self.index, self.gpu, self.mb = gw, index, gpu, mb
        self.latencies: dict[str, list[float]] = {"woke": [], "warm": []}
        self.errors: list[str] = []
        self.n = 0

    async def start(self) -> None:
        self.kid = await self.gw.start_kernel()
        self.ws = await self.gw.ws(self.kid)
        out = await self.run((SETUP_GPU if self.gpu else SETUP_CPU).format(mb=self.mb), timeout=300)
        if out[1] != "ready":
            raise RuntimeError(f"agent {self.index}: setup said {out[1]!r}")

    async def run(self, code: str, timeout: float = 120) -> tuple[float, str]:
        """(seconds to the first output, the whole output); errors are recorded."""
        msg = request(code)
        msg_id = msg["header"]["msg_id"]
        t0 = time.perf_counter()
        await send(self.ws, msg)
        first, out, idle = None, [], False
        deadline = t0 + timeout
        while not idle:
            raw = await asyncio.wait_for(self.ws.read_message(), max(0.1, deadline - time.perf_counter()))
            if raw is None:
                raise ConnectionError("the websocket closed")
            m = json.loads(raw)
            if m["parent_header"].get("msg_id") != msg_id:
                continue
            kind = m["msg_type"]
            if kind == "stream":
                first = first or time.perf_counter() - t0
                out.append(m["content"]["text"])
            elif kind == "error" or (kind == "execute_reply" and m["content"]["status"] != "ok"):
                self.errors.append(f"agent {self.index}: {m['content'].get('ename')}: {m['content'].get('evalue')}")
            elif kind == "status" and m["content"]["execution_state"] == "idle":
                idle = True
        return first or time.perf_counter() - t0, "".join(out).strip()

    async def cycle(self, until: float, think: float) -> None:
        while time.monotonic() < until:
            on_disk = await self.gw.state(self.kid) in ("suspended", "restoring")
            try:
                latency, out = await self.run(WORK_GPU if self.gpu else WORK_CPU)
            except Exception as e:  # a timeout or a closed websocket: the agent would have failed
                self.errors.append(f"agent {self.index}: {type(e).__name__}: {e}")
                return
            self.n += 1
            if not out.startswith(f"{self.n} "):
                self.errors.append(f"agent {self.index}: expected n={self.n}, got {out!r}")
            self.latencies["woke" if on_disk else "warm"].append(latency)
            await asyncio.sleep(think * random.uniform(0.6, 1.4))


def kernel_rss(kernel_ids: list[str]) -> int:
    total = 0
    for p in psutil.process_iter(["cmdline", "memory_info"]):
        cmd = " ".join(p.info["cmdline"] or ())
        if any(k in cmd for k in kernel_ids) and p.info["memory_info"]:
            total += p.info["memory_info"].rss
    return total


def gpu_used() -> int:
    return sum(g.memory_used for g in gpus.list_gpus())


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    random.seed(0)
    work = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    gw = Served("gateway", work / "root", work / "store", f"--GPUCR.idle_timeout={args.idle_timeout}",
                "--GPUCR.idle_check_interval=1", "--GPUCR.suspend_connected=True")
    try:
        await gw.wait_ready()
        agents = [Agent(gw, i, args.gpu, args.mb) for i in range(args.agents)]
        for a in agents:  # one by one: on a small machine parallel kernel starts time out
            await a.start()
        ids = [a.kid for a in agents]
        full_rss, full_gpu = kernel_rss(ids), gpu_used() if args.gpu else 0
        until = time.monotonic() + args.minutes * 60
        samples: list[tuple[int, int, int]] = []  # (kernels on disk, rss, gpu bytes)

        async def sample() -> None:
            while time.monotonic() < until:
                states = [s["state"] for s in await gw.request("api/gpucr/kernels")]
                samples.append((sum(s in ("suspended", "restoring") for s in states), kernel_rss(ids),
                                gpu_used() if args.gpu else 0))
                await asyncio.sleep(1)

        await asyncio.gather(sample(), *(a.cycle(until, args.think) for a in agents))
    finally:
        gw.stop()
        kill_leftovers(work)
    woke = [x for a in agents for x in a.latencies["woke"]]
    warm = [x for a in agents for x in a.latencies["warm"]]
    errors = [e for a in agents for e in a.errors]
    mean_rss = statistics.mean(s[1] for s in samples)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "host": platform.node(),
        "cpus": os.cpu_count(), "gpu": [g.name for g in gpus.list_gpus()] if args.gpu else None,
        "command": " ".join(sys.argv), "agents": args.agents, "minutes": args.minutes, "think_s": args.think,
        "idle_timeout_s": args.idle_timeout, "state_mb": args.mb,
        "requests": len(woke) + len(warm), "requests_to_suspended": len(woke),
        "first_output_s": {"woke_p50": pct(woke, 50), "woke_p95": pct(woke, 95),
                           "warm_p50": pct(warm, 50), "warm_p95": pct(warm, 95)},
        "suspended_share": statistics.mean(s[0] for s in samples) / args.agents,
        "errors": len(errors), "error_samples": errors[:5],
        "rss_all_running_mb": full_rss / 2**20, "rss_mean_mb": mean_rss / 2**20,
        "rss_freed_share": 1 - mean_rss / full_rss if full_rss else None,
    }
    if args.gpu:
        mean_gpu = statistics.mean(s[2] for s in samples)
        result.update({"gpu_all_running_mb": full_gpu / 2**20, "gpu_mean_mb": mean_gpu / 2**20})
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--think", type=float, default=12, help="mean seconds an agent thinks between two cells")
    ap.add_argument("--idle-timeout", type=int, default=4, help="GPUCR.idle_timeout of the gateway")
    ap.add_argument("--mb", type=int, default=128, help="MB of state each kernel holds")
    ap.add_argument("--gpu", action="store_true", help="the state lives on the GPU (torch with CUDA)")
    ap.add_argument("--json-out")
    options = ap.parse_args()
    out = asyncio.run(main(options))
    text = json.dumps(out, indent=2)
    print(text)
    if options.json_out:
        Path(options.json_out).write_text(text)
    if out["errors"]:
        sys.exit("bench_agents: the agents saw errors")

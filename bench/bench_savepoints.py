"""Save points of a running kernel (issue 44): how long the kernel is paused for each, how long the
request takes, how many bytes each keeps, and how long going back takes (to the newest and to the
first, each a few seconds after the last). The kernel holds ``--mb`` MiB of NumPy and, with
``--gpu-gb N``, N GiB of CUDA tensors (PyTorch, a GPU machine: the W2-like case, whose tensors a
save point moves out into files and back): ``--gpu-changed-gb`` of them in one tensor (a KV cache),
the rest in 64 MiB tensors that no cell changes (a model's weights). Before each save point a cell
changes ``--change`` percent of the NumPy array and of the cache.

Where the machine's kernel tracks the pages a process writes, the second and later save points'
dumps are incremental (CRIU's --track-mem against the previous one: only the pages written since,
a shorter pause). Where it does not (no CONFIG_MEM_SOFT_DIRTY: `criu check --feature
mem_dirty_track` fails, as on the CPU VM), every dump is full (`memory` in each row says which and
why), and after the pause the previous save point is rewritten to take its unchanged pages from the
new one (`shared`: its bytes before and after, and how long that took, which counts in the request,
not the pause). The first save point writes every GPU tensor; the next ones write only the cache
and link the weights' files (``linked``: the bytes taken by reference).

    python bench/bench_savepoints.py [--mb 1024] [--count 3] [--change 1] [--gpu-gb N [--gpu-changed-gb M]]
                                     [--store DIR] [--json-out FILE]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr.core.criu.commands import drop_network_locks  # noqa: E402
from tests.agent_servers import Served, kill_leftovers  # noqa: E402
from tests.kernel_ws import execute  # noqa: E402

SETTLE_S = 5.0


async def _run(served: Served, kid: str, code: str) -> str:
    ws = await served.ws(kid)
    try:
        reply, out, _ = await execute(ws, code)
    finally:
        ws.close()
    assert reply["content"]["status"] == "ok", out
    return out


def _setup(mb: int, gpu_gb: float, changed_gb: float) -> str:
    code = f"import numpy as np\nstate = np.ones({mb} * 2**20 // 8)\n"
    if gpu_gb:  # imported only here: the CPU machines have no PyTorch
        weights = int((gpu_gb - changed_gb) * 16)  # 64 MiB each
        code += (f"import torch\ntensor = torch.ones(int({changed_gb} * 2**30) // 4, device='cuda:0')\n"
                 f"weights = [torch.full((2**24,), float(i), device='cuda:0') for i in range({weights})]\n")
    return code + "print('ready')"


def _change(i: int, step: int, gstep: int, gpu_gb: float) -> str:
    code = f"state[{i * step}:{(i + 1) * step}] = {i + 2}"
    if gpu_gb:
        code += f"\ntensor[{i * gstep}:{(i + 1) * gstep}] = {i + 2}\ntorch.cuda.synchronize()"
    return code


def _check(i: int, step: int, gstep: int, gpu_gb: float) -> tuple[str, str]:
    """A cell printing what save point ``i`` holds, and what it must print."""
    code = f"print(int(state[{i * step}]), int(state[{(i + 1) * step}])"
    want = f"{i + 2} 1"
    if gpu_gb:
        code += f", int(tensor[{i * gstep}].item()), int(tensor[{(i + 1) * gstep}].item())"
        want += f" {i + 2} 1"
    return code + ")", want


async def _go_back(served: Served, kid: str, sp: dict[str, Any], check: tuple[str, str]) -> dict[str, Any]:
    """Going back to ``sp`` (the running kernel suspended first, then restored from it), its values
    checked; ``restore``: the restore's own steps. A few seconds first: a kernel restored lazily
    just before is still taking its memory in, which the suspend would wait for."""
    await asyncio.sleep(SETTLE_S)
    t0 = time.perf_counter()
    back = await served.request(f"api/gpucr/kernels/{kid}/savepoints/{sp['id']}/restore", "POST", {})
    took = time.perf_counter() - t0
    out = (await _run(served, kid, check[0])).strip()
    assert out == check[1], (out, check)
    timings = back.get("timings") or {}
    return {"to": sp["name"], "takes_pages_from_another": sp.get("parent") is not None, "go_back_s": round(took, 3),
            "restore": {k: round(v, 3) for k, v in timings.items() if isinstance(v, float)}}


async def bench(mb: int, count: int, change: float, gpu_gb: float, changed_gb: float,
                store: Path | None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gpucr-bench-sp-"))
    store = store or tmp / "store"
    served = Served("server", tmp / "root", store)
    try:
        await served.wait_ready()
        kid = await served.start_kernel()
        await _run(served, kid, _setup(mb, gpu_gb, changed_gb))
        step = max(1, int(mb * 2**20 // 8 * change / 100))
        gstep = max(1, int(changed_gb * 2**30 // 4 * change / 100))
        points, taken = [], []
        for i in range(count):
            await _run(served, kid, _change(i, step, gstep, gpu_gb))
            t0 = time.perf_counter()
            sp = await served.request(f"api/gpucr/kernels/{kid}/savepoints", "POST", {"name": f"sp{i}"})
            pause = sp["pause"]
            points.append({"request_s": round(time.perf_counter() - t0, 3), "paused_s": sp["paused_s"],
                           "dump_s": round((pause.get("dump") or {}).get("dump", 0), 3),
                           "move_out_s": pause.get("move_out_s"), "checkpoint_s": pause.get("checkpoint_s"),
                           "reload_s": pause.get("reload_s"),
                           "tensors": {k: (pause.get("offload") or {}).get(k) for k in
                                       ("bytes", "linked", "fingerprint_s", "copy_s", "free_s")},
                           "reload": {k: (pause.get("reload") or {}).get(k) for k in ("bytes", "seconds")},
                           "dump": pause.get("dump"),
                           "size_mib": sp["size"] >> 20, "memory": sp["memory"], "shared": sp["shared"]})
            taken.append(sp)
        listed = {s["id"]: s for s in await served.request(f"api/gpucr/kernels/{kid}/savepoints")}
        kept_mib = {s["name"]: s["size"] >> 20 for s in listed.values()}
        back = [await _go_back(served, kid, listed[taken[-1]["id"]], _check(count - 1, step, gstep, gpu_gb)),
                await _go_back(served, kid, listed[taken[0]["id"]], _check(0, step, gstep, gpu_gb))]
        return {"mb": mb, "gpu_gb": gpu_gb, "gpu_changed_gb": changed_gb, "change_pct": change, "save_points": points, "kept_mib": kept_mib,
                "go_back": back, "host": platform.node(), "cpus": os.cpu_count(), "store": str(store)}
    finally:
        served.stop()
        kill_leftovers(tmp)
        # the network locks of the dumps never restored (the states going back left in the trash), then the
        # store: it holds every save point's memory
        drop_network_locks([p.parent for p in store.rglob("inventory.img")])
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=int, default=1024, help="MiB of NumPy in the kernel")
    p.add_argument("--count", type=int, default=3)
    p.add_argument("--change", type=float, default=1.0, help="percent of the state changed before each save point")
    p.add_argument("--gpu-gb", type=float, default=0.0, help="GiB of CUDA tensors in the kernel as well (PyTorch)")
    p.add_argument("--gpu-changed-gb", type=float, default=0.5, help="GiB of them in the tensor the cells change")
    p.add_argument("--store", type=Path, help="the store (default: a temporary folder); removed afterwards, as the server's folder")
    p.add_argument("--json-out")
    args = p.parse_args()
    result = asyncio.run(bench(args.mb, args.count, args.change, args.gpu_gb, args.gpu_changed_gb, args.store))
    print(json.dumps(result, indent=2))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

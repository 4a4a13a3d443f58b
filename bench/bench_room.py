"""GPU memory as a cache: more kernels than the GPU (or the host memory budget) holds, users taking
turns, gpucr making room by suspending the least recently used idle kernels.

    python bench/bench_room.py --kernels 11 --model-b 8 --kv-tokens 8192 --minutes 10 --seed 0 --store /dev/shm/gpucr-room --json-out room.json
    python bench/bench_room.py --kernels 4 --model-b 1 --gpu-free-gib 12 --minutes 2 --store /dev/shm/gpucr-room
    python bench/bench_room.py --host --kernels 4 --kernel-mib 256 --budget 640MiB --minutes 1 --store /tmp/gpucr-room
    python bench/bench_room.py --report room.json      # the table again, from a finished or cut-off run

A jupyter server with gpucr runs as a separate process. Each kernel builds its state (GPU: a
Llama-architecture model of --model-b billion parameters with random bf16 weights on cuda:0 and the
KV cache of a --kv-tokens prompt, moved into allocations of its own so that PyTorch reserves what
it allocates; --host: --kernel-mib of bytes), then runs its cell twice, the second time warm: that
output is the reference and that time the warm figure. Kernels declare what they take
(c.GPUCR.kernel_gpu_memory: the weights, the KV cache and --gpu-overhead-gib for the CUDA context
and PyTorch's cache; kernel_memory with --host), so a start that finds no room makes it too. This
setup is timed on its own: the kernels that fit together (on a GPU one fewer) start one after the
other and import side by side, then build their state one at a time; each later one starts alone,
its start suspending what it needs. A GPU build peaks above what the kernel keeps (the prefill's
activations): it waits for --build-peak-gib more than the declaration to be free, suspending the
least recently used idle kernels if the start's room falls short (counted apart). After its setup
the bench compares each kernel's declaration with what NVML says it holds. Then, for --minutes, a
seeded trace: a random user runs their cell, thinks up to --think seconds, and so on.

Before anything starts, the plan (bench/room_plan.py) prints the arithmetic: the kernels' declared
sum against the GPU's memory, how many fit at once, what the store and host memory hold at the
fullest. The bench refuses to start (exit 3) when the store or host memory cannot hold it, or
when the store is not empty; --plan-only stops after the plan. The store is deleted at the end. --json-out is rewritten after every step (phase: plan, setup,
trace, done; interrupted or failed when cut off), so a run cut off still leaves its figures.
Printed at the end: the setup's cold starts, p50/p95 from "run cell" to its first output for the
turns that restored their kernel against the warm cell, bytes moved (checkpoints written and read,
offloaded tensors included), the kernels suspended for room, lost outputs (any output other than
the reference, or an error) and the store's medium. --gpu-free-gib: another process holds the rest
of GPU 0 (real memory, real NVML figures), to run the trace with smaller models.

The planned H200 run (1 GPU of 140.4 GiB, 16 cores, 128 GiB of host memory, 125 GiB available; see
docs/dev/benchmarks.md): 11 kernels x 8 B parameters (Llama-3-8B's shape, 32 layers) with an
8192-token KV cache, each declaring 16.96 GiB (14.96 GiB of weights, 1.00 GiB of KV cache, 1 GiB for
the CUDA context and PyTorch's cache) = 186.6 GiB, 1.33x the GPU; 8 fit at once, 4 are suspended at
the fullest. The store is on tmpfs, the fastest medium the machine has (memory): 12 images x 2 GiB
+ 4 x 15.96 GiB of tensors = 87.8 GiB. The tensors reach the store through 0.5 GiB of pinned staging
per suspend or restore, and the store's files are their only host copy; with 8 running kernels x
2 GiB and 2 GiB for the server, CRIU and staging the host holds 105.8 GiB of the 112.2 GiB the plan
may use (a tenth of the memory kept free). 1.5x cannot be planned: 12 kernels (1.45x) need 123.8 GiB,
13 (1.57x) 141.7 GiB, more than the host has, and the disk (63 GiB) holds less still.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import websocket  # websocket-client, a jupyter_server dependency

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_w2 import TOKEN, Server, kernel_rss  # noqa: E402
from bench_w2 import run_cell as w2_run_cell  # noqa: E402
from room_plan import KernelSize, Machine, Plan, store_medium  # noqa: E402

from jupyter_gpucr.core.criu.commands import drop_network_locks  # noqa: E402
from jupyter_gpucr.core.gpu import gpus  # noqa: E402
from jupyter_gpucr.core.sizes import parse_size  # noqa: E402
from jupyter_gpucr.server.room import GPU_MARGIN  # noqa: E402

GiB = 1 << 30
REFUSED = 3
FILLER = "import sys, torch\nx = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda:0')\nprint('ok', flush=True)\nsys.stdin.read()\n"
PROBE = ("import json\nprint(json.dumps({'allocated': torch.cuda.memory_allocated(), 'reserved': torch.cuda.memory_reserved(), "
         "'max_reserved': torch.cuda.max_memory_reserved()}))\n")
#: Blocks this large are never cut for smaller tensors (PyTorch's allocator setting, in the kernels' environment).
ALLOC_CONF = "max_split_size_mb:128"
#: When the bench began, for --deadline-s.
BEGAN = time.monotonic()


class RoomServer(Server):
    def connect(self, kernel_id: str) -> websocket.WebSocket:
        """A new connection to the kernel, as a reopened notebook makes."""
        return websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}",
            header=[f"Authorization: token {TOKEN}"], timeout=3600)

    def states(self) -> dict[str, dict]:
        return {s["kernel_id"]: s for s in self.rest("api/gpucr/kernels")}


class Report:
    """The run's JSON, rewritten whole (through a rename) after every step."""

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        self.data: dict[str, Any] = {}

    def update(self, **fields: Any) -> None:
        self.data.update(fields, written_at=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()))
        if self.path is not None:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            os.replace(tmp, self.path)


# -- the kernels' code -----------------------------------------------------------------------
def llama_shape(billions: float) -> dict[str, int]:
    """A Llama-3-8B-shaped config with as many layers as make about ``billions`` parameters."""
    hidden, inter, vocab, kv_heads, heads = 4096, 14336, 128256, 8, 32
    per_layer = 2 * hidden * hidden + 2 * hidden * (hidden // heads * kv_heads) + 3 * hidden * inter
    layers = max(1, round((billions * 1e9 - 2 * vocab * hidden) / per_layer))
    return {"hidden_size": hidden, "intermediate_size": inter, "vocab_size": vocab, "num_key_value_heads": kv_heads,
            "num_attention_heads": heads, "num_hidden_layers": layers}


def llama_bytes(shape: dict[str, int], kv_tokens: int) -> tuple[int, int]:
    """Bytes of the bf16 weights (embeddings and head untied, as LlamaConfig makes them) and of
    the KV cache of ``kv_tokens`` tokens."""
    hidden, layers = shape["hidden_size"], shape["num_hidden_layers"]
    kv_width = hidden // shape["num_attention_heads"] * shape["num_key_value_heads"]
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_width + 3 * hidden * shape["intermediate_size"] + 2 * hidden
    params = 2 * shape["vocab_size"] * hidden + layers * per_layer + hidden
    return 2 * params, 2 * layers * 2 * kv_width * kv_tokens


class Code(NamedTuple):
    """A kernel's cells: its imports (run side by side with other kernels'), the building of its
    state (alone: it peaks above what the kernel keeps), and the cell its user runs."""

    imports: str
    build: str
    cell: str


def gpu_code(shape: dict[str, int], kv_tokens: int, seed: int) -> Code:
    """A Llama kernel's cells. Built as the prefill leaves it, the 8 B kernel reserved 25.1 GB for
    17.2 GB allocated on the H200: the KV tensors are cut from blocks the activations freed, which
    PyTorch then cannot give back. Copied out and back after emptying the cache, they take what
    they need. Blocks over 128 MiB are not cut (the server's PYTORCH_CUDA_ALLOC_CONF), which keeps
    the prefill's own peak near what it allocates."""
    imports = "import hashlib, torch\nfrom transformers import LlamaConfig, LlamaForCausalLM\n"
    build = f"""
torch.manual_seed({seed})
cfg = LlamaConfig(max_position_embeddings={max(kv_tokens, 4096)}, **{shape!r})
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda:0"):
    model = LlamaForCausalLM(cfg).eval()
torch.set_default_dtype(torch.float32)
prompt = torch.randint(0, cfg.vocab_size, (1, {kv_tokens}), device="cuda:0", generator=torch.Generator("cuda:0").manual_seed({seed}))
with torch.no_grad():
    cache = model.model(prompt, use_cache=True).past_key_values
host = [t.cpu() for t in ([t for layer in cache.layers for t in (layer.keys, layer.values)] if hasattr(cache, "layers")
                          else [t for pair in cache for t in pair])]
del cache
torch.cuda.empty_cache()
kv = [t.to("cuda:0") for t in host]
del host
"""
    cell = """
with torch.no_grad():
    out = model.generate(prompt[:, :16], max_new_tokens=16, min_new_tokens=16, do_sample=False)
print(hashlib.sha256(str(out[0, -16:].tolist()).encode()).hexdigest()[:16])
"""
    return Code(imports, build, cell)


def host_code(mib: int, seed: int) -> Code:
    data = mib * (1 << 20) - (96 << 20)  # the kernel's own baseline is the rest
    return Code("import hashlib, random\n", f"b = random.Random({seed}).randbytes(1 << 20) * {data >> 20}\n",
                "print(hashlib.sha256(b[::4096]).hexdigest()[:16])\n")


def kernels_and_size(args: argparse.Namespace) -> tuple[list[Code], KernelSize]:
    """Each kernel's setup and cell, and what one kernel counts for in the plan."""
    seeds = [args.seed * 1000 + k for k in range(args.kernels)]
    if args.host:
        size = args.kernel_mib << 20
        return [host_code(args.kernel_mib, s) for s in seeds], KernelSize(size, 0, size, size)
    shape = llama_shape(args.model_b)
    weights, kv = llama_bytes(shape, args.kv_tokens)
    size = KernelSize(declared=weights + kv + int(args.gpu_overhead_gib * GiB), moved_out=weights + kv,
                      image=int(args.image_gib * GiB), host_rss=int(args.rss_gib * GiB))
    return [gpu_code(shape, args.kv_tokens, s) for s in seeds], size


# -- where room is made ----------------------------------------------------------------------
def measure(store: Path, room: int, total: int, where: str, margin: int) -> Machine:
    medium, in_memory = store_medium(store)
    ram = psutil.virtual_memory()
    return Machine(where, total, room, margin, str(store), medium, _disk_free(store), in_memory, ram.total, ram.available)


def _disk_free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def hold_gpu(free_gib: float) -> subprocess.Popen:
    """Another process holding all of GPU 0 but ``free_gib`` (its own context besides)."""
    hold = gpus.list_gpus()[0].memory_free - int(free_gib * GiB) - GiB // 2
    filler = subprocess.Popen([sys.executable, "-c", FILLER, str(hold)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert filler.stdout is not None and filler.stdout.readline().strip() == "ok"
    time.sleep(1)
    return filler


def store_bytes(path: Path) -> int:
    """Bytes in the store now (files deleted while counted are skipped)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
    return total


# -- setup -----------------------------------------------------------------------------------
def run_cell(ws: websocket.WebSocket, source: str) -> tuple[str, float, float]:
    """Output, seconds to its first output, seconds to the reply and idle."""
    timing: dict[str, float] = {}
    out = w2_run_cell(ws, source, timing)
    return out, timing["first_output_s"], timing["done_s"]


def set_up(server: RoomServer, codes: list[Code], together: int, gpu: bool, declared: int, build_room: int,
           report: Report) -> tuple[list[str], list[dict]]:
    """Cold starts. The first ``together`` kernels fit at once: started one after the other, they
    import side by side, then each builds its state on its own; each later one starts alone, its
    start making room. A build begins once GPU 0 has ``build_room`` free (its peak), the least
    recently used idle kernels suspended for it where the start's room falls short (counted apart).
    Then each kernel's cell runs twice (the second run: the warm figure and the reference output).
    Returns the kernel ids and one record per kernel."""
    ids: list[str] = []
    rows: list[dict] = []
    t_phase = time.perf_counter()

    def start(k: int) -> websocket.WebSocket:
        before = server.states()
        t0 = time.perf_counter()
        kid, ws = server.kernel(f"user{k}.ipynb")
        after = server.states()
        ids.append(kid)
        rows.append({"kernel": k, "id": kid, "start_s": time.perf_counter() - t0, "side_by_side": k < together,
                     "suspended_for_start": sum(1 for v, s in after.items()
                                                if s["state"] == "suspended" and before.get(v, {}).get("state") == "running")})
        return ws

    def imports(k: int, ws: websocket.WebSocket) -> None:
        t0 = time.perf_counter()
        run_cell(ws, codes[k].imports)
        rows[k]["imports_s"] = time.perf_counter() - t0

    def build(k: int, ws: websocket.WebSocket) -> None:
        rows[k]["suspended_for_build"] = room_for_build(server, rows[k]["id"], build_room) if build_room else 0
        t0 = time.perf_counter()
        run_cell(ws, codes[k].build)
        rows[k]["build_s"] = time.perf_counter() - t0
        rows[k]["setup_s"] = rows[k]["imports_s"] + rows[k]["build_s"]

    def finish(k: int, ws: websocket.WebSocket) -> None:
        row = rows[k]
        if gpu:
            row["torch"] = json.loads(run_cell(ws, PROBE)[0])
        _, row["first_cell_s"], _ = run_cell(ws, codes[k].cell)
        row["output"], row["warm_s"], _ = run_cell(ws, codes[k].cell)
        row["cold_s"] = row["start_s"] + row["setup_s"] + row["first_cell_s"]
        row["hold"] = held_by(server, row["id"], gpu)
        row["declared_minus_held"] = declared - row["hold"] if row["hold"] is not None else None
        ws.close()  # a connection per turn: the server drops the ones idle past its ping timeout
        print(f"kernel {k}: started in {row['start_s']:.1f} s ({row['suspended_for_start']} suspended for it, "
              f"{row['suspended_for_build']} for its build's peak), "
              f"imports {row['imports_s']:.1f} s{' side by side' if row['side_by_side'] else ''}, state built in "
              f"{row['build_s']:.1f} s, first cell "
              f"{row['first_cell_s']:.2f} s, warm {row['warm_s']:.2f} s -> {row['output']}; holds "
              f"{_gib(row['hold'])} of {declared / GiB:.2f} GiB declared{_torch(row.get('torch'))}", flush=True)
        report.update(setup={"kernels": rows, "seconds_so_far": time.perf_counter() - t_phase})

    first = [start(k) for k in range(min(together, len(codes)))]
    with ThreadPoolExecutor(max(1, len(first))) as pool:
        list(pool.map(imports, range(len(first)), first))
    for k, ws in enumerate(first):
        build(k, ws)
        finish(k, ws)
    for k in range(len(first), len(codes)):
        ws = start(k)
        imports(k, ws)
        build(k, ws)
        finish(k, ws)
    seconds = time.perf_counter() - t_phase
    holds = [r["hold"] for r in rows if r["hold"] is not None]
    report.update(setup={"kernels": rows, "seconds": seconds, "held_max": max(holds, default=None),
                         "declared": declared, "held_over_declared": sum(1 for h in holds if h > declared)})
    return ids, rows


def room_for_build(server: RoomServer, kid: str, need: int) -> int:
    """Suspend the least recently used idle kernels until GPU 0 has ``need`` bytes free; how many."""
    suspended = 0
    while (free := gpus.list_gpus()[0].memory_free) < need:
        place = next(p for p in server.rest("api/gpucr/room") if p.get("index") == 0)
        idle = sorted((k for k in place["kernels"] if k["kernel_id"] != kid and k["kept"] is None), key=lambda k: -k["idle_s"])
        if not idle:
            print(f"kernel {kid}: {free / GiB:.1f} GiB free for a build that may take {need / GiB:.1f} GiB, "
                  "and no idle kernel to suspend", flush=True)
            return suspended
        server.rest(f"api/gpucr/kernels/{idle[0]['kernel_id']}/suspend", "POST", {})
        suspended += 1
        deadline = time.monotonic() + 10  # NVML shows the memory free once the process is gone
        while gpus.list_gpus()[0].memory_free <= free and time.monotonic() < deadline:
            time.sleep(0.1)
    return suspended


def held_by(server: RoomServer, kid: str, gpu: bool) -> int | None:
    """What the kernel holds where room is made: NVML's figure on GPU 0, or its process tree's RSS."""
    if not gpu:
        return kernel_rss(kid)
    place = next((p for p in server.rest("api/gpucr/room") if p.get("index") == 0), None)
    return next((k["bytes"] for k in (place or {}).get("kernels", []) if k["kernel_id"] == kid), None)


# -- the trace -------------------------------------------------------------------------------
def moved(state: dict) -> int:
    """Bytes a suspend wrote (or a restore read): the checkpoint and the tensors offloaded beside it."""
    offload = ((state.get("trim") or {}).get("offload") or {}).get("bytes", 0)
    return int((state.get("checkpoint") or {}).get("size") or 0) + int(offload)


def trace(server: RoomServer, ids: list[str], codes: list[Code], reference: list[str], warm: list[float],
          args: argparse.Namespace, store: Path, report: Report) -> list[dict]:
    rng = random.Random(args.seed)
    turns: list[dict] = []
    t_start = time.monotonic()
    end = t_start + args.minutes * 60
    if args.deadline_s:
        end = min(end, BEGAN + args.deadline_s)
    while time.monotonic() < end:
        k = rng.randrange(len(ids))
        kid = ids[k]
        ws = server.connect(kid)
        before = server.states()
        restored = before[kid]["state"] != "running"
        try:
            out, first, done = run_cell(ws, codes[k].cell)
            ok = out == reference[k]
        except Exception as e:  # a lost turn is a result, not the end of the trace
            out, first, done, ok = f"error: {e}", float("nan"), float("nan"), False
        ws.close()
        after = server.states()
        victims = [v for v, s in after.items() if s["state"] == "suspended" and before[v]["state"] == "running"]
        turns.append({"at_s": round(time.monotonic() - t_start, 2), "kernel": k, "restored": restored, "first_s": first,
                      "done_s": done, "over_warm_s": first - warm[k], "victims": len(victims),
                      "for_room": sum(1 for v in victims if after[v].get("made_room_for") == kid),
                      "bytes_out": sum(moved(after[v]) for v in victims), "bytes_in": moved(before[kid]) if restored else 0,
                      "ok": ok, "store_bytes": store_bytes(store), "ram_available": psutil.virtual_memory().available,
                      **({} if ok else {"output": out[:2000]})})
        report.update(turns=turns, summary=summarize(turns, warm))
        print(f"turn {len(turns)}: user {k} {'restored' if restored else 'warm'} first output {first:.2f} s "
              f"(warm {warm[k]:.2f}), {len(victims)} suspended for it{'' if ok else ', LOST: ' + out[:200]}", flush=True)
        time.sleep(rng.uniform(0, args.think))
    return turns


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summarize(turns: list[dict], warm: list[float]) -> dict:
    """The trace's figures so far; the goals: p50 <= warm + 3 s, p95 <= warm + 8 s."""
    restored = [t for t in turns if t["restored"] and t["ok"]]
    first = [t["first_s"] for t in restored]
    over = [t["over_warm_s"] for t in restored]
    warm_p50 = statistics.median(warm) if warm else None
    p50, p95 = pct(first, 0.5), pct(first, 0.95)
    met = warm_p50 is not None and p50 is not None and p95 is not None
    return {"turns": len(turns), "minutes": turns[-1]["at_s"] / 60 if turns else 0.0, "restores": len(restored), "lost": sum(1 for t in turns if not t["ok"]),
            "suspended_for_room": sum(t["for_room"] for t in turns), "warm_p50_s": warm_p50,
            "warm_turns_p50_s": pct([t["first_s"] for t in turns if not t["restored"] and t["ok"]], 0.5),
            "restored_p50_s": p50, "restored_p95_s": p95, "over_warm_p50_s": pct(over, 0.5), "over_warm_p95_s": pct(over, 0.95),
            "goal_p50_met": met and p50 <= warm_p50 + 3, "goal_p95_met": met and p95 <= warm_p50 + 8,
            "bytes_written": sum(t["bytes_out"] for t in turns), "bytes_read": sum(t["bytes_in"] for t in turns),
            "store_bytes_max": max((t["store_bytes"] for t in turns), default=None),
            "ram_available_min": min((t["ram_available"] for t in turns), default=None)}


# -- the printed table -----------------------------------------------------------------------
def table(result: dict) -> list[str]:
    """The run's figures as printed at its end (or from a cut-off run's JSON: --report)."""
    plan, setup, s = result.get("plan") or {}, result.get("setup") or {}, result.get("summary") or {}
    out = [f"phase: {result.get('phase')}" + (f" ({result['error']})" if result.get("error") else "")]
    if plan:
        out.append(f"plan: {plan['kernels']} kernels, {plan['ratio']:.2f}x {plan['machine']['where']}, {plan['resident']} at once; "
                   f"store on {plan['machine']['store_medium']}")
    rows = setup.get("kernels") or []
    if rows:
        cold = [r["cold_s"] for r in rows if "cold_s" in r]
        made = sum(r["suspended_for_start"] for r in rows)
        for_build = sum(r.get("suspended_for_build", 0) for r in rows)
        took = f"{setup['seconds']:.1f} s" if "seconds" in setup else f"{setup.get('seconds_so_far', 0):.1f} s so far"
        out.append(f"setup: {len(cold)} of {plan.get('kernels', len(rows))} kernels in {took}; cold start (start + setup + "
                   f"first cell) p50 {_s(pct(cold, 0.5))}, max {_s(max(cold, default=None))}; {made} suspended by starts, "
                   f"{for_build} for a build's peak")
        if setup.get("held_max") is not None:
            out.append(f"declared {_gib(setup['declared'])} per kernel, the most one held {_gib(setup['held_max'])}; "
                       f"{setup['held_over_declared']} held more than declared")
    if s:
        out += [f"trace: {s['turns']} turns in {s.get('minutes', 0):.1f} min, {s['restores']} restored their kernel, {s['suspended_for_room']} kernels "
                f"suspended for room, {s['lost']} lost; moved {_gib(s['bytes_written'])} out, {_gib(s['bytes_read'])} in",
                f"first output after a restore: p50 {_s(s['restored_p50_s'])}, p95 {_s(s['restored_p95_s'])}; over the same "
                f"kernel's warm cell p50 {_s(s['over_warm_p50_s'])}, p95 {_s(s['over_warm_p95_s'])}; warm cell p50 "
                f"{_s(s['warm_p50_s'])} (turns that found their kernel running: {_s(s['warm_turns_p50_s'])})",
                f"goal p50 <= warm + 3 s: {'met' if s['goal_p50_met'] else 'NOT met'}; p95 <= warm + 8 s: "
                f"{'met' if s['goal_p95_met'] else 'NOT met'}; store at most {_gib(s['store_bytes_max'])}, host memory "
                f"available at least {_gib(s['ram_available_min'])}"]
    return out


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f} s"


def _gib(v: int | None) -> str:
    return "-" if v is None else f"{v / GiB:.2f} GiB"


def _torch(t: dict | None) -> str:
    return f" (PyTorch: {_gib(t['allocated'])} allocated, {_gib(t['reserved'])} reserved, at most {_gib(t['max_reserved'])})" if t else ""


# -- main ------------------------------------------------------------------------------------
def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=11)
    ap.add_argument("--model-b", type=float, default=8.0, help="billions of parameters per GPU kernel")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="prompt tokens whose KV cache each GPU kernel keeps")
    ap.add_argument("--gpu-overhead-gib", type=float, default=1.0,
                    help="declared beside the weights and KV cache: the CUDA context and PyTorch's cache")
    ap.add_argument("--build-peak-gib", type=float, default=2.0, help="free beside the declaration before a GPU build")
    ap.add_argument("--image-gib", type=float, default=2.0, help="plan: a GPU kernel's image beside its tensors")
    ap.add_argument("--rss-gib", type=float, default=2.0, help="plan: host memory of a running GPU kernel")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--deadline-s", type=float, default=0.0,
                    help="end the trace this many seconds after the bench began, if sooner than --minutes "
                         "(a run that must fit one call of a lent machine); the table says how long it ran")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--think", type=float, default=2.0, help="most seconds a user waits between two turns")
    ap.add_argument("--min-resident", type=float, default=0.0, help="c.GPUCR.min_resident_s")
    ap.add_argument("--headroom", type=float, default=0.0,
                    help="c.GPUCR.room_headroom in kernels' declarations (1: one kernel's room kept free ahead)")
    ap.add_argument("--host", action="store_true", help="CPU kernels under a host memory budget")
    ap.add_argument("--kernel-mib", type=int, default=1024, help="--host: MiB each kernel holds")
    ap.add_argument("--budget", default="", help="--host: c.GPUCR.host_memory_budget (default: half the kernels)")
    ap.add_argument("--gpu-free-gib", type=float, default=0.0, help="hold the rest of GPU 0 in another process")
    ap.add_argument("--store", default="")
    ap.add_argument("--json-out", default="", help="rewritten after every step; the server's log goes beside it")
    ap.add_argument("--plan-only", action="store_true", help="print the plan and stop (exit 3: it does not fit)")
    ap.add_argument("--report", default="", help="print the table of a run's JSON and stop")
    return ap.parse_args()


def main() -> int:
    args = arguments()
    if args.report:
        print("\n".join(table(json.loads(Path(args.report).read_text()))))
        return 0
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # cut off: the finally blocks still run
    work = Path(tempfile.mkdtemp(prefix="gpucr-room-"))
    store = Path(args.store) if args.store else work / "store"
    codes, size = kernels_and_size(args)
    filler = None
    # suspend_on_stop off: at the end the running kernels stop rather than all going to the store at once
    options = [f"--GPUCR.min_resident_s={args.min_resident}", "--GPUCR.suspend_on_stop=False",
               f"--GPUCR.room_headroom={int(args.headroom * size.declared)}"]
    if args.host:
        budget = parse_size(args.budget) if args.budget else size.declared * max(1, args.kernels // 2)
        options += [f"--GPUCR.host_memory_budget={budget}", f"--GPUCR.kernel_memory={size.declared}"]
        machine = measure(store, budget, budget, "the host memory budget", 0)
    else:
        options.append(f"--GPUCR.kernel_gpu_memory={size.declared}")
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", ALLOC_CONF)  # the server's kernels inherit it
        if args.gpu_free_gib:
            filler = hold_gpu(args.gpu_free_gib)
        gpu0 = gpus.list_gpus()[0]
        total = gpu0.memory_free if filler else gpu0.memory_total  # with the filler: what it leaves
        machine = measure(store, gpu0.memory_free, total, f"GPU 0 ({gpu0.name})", GPU_MARGIN)
    plan = Plan(args.kernels, size, machine, overhead=GiB // 2 if args.host else 2 * GiB)
    report = Report(args.json_out)
    report.update(phase="plan", pid=os.getpid(), args=vars(args), plan=plan.as_dict())
    print("\n".join(f"plan: {line}" for line in plan.lines()), flush=True)
    if plan.ratio < 1.5:
        print(f"note: the kernels declare {plan.ratio:.2f}x the room, under 1.5x", flush=True)
    problems = plan.problems()
    if any(store.iterdir()):  # a server started on it would bring back the kernels it holds
        problems.append(f"the store {store} holds an earlier run's files: delete it or pick another")
    if problems:
        print("refusing to start: " + "; ".join(problems), flush=True)
        report.update(phase="refused", error="; ".join(problems))
        _stop_filler(filler)
        shutil.rmtree(work, ignore_errors=True)
        return REFUSED
    if args.plan_only:
        _stop_filler(filler)
        shutil.rmtree(work, ignore_errors=True)
        return 0
    log = Path(args.json_out).with_suffix(".server.log") if args.json_out else work / "server.log"
    server = RoomServer(work, store, log, tuple(options))
    report.update(phase="setup", server_pid=server.proc.pid, server_log=str(log))
    try:
        # GPU: one kernel fewer than fit side by side, and room for a build's peak (the prefill's activations)
        together = plan.resident if args.host else plan.resident - 1
        build_room = 0 if args.host else size.declared + int(args.build_peak_gib * GiB)
        ids, rows = set_up(server, codes, max(1, together), not args.host, size.declared, build_room, report)
        for place in server.rest("api/gpucr/room"):
            print(f"{place['where']}: {place['free'] / GiB:.1f} GiB free, kernels hold "
                  f"{[round(k['bytes'] / GiB, 2) for k in place['kernels']]} GiB", flush=True)
        warm, reference = [r["warm_s"] for r in rows], [r["output"] for r in rows]
        report.update(phase="trace", warm=warm)
        turns = trace(server, ids, codes, reference, warm, args, store, report)
        report.update(phase="done", turns=turns, summary=summarize(turns, warm))
    except BaseException as e:
        report.update(phase="interrupted" if isinstance(e, (KeyboardInterrupt, SystemExit)) else "failed",
                      error=f"{type(e).__name__}: {e}"[-2000:])
        raise
    finally:
        print("\n" + "\n".join(table(report.data)), flush=True)
        server.stop()
        _stop_filler(filler)
        report.update(server_stopped=True, network_locks_dropped=len(release_network_locks(store)))
        shutil.rmtree(store, ignore_errors=True)  # no one restores its kernels
        if args.json_out:  # its log is beside the JSON
            shutil.rmtree(work, ignore_errors=True)
    return 1 if report.data["summary"]["lost"] else 0


def release_network_locks(store: Path) -> list[str]:
    """The CRIU network locks of the store's dumps: no one restores them once the server is gone,
    and the host holds 1024 at most."""
    return drop_network_locks([p.parent for p in store.rglob("inventory.img")])


def _stop_filler(filler: subprocess.Popen | None) -> None:
    if filler is not None:
        filler.kill()
        filler.wait()


if __name__ == "__main__":
    sys.exit(main())

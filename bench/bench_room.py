"""GPU memory as a cache: more kernels than the GPU (or the host memory budget) holds, users taking
turns, gpucr making room by suspending the least recently used idle kernels.

    python bench/bench_room.py --kernels 6 --model-b 8 --kv-tokens 8192 --minutes 10 --seed 0 --store /dev/shm/gpucr-room
    python bench/bench_room.py --kernels 4 --model-b 1 --gpu-free-gib 12 --minutes 2 --store /dev/shm/gpucr-room
    python bench/bench_room.py --host --kernels 6 --kernel-mib 1024 --budget 3GiB --minutes 2 --store /tmp/gpucr-room

A jupyter server with gpucr runs as a separate process. Each kernel builds its state (GPU: a
Llama-architecture model of --model-b billion parameters with random bf16 weights on cuda:0 and the
KV cache of a --kv-tokens prompt; --host: --kernel-mib of bytes) and runs its cell twice, the second
time warm: that output is the reference and that time the warm figure. Kernels declare what they
take (c.GPUCR.kernel_gpu_memory, or kernel_memory with --host), so a start that finds no room makes
it too. Then, for --minutes, a seeded trace: a random user runs their cell, thinks up to --think
seconds, and so on. Printed: p50/p95 from "run cell" to its first output for the turns that
restored their kernel against the warm cell, bytes moved (checkpoints written and read, offloaded
tensors included), the kernels suspended for room, lost outputs (any output other than the
reference, or an error) and the store's medium. --gpu-free-gib: another process holds the rest of
GPU 0 (real memory, real NVML figures), to run the trace with smaller models. --json-out FILE.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import websocket  # websocket-client, a jupyter_server dependency

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_w2 import TOKEN, Server  # noqa: E402
from bench_w2 import run_cell as w2_run_cell  # noqa: E402

from jupyter_gpucr.core import gpus  # noqa: E402
from jupyter_gpucr.core.sizes import parse_size  # noqa: E402

GiB = 1 << 30
FILLER = "import sys, torch\nx = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device='cuda:0')\nprint('ok', flush=True)\nsys.stdin.read()\n"


class RoomServer(Server):
    def connect(self, kernel_id: str) -> websocket.WebSocket:
        """A new connection to the kernel, as a reopened notebook makes."""
        return websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}",
            header=[f"Authorization: token {TOKEN}"], timeout=3600)


def llama_shape(billions: float) -> dict[str, int]:
    """A Llama-3-8B-shaped config with as many layers as make about ``billions`` parameters."""
    hidden, inter, vocab, kv_heads, heads = 4096, 14336, 128256, 8, 32
    per_layer = 2 * hidden * hidden + 2 * hidden * (hidden // heads * kv_heads) + 3 * hidden * inter
    layers = max(1, round((billions * 1e9 - 2 * vocab * hidden) / per_layer))
    return {"hidden_size": hidden, "intermediate_size": inter, "vocab_size": vocab, "num_key_value_heads": kv_heads,
            "num_attention_heads": heads, "num_hidden_layers": layers}


def gpu_code(billions: float, kv_tokens: int, seed: int) -> tuple[str, str, int]:
    """Setup, cell, and the GPU bytes the kernel is declared to take."""
    shape = llama_shape(billions)
    params = 2 * shape["vocab_size"] * shape["hidden_size"] + shape["num_hidden_layers"] * (
        4 * shape["hidden_size"] ** 2 + 3 * shape["hidden_size"] * shape["intermediate_size"])
    kv = shape["num_hidden_layers"] * 2 * shape["num_key_value_heads"] * 128 * kv_tokens * 2
    setup = f"""
import hashlib, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed({seed})
cfg = LlamaConfig(max_position_embeddings={max(kv_tokens, 4096)}, **{shape!r})
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda:0"):
    model = LlamaForCausalLM(cfg).eval()
torch.set_default_dtype(torch.float32)
prompt = torch.randint(0, cfg.vocab_size, (1, {kv_tokens}), device="cuda:0", generator=torch.Generator("cuda:0").manual_seed({seed}))
with torch.no_grad():
    kv = model.model(prompt, use_cache=True).past_key_values
torch.cuda.empty_cache()
"""
    cell = """
with torch.no_grad():
    out = model.generate(prompt[:, :16], max_new_tokens=16, min_new_tokens=16, do_sample=False)
print(hashlib.sha256(str(out[0, -16:].tolist()).encode()).hexdigest()[:16])
"""
    return setup, cell, int(params * 2 + kv + 3 * GiB)


def host_code(mib: int, seed: int) -> tuple[str, str, int]:
    data = mib * (1 << 20) - (96 << 20)  # the kernel's own baseline is the rest
    setup = f"import hashlib, random\nb = random.Random({seed}).randbytes(1 << 20) * {data >> 20}\n"
    cell = "print(hashlib.sha256(b[::4096]).hexdigest()[:16])\n"
    return setup, cell, mib << 20


def run_cell(ws, source: str) -> tuple[str, float, float]:
    """Output, seconds to its first output, seconds to the reply and idle."""
    timing: dict[str, float] = {}
    out = w2_run_cell(ws, source, timing)
    return out, timing["first_output_s"], timing["done_s"]


def medium(path: Path) -> str:
    """The file system and device the store is on, as a person reads it."""
    path.mkdir(parents=True, exist_ok=True)
    best = max((p for p in psutil.disk_partitions(all=True) if str(path.resolve()).startswith(p.mountpoint)),
               key=lambda p: len(p.mountpoint), default=None)
    return f"{best.fstype} ({best.device} at {best.mountpoint})" if best else "unknown"


def moved(state: dict) -> int:
    """Bytes a suspend wrote (or a restore read): the checkpoint and the tensors offloaded beside it."""
    offload = ((state.get("trim") or {}).get("offload") or {}).get("bytes", 0)
    return int((state.get("checkpoint") or {}).get("size") or 0) + int(offload)


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernels", type=int, default=6)
    ap.add_argument("--model-b", type=float, default=8.0, help="billions of parameters per GPU kernel")
    ap.add_argument("--kv-tokens", type=int, default=8192, help="prompt tokens whose KV cache each GPU kernel keeps")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--think", type=float, default=2.0, help="most seconds a user waits between two turns")
    ap.add_argument("--min-resident", type=float, default=0.0, help="c.GPUCR.min_resident_s")
    ap.add_argument("--host", action="store_true", help="CPU kernels under a host memory budget")
    ap.add_argument("--kernel-mib", type=int, default=1024, help="--host: MiB each kernel holds")
    ap.add_argument("--budget", default="", help="--host: c.GPUCR.host_memory_budget (default: half the kernels)")
    ap.add_argument("--gpu-free-gib", type=float, default=0.0, help="hold the rest of GPU 0 in another process")
    ap.add_argument("--store", default="")
    ap.add_argument("--json-out", default="")
    args = ap.parse_args()

    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="gpucr-room-"))
    store = Path(args.store) if args.store else work / "store"
    options = [f"--GPUCR.min_resident_s={args.min_resident}"]
    codes = []
    for k in range(args.kernels):
        if args.host:
            codes.append(host_code(args.kernel_mib, args.seed * 1000 + k))
        else:
            codes.append(gpu_code(args.model_b, args.kv_tokens, args.seed * 1000 + k))
    declared = codes[0][2]
    filler = None
    if args.host:
        budget = parse_size(args.budget) if args.budget else declared * max(1, args.kernels // 2)
        options += [f"--GPUCR.host_memory_budget={budget}", f"--GPUCR.kernel_memory={declared}"]
        capacity, where = budget, "host memory budget"
    else:
        options.append(f"--GPUCR.kernel_gpu_memory={declared}")
        gpu0 = gpus.list_gpus()[0]
        capacity, where = gpu0.memory_free, f"GPU 0 ({gpu0.name})"
        if args.gpu_free_gib:
            hold = gpu0.memory_free - int(args.gpu_free_gib * GiB) - GiB // 2  # its own context besides
            filler = subprocess.Popen([sys.executable, "-c", FILLER, str(hold)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True)
            assert filler.stdout is not None and filler.stdout.readline().strip() == "ok"
            time.sleep(1)
            capacity = gpus.list_gpus()[0].memory_free
    ratio = args.kernels * declared / capacity
    print(f"{args.kernels} kernels declaring {declared / GiB:.1f} GiB each on {where} with {capacity / GiB:.1f} GiB: "
          f"{ratio:.2f}x; store {store} on {medium(store)}", flush=True)
    if ratio < 1.5:
        print("note: the kernels' state is under 1.5x the room; add --kernels or --gpu-free-gib", flush=True)
    server = RoomServer(work, store, work / "server.log", tuple(options))
    result: dict = {"args": vars(args), "declared": declared, "capacity": capacity, "ratio": ratio,
                    "store_medium": medium(store)}
    try:
        kernels, warm, reference = [], [], []
        for k, (setup, cell, _) in enumerate(codes):
            t0 = time.perf_counter()
            kid, ws = server.kernel(f"user{k}.ipynb")
            run_cell(ws, setup)
            run_cell(ws, cell)
            out, first, _ = run_cell(ws, cell)
            kernels.append((kid, ws))
            warm.append(first)
            reference.append(out)
            print(f"kernel {k}: set up in {time.perf_counter() - t0:.1f} s, warm cell {first:.2f} s -> {out}", flush=True)
        for place in server.rest("api/gpucr/room"):
            print(f"{place['where']}: {place['free'] / GiB:.1f} GiB free, kernels hold "
                  f"{[round(k['bytes'] / GiB, 1) for k in place['kernels']]} GiB", flush=True)
        for _, ws in kernels:
            ws.close()  # a connection per turn: the server drops the ones idle past its ping timeout
        turns, lost, written, read, for_room = [], 0, 0, 0, 0
        end = time.monotonic() + args.minutes * 60
        while time.monotonic() < end:
            k = rng.randrange(args.kernels)
            kid = kernels[k][0]
            ws = server.connect(kid)
            before = {s["kernel_id"]: s for s in server.rest("api/gpucr/kernels")}
            restored = before[kid]["state"] != "running"
            try:
                out, first, done = run_cell(ws, codes[k][1])
                ok = out == reference[k]
            except Exception as e:  # a lost turn is a result, not the end of the trace
                out, first, done, ok = f"error: {e}", float("nan"), float("nan"), False
            ws.close()
            after = {s["kernel_id"]: s for s in server.rest("api/gpucr/kernels")}
            victims = [v for v, s in after.items() if s["state"] == "suspended" and before[v]["state"] == "running"]
            written += sum(moved(after[v]) for v in victims)
            read += moved(before[kid]) if restored else 0
            for_room += sum(1 for v in victims if after[v].get("made_room_for") == kid)
            lost += not ok
            turns.append({"kernel": k, "restored": restored, "first_s": first, "done_s": done, "victims": len(victims),
                          "ok": ok})
            print(f"turn {len(turns)}: user {k} {'restored' if restored else 'warm'} first output {first:.2f} s "
                  f"(warm {warm[k]:.2f}), {len(victims)} suspended for it{'' if ok else ', LOST: ' + out[:200]}", flush=True)
            time.sleep(rng.uniform(0, args.think))
        cold = [t["first_s"] for t in turns if t["restored"] and t["ok"]]
        warm_p50 = statistics.median(warm)
        summary = {"turns": len(turns), "restores": len(cold), "suspended_for_room": for_room, "lost": lost,
                   "warm_p50_s": warm_p50, "restored_p50_s": pct(cold, 0.5), "restored_p95_s": pct(cold, 0.95),
                   "bytes_written": written, "bytes_read": read}
        result.update(summary, turn_log=turns, warm=warm)
        p50, p95 = summary["restored_p50_s"], summary["restored_p95_s"]
        print(f"\n{len(turns)} turns in {args.minutes:g} min, {len(cold)} restored their kernel, {for_room} kernels "
              f"suspended for room, {lost} lost; moved {written / GiB:.1f} GiB out and {read / GiB:.1f} GiB in; "
              f"store on {result['store_medium']}")
        if p50 is not None and p95 is not None:
            print(f"first output after a restore: p50 {p50:.2f} s, p95 {p95:.2f} s; warm cell p50 {warm_p50:.2f} s; "
                  f"goal p50 <= warm + 3 s: {'met' if p50 <= warm_p50 + 3 else 'NOT met'}, "
                  f"p95 <= warm + 8 s: {'met' if p95 <= warm_p50 + 8 else 'NOT met'}")
    finally:
        server.stop()
        if filler is not None:
            filler.kill()
            filler.wait()
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    return 1 if result.get("lost") else 0


if __name__ == "__main__":
    sys.exit(main())

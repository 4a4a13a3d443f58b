"""Connect-to-first-byte of an agent that its waker paused when idle: the client connects to the
checkpointed process's port and waits for the restored process's answer. The agent holds ``--gb``
GiB of CPU memory (and ``--gpu-gb`` GB on cuda:0 with PyTorch where there is one; skipped
otherwise); its checkpoint is read from the page cache (it was just written). Prints, per round, the
first byte, the restore inside it, the GPU's share of the restore and the rest (the GPU-free part).

    python bench/bench_wake.py [--gb 1] [--gpu-gb 0] [--rounds 5] [--store /tmp/gpucr-wake]
"""
from __future__ import annotations

import argparse
import json
import platform
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr import Checkpointer  # noqa: E402
from jupyter_gpucr.core.pausing.activation import WakeOn  # noqa: E402
from jupyter_gpucr.core.pausing.waker import read_status, start_waker  # noqa: E402

AGENT = """
import os, socket, sys
gb, gpu_gb, port = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
state = bytearray(os.urandom(1 << 20)) * int(gb * 1024)
if gpu_gb:
    import torch
    held = torch.ones(int(gpu_gb * 2**30) // 4, device="cuda:0")
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", port)); s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept(); c.recv(16); c.sendall(b"%d\\n" % len(state)); c.close()
"""


def first_byte(port: int) -> float:
    t0 = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=120) as c:
        c.sendall(b"hi")
        assert c.recv(64)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--gpu-gb", type=float, default=0.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--store", default="/tmp/gpucr-wake")
    args = ap.parse_args()
    if args.gpu_gb:
        try:
            import torch
            if not torch.cuda.is_available():
                raise ImportError("no CUDA device")
        except ImportError as e:
            print(f"--gpu-gb skipped: {e}")
            args.gpu_gb = 0.0
    shutil.rmtree(args.store, ignore_errors=True)
    cr = Checkpointer(args.store)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    name = "wake"
    cr.run(name, [sys.executable, "-c", AGENT, str(args.gb), str(args.gpu_gb), str(port)])
    log = cr.store.proc_dir(name) / "stdout.log"
    while "ready" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    start_waker(cr.store, name, [WakeOn.parse(f"tcp:127.0.0.1:{port}")], 1.0)
    print(f"# {time.strftime('%Y-%m-%d')} {platform.node()} {platform.processor() or platform.machine()}, "
          f"agent {args.gb:g} GiB CPU + {args.gpu_gb:g} GB GPU; {' '.join(sys.argv)}")
    print(f"{'round':>5} {'first byte s':>12} {'restore s':>10} {'gpu s':>7} {'GPU-free s':>10}")
    try:
        for i in range(args.rounds):
            while cr.status(name)["state"] != "checkpointed" or (read_status(cr.store, name) or {}).get("state") != "idle":
                time.sleep(0.1)
            took = first_byte(port)
            wake = (read_status(cr.store, name) or {}).get("last_wake", {})
            gpu = wake.get("gpu_restore", 0.0)
            print(f"{i + 1:>5} {took:>12.3f} {wake.get('total', float('nan')):>10.3f} {gpu:>7.3f} {took - gpu:>10.3f}")
            print("      restore split: " + json.dumps({k: round(v, 3) for k, v in wake.items()}))
    finally:
        subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", args.store, "rm", "--kill", name],
                       capture_output=True)


if __name__ == "__main__":
    main()

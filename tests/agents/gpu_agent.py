"""A PyTorch worker holding a known tensor on the GPU; it keeps computing on it and reports
(counter, checksum of the tensor computed on the GPU, device UUID) over a TCP socket. With
GPU_AGENT_FORKS=1 a thread also forks a short-lived child every 10 ms (as a monitoring thread
running a command does)."""
import json
import os
import socket
import sys
import threading
import time

import torch

GIB = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
torch.manual_seed(0)
base = torch.rand(int(GIB * (1 << 30) // 4), device="cuda")
work = torch.zeros(1 << 20, device="cuda")
state = {"counter": 0}
lock = threading.Lock()


def checksum() -> float:
    # In 256 MiB pieces: summing the whole tensor as float64 would cache twice its size.
    return sum(float(chunk.double().sum().item()) for chunk in base.split(1 << 26))


def serve(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        with lock:
            reply = {"counter": state["counter"], "checksum": checksum(), "pid": os.getpid(),
                     "uuid": str(torch.cuda.get_device_properties(0).uuid), "work": float(work.sum().item())}
        conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.close()


def fork_often() -> None:
    while True:
        child = os.fork()
        if child == 0:
            os._exit(0)
        os.waitpid(child, 0)
        time.sleep(0.01)


if os.environ.get("GPU_AGENT_FORKS") == "1":
    threading.Thread(target=fork_often, daemon=True).start()
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 0))
server.listen()
threading.Thread(target=serve, args=(server,), daemon=True).start()
print(json.dumps({"port": server.getsockname()[1], "checksum": checksum()}), flush=True)
while True:
    with lock:
        work += 1
        torch.cuda.synchronize()
        state["counter"] += 1
    time.sleep(0.05)

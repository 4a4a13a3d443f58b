"""An agent-like worker for the checkpoint tests: state in memory, a thread, a file it
appends to and a listening TCP socket that reports (counter, checksum of the state, pid)."""
import hashlib
import json
import os
import socket
import sys
import threading
import time

import numpy as np

MB = int(sys.argv[1]) if len(sys.argv) > 1 else 300
state = {"counter": 0, "notes": {"model": "demo", "history": list(range(1000))}}
array = np.random.default_rng(7).random(MB * (1 << 20) // 8)
lock = threading.Lock()


def checksum() -> str:
    h = hashlib.sha256(array.tobytes())
    h.update(json.dumps(state["notes"], sort_keys=True).encode())
    return h.hexdigest()


def serve(server: socket.socket) -> None:
    while True:
        conn, _ = server.accept()
        with lock:
            reply = {"counter": state["counter"], "checksum": checksum(), "pid": os.getpid()}
        conn.sendall(json.dumps(reply).encode() + b"\n")
        conn.close()


server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers do; see docs/limitations.md
server.bind(("127.0.0.1", 0))
server.listen()
threading.Thread(target=serve, args=(server,), daemon=True).start()
out = open(os.environ["AGENT_FILE"], "a")
print(json.dumps({"port": server.getsockname()[1], "checksum": checksum()}), flush=True)
while True:
    with lock:
        state["counter"] += 1
        out.write(f"{state['counter']}\n")
        out.flush()
    time.sleep(0.05)

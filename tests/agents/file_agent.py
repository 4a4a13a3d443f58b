"""A process that holds files the way an attacker's would: one open read-write (``--hold``), one
mapped shared and writable (``--map``), a listening TCP port (``--port``, 0 for any); each
connection gets what it reads through them now, and the held file read again by its path:
{"held": ..., "held_by_path": ..., "mapped": ..., "pid": ...}."""
import argparse
import json
import mmap
import os
import socket

parser = argparse.ArgumentParser()
parser.add_argument("--hold")
parser.add_argument("--map")
parser.add_argument("--port", type=int, default=0)
args = parser.parse_args()
held = os.open(args.hold, os.O_RDWR) if args.hold else None
mapped = None
if args.map:
    with open(args.map, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 0)


def read_by_path(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


server = socket.socket()
server.bind(("127.0.0.1", args.port))
server.listen()
print(json.dumps({"port": server.getsockname()[1], "pid": os.getpid()}), flush=True)
while True:
    conn, _ = server.accept()
    reply = {"held": os.pread(held, 4096, 0).decode(errors="replace") if held is not None else None,
             "held_by_path": read_by_path(args.hold) if args.hold else None,
             "mapped": mapped[:64].decode(errors="replace") if mapped is not None else None, "pid": os.getpid()}
    conn.sendall(json.dumps(reply).encode() + b"\n")
    conn.close()

"""A process that holds files and sockets the way an attacker's would: a file open read-write
(``--hold``), one mapped shared and writable (``--map``), one only as a descriptor in flight in a
unix socket's queue (``--in-flight``: sent with SCM_RIGHTS, never received), a listening TCP port
(``--port``, 0 for any; ``--reuseport`` asks for SO_REUSEPORT), a unix listener (``--unix``), a
UDP socket (``--udp``) and inotify instances (``--inotify N``). Each connection to the TCP port
gets what it reads through them now, and the held file read again by its path: {"held": ...,
"held_by_path": ..., "mapped": ..., "in_flight": ..., "udp_port": ..., "inotify": ..., "pid": ...}."""
import argparse
import ctypes
import json
import mmap
import os
import socket

parser = argparse.ArgumentParser()
parser.add_argument("--hold")
parser.add_argument("--map")
parser.add_argument("--in-flight")
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--reuseport", action="store_true")
parser.add_argument("--unix")
parser.add_argument("--udp", action="store_true")
parser.add_argument("--inotify", type=int, default=0)
args = parser.parse_args()
held = os.open(args.hold, os.O_RDWR) if args.hold else None
mapped = None
if args.map:
    with open(args.map, "r+b") as f:
        mapped = mmap.mmap(f.fileno(), 0)
flight = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM) if args.in_flight else None
if flight and args.in_flight:
    fd = os.open(args.in_flight, os.O_RDWR)
    socket.send_fds(flight[0], [b"f"], [fd])
    os.close(fd)
unix = socket.socket(socket.AF_UNIX) if args.unix else None
if unix is not None:
    unix.bind(args.unix)
    unix.listen()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM) if args.udp else None
if udp is not None:
    udp.bind(("127.0.0.1", 0))
libc = ctypes.CDLL(None, use_errno=True)
watches = [libc.inotify_init1(os.O_CLOEXEC) for _ in range(args.inotify)]
assert all(w >= 0 for w in watches), os.strerror(ctypes.get_errno())


def read_by_path(path: str) -> str | None:
    try:
        with open(path, errors="replace") as f:
            return f.read(4096)
    except OSError:
        return None


def read_in_flight() -> str | None:
    """Receive the descriptor in flight, read through it, and send it on again."""
    if flight is None:
        return None
    _, fds, _, _ = socket.recv_fds(flight[1], 1, 1)
    try:
        return os.pread(fds[0], 4096, 0).decode(errors="replace")
    finally:
        socket.send_fds(flight[0], [b"f"], fds)
        os.close(fds[0])


server = socket.socket()
if args.reuseport:
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
server.bind(("127.0.0.1", args.port))
server.listen()
print(json.dumps({"port": server.getsockname()[1], "pid": os.getpid(),
                  "udp_port": udp.getsockname()[1] if udp else None}), flush=True)
while True:
    conn, _ = server.accept()
    reply = {"held": os.pread(held, 4096, 0).decode(errors="replace") if held is not None else None,
             "held_by_path": read_by_path(args.hold) if args.hold else None,
             "mapped": mapped[:64].decode(errors="replace") if mapped is not None else None,
             "in_flight": read_in_flight(), "inotify": len(watches), "pid": os.getpid()}
    conn.sendall(json.dumps(reply).encode() + b"\n")
    conn.close()

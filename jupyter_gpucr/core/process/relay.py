"""The way into a fork's own network namespace: TCP ports on the host that lead to its ports inside.

A fork is restored while its source still runs, with the same listening ports; on the host they
are taken, so each fork is restored into a network namespace of its own (``unshare --net``, only
``lo`` in it). The holder of that namespace (PID 1 of the fork's namespaces) runs this relay:
the launcher bound the fork's host ports before the holder started and handed the listening
sockets down; the holder, already inside the fork's namespace, accepts on them and connects each
accepted connection to ``127.0.0.1:PORT`` (or ``::1``) inside, copying bytes both ways. No
``setns``: the sockets keep the namespace they were made in. The relay lives in the holder, so it
ends with the fork.

Standard library only: the holder runs as a plain script and loads this file by path.
"""
from __future__ import annotations

import fcntl
import socket
import struct
import threading

_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
_CHUNK = 1 << 16


def bring_lo_up() -> None:
    """A new network namespace has ``lo`` down: nothing could bind or reach 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack_from("16sH", fcntl.ioctl(s.fileno(), _SIOCGIFFLAGS, ifreq))[1]
        fcntl.ioctl(s.fileno(), _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


class _Link:
    """One relayed connection: two pumps, and both sockets closed once both pumps ended."""

    def __init__(self, outside: socket.socket, inside: socket.socket) -> None:
        self.sockets = (outside, inside)
        self._left = 2
        self._lock = threading.Lock()
        for src, dst in ((outside, inside), (inside, outside)):
            threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        """Copy until ``src`` ends, then end ``dst``'s sending side (the other direction goes on)."""
        try:
            while data := src.recv(_CHUNK):
                dst.sendall(data)
        except OSError:
            pass
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            for s in self.sockets:
                s.close()


def _connect_inside(family: int, port: int) -> socket.socket:
    inside = socket.socket(family, socket.SOCK_STREAM)
    try:
        inside.connect(("::1" if family == socket.AF_INET6 else "127.0.0.1", port))
    except OSError:
        inside.close()
        raise
    return inside


def _serve(listener: socket.socket, port: int) -> None:
    while True:
        try:
            outside, _ = listener.accept()
        except OSError:
            return
        try:
            inside = _connect_inside(listener.family, port)
        except OSError:  # nothing listens inside (yet, or any more): the client sees its connection end
            outside.close()
            continue
        _Link(outside, inside)


def start(routes: list[tuple[int, int]]) -> None:
    """Serve each ``(listening socket fd, port inside)`` on a thread of its own."""
    for fd, port in routes:
        listener = socket.socket(fileno=fd)
        threading.Thread(target=_serve, args=(listener, port), name=f"relay-{port}", daemon=True).start()

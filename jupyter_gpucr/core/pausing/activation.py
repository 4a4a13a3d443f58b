"""Socket activation for processes that bind their own ports: the listening sockets outlive the
process while it is checkpointed, so a client that connects then waits instead of being refused.

systemd binds a service's sockets itself and hands them over (``LISTEN_FDS``). A process started
with ``gpucr run`` binds its own, so gpucr takes a second reference to each of the process's own
listening sockets (``pidfd_getfd``). When the process is dumped and gone, that socket stays open,
bound and listening: connections made during the dump and afterwards queue on it exactly as they
did before. A TCP socket gets ``SO_REUSEPORT`` before the dump, so the image records it and CRIU's
restore binds the same port beside the held socket; the kernel is then told (a one-instruction
reuseport BPF program) to give every new connection to the restored socket, the few connections
queued on the held one are relayed to the restored process, and the held socket is closed. CRIU
binds a restored UNIX socket after unlinking its path, so new clients reach the restored socket
and the held one only drains. No connection is refused or reset at any point.
"""
from __future__ import annotations

import ctypes
import os
import select
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil

from ..errors import StateError
from ..process.procs import tree

_SYS_PIDFD_GETFD = 438
_SO_ATTACH_REUSEPORT_CBPF = 51
_BPF_RET_K = 0x06
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class WakeOn:
    """Where a paused process is woken: ``tcp:HOST:PORT`` or ``unix:PATH``."""

    kind: str
    host: str = ""
    port: int = 0
    path: str = ""

    @classmethod
    def parse(cls, text: str) -> WakeOn:
        kind, _, rest = text.partition(":")
        if kind == "unix" and rest.startswith("/"):
            return cls("unix", path=rest)
        host, _, port = rest.rpartition(":")
        if kind == "tcp" and port.isdigit() and 0 < int(port) < 65536:
            return cls("tcp", host=host.strip("[]") or "0.0.0.0", port=int(port))
        raise StateError(f"Cannot read the wake address {text!r}.",
                         "Write tcp:HOST:PORT (tcp:127.0.0.1:8000) or unix:/absolute/path.")

    def __str__(self) -> str:
        return f"unix:{self.path}" if self.kind == "unix" else f"tcp:{self.host}:{self.port}"

    def matches(self, laddr: object) -> bool:
        """Whether a socket bound to ``laddr`` (psutil's) listens on this address."""
        if self.kind == "unix":
            return laddr == self.path
        ip, port = getattr(laddr, "ip", None), getattr(laddr, "port", None)
        return port == self.port and (ip == self.host or self.host in ("0.0.0.0", "::") or ip in ("0.0.0.0", "::"))

    def connect(self, timeout: float = 10.0) -> socket.socket:
        """A connection to whatever listens here now (the restored process, once it is steered)."""
        if self.kind == "unix":
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(timeout)
            s.connect(self.path)
            return s
        host = {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return socket.create_connection((host, self.port), timeout=timeout)


def _pidfd_getfd(pid: int, fd: int) -> int:
    pidfd = os.pidfd_open(pid)
    try:
        got = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, fd, 0)
    finally:
        os.close(pidfd)
    if got < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"pidfd_getfd of fd {fd} of PID {pid}: {os.strerror(err)}")
    return got


def find_listeners(pid: int, wake_on: list[WakeOn]) -> dict[WakeOn, tuple[int, int]]:
    """Which process of the tree at ``pid`` listens on each address, and on which fd."""
    found: dict[WakeOn, tuple[int, int]] = {}
    for p in tree(pid):
        try:
            conns = psutil.Process(p).net_connections("all")
        except psutil.Error:
            continue
        for c in conns:
            listening = c.status == psutil.CONN_LISTEN or (c.family == socket.AF_UNIX and not c.raddr)
            for w in wake_on:
                if listening and w not in found and c.fd >= 0 and w.matches(c.laddr):
                    found[w] = (p, c.fd)
    return found


def hold(pid: int, fd: int, w: WakeOn) -> socket.socket:
    """This process's own reference to the listening socket ``fd`` of ``pid``; a TCP one is made
    ``SO_REUSEPORT`` (the process's socket too: it is the same socket) so its restore can bind beside it."""
    s = socket.socket(fileno=_pidfd_getfd(pid, fd))
    if w.kind == "tcp":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    return s


def bind_anew(w: WakeOn, listen: bool = True) -> socket.socket:
    """A socket bound to ``w`` for a waker that starts while its process is checkpointed (it was
    restarted): the process's own socket is gone with the waker that held it. ``listen=False`` only
    reserves the address: connections go to the restored process's socket alone, never into a queue
    nobody accepts from (another server on the same store may hold the same port)."""
    if w.kind == "unix":
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        Path(w.path).unlink(missing_ok=True)
        s.bind(w.path)
    else:
        s = socket.socket(socket.AF_INET6 if ":" in w.host else socket.AF_INET, socket.SOCK_STREAM)
        if listen:  # a bound socket with SO_REUSEADDR reserves nothing from another SO_REUSEADDR bind
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind((w.host, w.port))
    if listen:
        s.listen(128)
    return s


def steer_to_restored(held: socket.socket) -> None:
    """New connections go to the socket the restore bound beside ``held`` (the second of their
    reuseport group); once ``held`` is closed the kernel falls back to the one socket left."""
    if held.family == socket.AF_UNIX:
        return
    insn = ctypes.create_string_buffer(struct.pack("HBBI", _BPF_RET_K, 0, 0, 1))
    held.setsockopt(socket.SOL_SOCKET, _SO_ATTACH_REUSEPORT_CBPF, struct.pack("HL", 1, ctypes.addressof(insn)))


def pending(held: list[socket.socket], timeout: float = 0.0) -> bool:
    """Whether a connection waits to be accepted on any held socket."""
    return bool(held) and bool(select.select(held, [], [], timeout)[0])


def drain(held: socket.socket, quiet: float = 0.2) -> Iterator[socket.socket]:
    """Accept every connection queued on ``held``, until none came for ``quiet`` seconds; each is
    handed on as it is accepted, so the first is served without waiting out the quiet time."""
    while pending([held], quiet):
        try:
            conn, _ = held.accept()
        except BlockingIOError:
            continue
        yield conn


def relay(client: socket.socket, w: WakeOn) -> None:
    """Serve ``client`` (accepted by the waker while the process slept) by the restored process:
    bytes are copied both ways on two threads until both sides closed."""
    try:
        upstream = w.connect()
    except OSError:
        client.close()
        raise
    for s in (client, upstream):
        s.settimeout(None)

    def pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
    client.close()
    upstream.close()


def open_connections(wake_on: list[WakeOn]) -> int:
    """How many connections to these addresses are established (a client still talking)."""
    tcp_ports = {w.port for w in wake_on if w.kind == "tcp"}
    paths = {w.path for w in wake_on if w.kind == "unix"}
    n = 0
    for c in psutil.net_connections("tcp") if tcp_ports else []:
        if c.status == psutil.CONN_ESTABLISHED and c.laddr and c.laddr.port in tcp_ports:
            n += 1
    if paths:
        n += _connected_unix(paths)
    return n


def _connected_unix(paths: set[str]) -> int:
    """Connected (state 03) UNIX sockets named after one of ``paths``: accepted connections carry
    their listener's name in /proc/net/unix."""
    n = 0
    with open("/proc/net/unix") as f:
        next(f)
        for line in f:
            parts = line.split()
            if len(parts) >= 8 and parts[5] == "03" and parts[7] in paths:
                n += 1
    return n


def cpu_seconds(pid: int) -> float:
    """CPU time used so far by the tree at ``pid`` (threads and children included)."""
    total = 0.0
    for p in tree(pid):
        try:
            t = psutil.Process(p).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total

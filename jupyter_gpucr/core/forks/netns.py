"""The host side of a fork's network namespace: which of its ports are relayed, and on which host ports.

A fork keeps the ports its source listened on, inside a network namespace of its own (see
``process/relay.py``); its record says where each is reached on the host (``netns.relay``: host address,
host port, port inside). The host ports stay the fork's through its later suspends and restores,
so a client (a kernel's connection file) keeps reaching it.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
from dataclasses import asdict, dataclass
from typing import Any

from ..criu.images import Image
from ..errors import EngineError

TCP_LISTEN = 10


@dataclass(frozen=True)
class Route:
    """Host ``addr``:``port`` leads to ``inner`` in the fork's namespace."""

    addr: str
    port: int
    inner: int

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Route:
        return cls(str(d["addr"]), int(d["port"]), int(d["inner"]))


def _address(family: int, words: tuple[int, ...]) -> str:
    """CRIU keeps an address as the u32 words of its bytes in memory order."""
    raw = struct.pack(f"<{len(words)}I", *words) if words else b""
    if family == socket.AF_INET6:
        return socket.inet_ntop(family, raw.ljust(16, b"\0"))
    return socket.inet_ntop(socket.AF_INET, raw[:4].ljust(4, b"\0"))


def listening(image: Image) -> list[Route]:
    """The TCP ports the image listens on that a relay can lead to: bound to every address or to
    loopback (nothing else exists in the fork's namespace). Host ports are not chosen yet (0)."""
    routes = []
    for s in image.inet:
        if s.state != TCP_LISTEN or s.type != socket.SOCK_STREAM or not s.port:
            continue
        addr = _address(s.family, s.addr)
        ip = ipaddress.ip_address(addr)
        if ip.is_unspecified or ip.is_loopback:
            routes.append(Route(addr, 0, s.port))
    return sorted(set(routes), key=lambda r: r.inner)


def connected_addresses(image: Image) -> list[str]:
    """The addresses, neither loopback nor unspecified, at both ends of the image's TCP connections
    and UDP sockets: CRIU binds each socket back to its address and connects it to its peer's,
    which needs both in the fork's namespace while it restores (``process/forknet.py``)."""
    addrs = set()
    for s in image.inet:
        if (s.type == socket.SOCK_STREAM and s.state == TCP_LISTEN) or s.type not in (socket.SOCK_STREAM, socket.SOCK_DGRAM):
            continue
        for words in (s.addr, s.peer):
            ip = ipaddress.ip_address(_address(s.family, words))
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
                ip = ip.ipv4_mapped
            if not (ip.is_unspecified or ip.is_loopback):
                addrs.add(str(ip))
    return sorted(addrs)


def routes_of(record: dict[str, Any]) -> list[Route] | None:
    """The routes a process record names; None for a process that is no fork."""
    netns = record.get("netns")
    if not isinstance(netns, dict):
        return None
    return [Route.from_dict(r) for r in netns.get("relay", [])]


def bind(routes: list[Route]) -> tuple[list[Route], list[socket.socket]]:
    """Listening sockets on the host for ``routes`` (port 0: any free one); the routes with the
    ports they got. A port taken by someone else is said as such; nothing stays bound then."""
    bound: list[socket.socket] = []
    out = []
    try:
        for r in routes:
            family = socket.AF_INET6 if ":" in r.addr else socket.AF_INET
            s = socket.socket(family, socket.SOCK_STREAM)
            bound.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((r.addr, r.port))
            except OSError as e:
                raise EngineError(f"The host port {r.addr}:{r.port} that leads to the fork's port {r.inner} is "
                                  f"taken ({e.strerror}).", "Stop whatever holds it and retry; the checkpoint is kept.") \
                    from None
            s.listen(128)
            out.append(Route(r.addr, s.getsockname()[1], r.inner))
    except BaseException:
        for s in bound:
            s.close()
        raise
    return out, bound


def free_ports(routes: list[Route]) -> list[Route]:
    """The routes with host ports that are free now (bound and let go; the restore binds them again)."""
    chosen, sockets = bind(routes)
    for s in sockets:
        s.close()
    return chosen


def holder_args(routes: list[Route], sockets: list[socket.socket], addresses: list[str]) -> list[str]:
    """The holder's options for a fork: its relays, and the host ``addresses`` its restore needs."""
    return ["--netns", *(f"--relay={s.fileno()}:{r.inner}" for r, s in zip(routes, sockets)),
            *(f"--address={a}" for a in addresses)]


def record_of(routes: list[Route]) -> dict[str, Any]:
    return {"relay": [asdict(r) for r in routes]}

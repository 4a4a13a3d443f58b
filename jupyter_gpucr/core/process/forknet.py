"""A fork's connections to anything outside its source's tree, handled inside the fork's network namespace.

A fork is restored into a network namespace that holds only ``lo`` (see ``relay.py``). Its
source's TCP connections to processes outside its tree come back there as copies without a peer.
Two things go wrong with them, and the fork's holder (already inside that namespace) sets both
right around CRIU's restore:

- A connection bound to one of the host's addresses (say 192.0.2.2, a client that came in over the
  network, or a connection out to an API) cannot even be restored: that address does not exist in
  the namespace ("Can't bind inet socket back: Cannot assign requested address") and the whole fork
  fails. Before the restore, those addresses are put on the namespace's ``lo``
  (:func:`add_addresses`); after it, taken off again (:func:`remove_addresses`), so that the host's
  addresses lead nowhere from the fork, as every other address does.
- A restored copy waits for a peer that never answers: over a host address a read on it waits for
  good (over loopback the namespace's own ``lo`` answers the first packet with a reset). Right after
  the restore each connection whose peer is not a socket of the namespace is destroyed
  (:func:`cut_outside`: the kernel's ``sock_destroy``, through iproute2's ``ss -K``), so the fork's
  next read or write fails at once with ``ECONNABORTED``, as after a crash of the peer. The
  connections between processes of the fork's tree are kept: both their ends are in the namespace.

Only ever run inside a fork's namespace: ``ss -K`` on the host would end the host's connections.
:func:`cut_outside` refuses to run where the namespace has any interface but ``lo``.

Standard library only: the holder runs as a plain script and loads this file by path.
"""
from __future__ import annotations

import ipaddress
import socket
import struct
import subprocess
from typing import NamedTuple

# /proc/net/tcp states that hold no connection a process could wait on
_LISTEN, _TIME_WAIT, _CLOSE = 0x0A, 0x06, 0x07
_NO_PEER = (_LISTEN, _TIME_WAIT, _CLOSE)


class Conn(NamedTuple):
    """One TCP socket of the namespace: its family, its own end and its peer's (address, port)."""

    family: int
    local: tuple[str, int]
    remote: tuple[str, int]
    state: int

    def ss_filter(self) -> str:
        """This connection exactly, in ``ss``'s filter language."""
        def end(addr: str, port: int) -> str:
            return f"[{addr}]:{port}" if self.family == socket.AF_INET6 else f"{addr}:{port}"
        return f"( src {end(*self.local)} and dst {end(*self.remote)} )"


def _address(family: int, hex_words: str) -> str:
    """/proc/net/tcp shows an address as the 32-bit words of its bytes, each in host order."""
    words = [int(hex_words[i:i + 8], 16) for i in range(0, len(hex_words), 8)]
    return socket.inet_ntop(family, struct.pack(f"={len(words)}I", *words))


def _endpoint(family: int, field: str) -> tuple[str, int]:
    addr, port = field.split(":")
    return _address(family, addr), int(port, 16)


def connections() -> list[Conn]:
    """Every TCP socket of the network namespace of the caller."""
    found = []
    for family, path in ((socket.AF_INET, "/proc/self/net/tcp"), (socket.AF_INET6, "/proc/self/net/tcp6")):
        try:
            with open(path) as f:
                lines = f.read().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for line in lines:
            fields = line.split()
            found.append(Conn(family, _endpoint(family, fields[1]), _endpoint(family, fields[2]), int(fields[3], 16)))
    return found


def _plain(end: tuple[str, int]) -> tuple[str, int]:
    """An IPv4-mapped IPv6 address as the IPv4 address it is: the two ends of one connection may
    be of different families."""
    ip = ipaddress.ip_address(end[0])
    mapped = ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) else None
    return str(mapped or ip), end[1]


def outside(conns: list[Conn]) -> list[Conn]:
    """The connections whose peer is no socket of ``conns``."""
    ends = {(_plain(c.local), _plain(c.remote)) for c in conns}
    return [c for c in conns if c.state not in _NO_PEER and (_plain(c.remote), _plain(c.local)) not in ends]


def _only_loopback() -> bool:
    """Whether this network namespace has no interface but ``lo`` (a fork's, not the host's)."""
    with open("/proc/self/net/dev") as f:
        names = [line.split(":", 1)[0].strip() for line in f.read().splitlines()[2:]]
    return names == ["lo"]


def _ip(args: list[str]) -> str | None:
    """Run iproute2's ``ip``; what went wrong, or None."""
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"'ip {' '.join(args)}' could not run: {e}"
    return None if proc.returncode == 0 else f"'ip {' '.join(args)}': {proc.stderr.strip()}"


def _lo_args(addr: str) -> list[str]:
    if ":" in addr:
        return ["-6", "addr", "{}", f"{addr}/128", "dev", "lo", "nodad"]
    return ["addr", "{}", f"{addr}/32", "dev", "lo"]


def add_addresses(addrs: list[str]) -> list[str]:
    """Put ``addrs`` on ``lo``, so CRIU can bind the connections that used them; what failed."""
    return [e for a in addrs if (e := _ip([w.format("add") for w in _lo_args(a)]))]


def remove_addresses(addrs: list[str]) -> list[str]:
    """Take ``addrs`` off ``lo`` again; what failed."""
    return [e for a in addrs if (e := _ip([w.format("del") for w in _lo_args(a)]))]


def cut_outside() -> tuple[list[Conn], str | None]:
    """Destroy each connection of this namespace whose peer is outside it: those cut, and what
    went wrong (some may be left then)."""
    if not _only_loopback():
        return [], "this is not a fork's network namespace (it has interfaces besides lo): nothing was cut"
    cut = outside(connections())
    if not cut:
        return [], None
    expr = " or ".join(c.ss_filter() for c in cut)
    try:
        proc = subprocess.run(["ss", "-K", "-tan", expr], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return [], f"'ss -K' (iproute2) could not run: {e}"
    still = {(c.local, c.remote) for c in outside(connections())}
    left = [c for c in cut if (c.local, c.remote) in still]
    if proc.returncode != 0 or left:
        why = proc.stderr.strip() or "the kernel did not destroy them (CONFIG_INET_DIAG_DESTROY)"
        return [c for c in cut if c not in left], f"{len(left)} connection(s) left uncut: {why}"
    return cut, None

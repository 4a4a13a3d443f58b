"""Who holds a TCP or UDP port: every socket of this network namespace whose own port it is, in any
state, and the process that has it open.

/proc/net/tcp (and so psutil) lists listening and connected sockets only: a socket that is bound
and nothing more (a client that bound before connecting, a server before its listen) is in none of
its tables. The kernel's socket diagnostics (netlink ``sock_diag``, as ``ss`` uses) list those too
since Linux 6.5 (state ``TCP_BOUND_INACTIVE``), so TCP is asked there, and /proc/net/tcp through
psutil where netlink is not available. A socket is mapped to its process through /proc/*/fd (root
sees every process's, a user their own); a closed connection's TIME_WAIT leftover has none.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

import psutil

NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLM_F_REQUEST, NLM_F_DUMP = 0x1, 0x300
NLMSG_ERROR, NLMSG_DONE = 2, 3
_NLMSGHDR = struct.Struct("=IHHII")
_REQ = struct.Struct("=BBBBI48s")  # inet_diag_req_v2: family, protocol, ext, pad, states, sockid
_MSG = struct.Struct("=BBBB2s2s16s16sI8sIIIII")  # inet_diag_msg

#: The TCP states, as the kernel numbers them (include/net/tcp_states.h).
STATES = {1: "ESTABLISHED", 2: "SYN_SENT", 3: "SYN_RECV", 4: "FIN_WAIT1", 5: "FIN_WAIT2", 6: "TIME_WAIT", 7: "CLOSE",
          8: "CLOSE_WAIT", 9: "LAST_ACK", 10: "LISTEN", 11: "CLOSING", 12: "NEW_SYN_RECV", 13: "BOUND"}


@dataclass(frozen=True)
class PortSocket:
    port: int
    ip: str
    state: str  # LISTEN, BOUND (bound only), ESTABLISHED, TIME_WAIT ... ("NONE": UDP)
    peer: tuple[str, int] | None  # a connection's other end
    pid: int | None  # the process that has it open, when visible


def sockets_on(ports: set[int]) -> list[PortSocket]:
    """Every TCP and UDP socket whose own port is one of ``ports``."""
    try:
        tcp = [s for family in (socket.AF_INET, socket.AF_INET6) for s in _diag_tcp(family) if s[0] in ports]
    except OSError:
        tcp = None
    found = []
    kinds = ("udp",) if tcp is not None else ("tcp", "udp")
    for c in psutil.net_connections("inet" if len(kinds) == 2 else "udp"):
        if c.laddr and c.laddr.port in ports:
            peer = (c.raddr.ip, c.raddr.port) if c.raddr else None
            state = "TIME_WAIT" if c.status == psutil.CONN_TIME_WAIT else str(c.status)
            found.append(PortSocket(c.laddr.port, c.laddr.ip, state, peer, c.pid))
    if tcp:
        owners = _owners({inode for *_, inode in tcp if inode})
        found += [PortSocket(port, ip, state, peer, owners.get(inode)) for port, ip, state, peer, inode in tcp]
    return found


def _diag_tcp(family: int) -> list[tuple[int, str, str, tuple[str, int] | None, int]]:
    """(port, ip, state, peer, inode) of every TCP socket of ``family``, bound-only ones included."""
    req = _REQ.pack(family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF, b"\0" * 48)
    msg = _NLMSGHDR.pack(_NLMSGHDR.size + len(req), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, 1, 0) + req
    out: list[tuple[int, str, str, tuple[str, int] | None, int]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(5)
        nl.sendto(msg, (0, 0))
        while True:
            data = nl.recv(1 << 16)
            offset = 0
            while offset + _NLMSGHDR.size <= len(data):
                length, kind, _flags, _seq, _pid = _NLMSGHDR.unpack_from(data, offset)
                if kind == NLMSG_DONE:
                    return out
                if kind == NLMSG_ERROR:
                    (errno,) = struct.unpack_from("=i", data, offset + _NLMSGHDR.size)
                    raise OSError(-errno, f"sock_diag: {os.strerror(-errno)}")
                if length < _NLMSGHDR.size:
                    return out
                if kind == SOCK_DIAG_BY_FAMILY and length >= _NLMSGHDR.size + _MSG.size:
                    (fam, state, _t, _r, sport, dport, src, dst, _if, _cookie, _exp, _rq, _wq, _uid,
                     inode) = _MSG.unpack_from(data, offset + _NLMSGHDR.size)
                    size = 4 if fam == socket.AF_INET else 16
                    ip = str(ipaddress.ip_address(src[:size]))
                    remote = int.from_bytes(dport, "big")
                    peer = (str(ipaddress.ip_address(dst[:size])), remote) if remote else None
                    out.append((int.from_bytes(sport, "big"), ip, STATES.get(state, str(state)), peer, inode))
                offset += (length + 3) & ~3


def _owners(inodes: set[int]) -> dict[int, int]:
    """The process that has each socket inode open (the first found)."""
    wanted = {f"socket:[{i}]": i for i in inodes}
    owners: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fds = os.scandir(f"/proc/{entry.name}/fd")
        except OSError:
            continue
        with fds:
            for fd in fds:
                try:
                    inode = wanted.get(os.readlink(fd.path))
                except OSError:
                    continue
                if inode is not None and inode not in owners:
                    owners[inode] = int(entry.name)
        if len(owners) == len(wanted):
            break
    return owners

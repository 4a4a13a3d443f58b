"""Ports a user's waker holds while the daemon restores the process that listened on them.

A paused process's listening socket stays open in its waker (``core/activation``), with
``SO_REUSEPORT``, so that CRIU's restore binds the same port beside it. The kernel lets a socket
join a reuseport group only when both have the same owner (the uid that created the socket), and
CRIU, run by the daemon, creates the restored socket as root: beside the user's held socket the
bind fails with "Address already in use". So for the restore the daemon lends the held socket to
root (``fchown``, which sets the socket's owner) and gives it back afterwards, whatever happened;
the restored listening sockets, which CRIU made as root, are given to the user too.

What the daemon lends is narrow: only listening TCP sockets with ``SO_REUSEPORT`` that the
calling process itself holds (the peer of the request, checked to run as the user), that the user
owns, on a port the checkpoint being restored listened on. For the length of the restore those
sockets and the connections accepted on them meanwhile are root's, as every socket of a restored
process was before.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import psutil

from ..core.images import read_image
from ..core.procs import tree

TCP_LISTEN = 10
_SYS_PIDFD_GETFD = 438
_libc = ctypes.CDLL(None, use_errno=True)


def listening_ports(images: Path) -> set[int]:
    """The TCP ports the image's processes listened on."""
    return {s.port for s in read_image(images).inet if s.state == TCP_LISTEN and s.type == socket.SOCK_STREAM and s.port}


@contextlib.contextmanager
def lent_to_root(peer_pid: int, uid: int, ports: set[int]) -> Iterator[list[socket.socket]]:
    """The peer's held listening sockets on ``ports``, owned by root until the block ends, then
    by ``uid`` again."""
    held = _held_by(peer_pid, uid, ports)
    try:
        for s in held:
            os.fchown(s.fileno(), 0, -1)
        yield held
    finally:
        for s in held:
            with contextlib.suppress(OSError):
                os.fchown(s.fileno(), uid, -1)
            s.close()


def give_to_owner(pid: int, uid: int, ports: set[int]) -> int:
    """Make ``uid`` the owner of the root-owned listening sockets on ``ports`` of the tree at ``pid``
    (what CRIU restored as root); how many."""
    given = 0
    for p in tree(pid):
        for s in _listeners(p, ports, owner=0):
            with s:
                os.fchown(s.fileno(), uid, -1)
                given += 1
    return given


def _held_by(pid: int, uid: int, ports: set[int]) -> list[socket.socket]:
    """The listening reuseport sockets on ``ports`` that ``pid``, running as ``uid`` only, holds and
    ``uid`` owns; none when it runs as anyone else."""
    found = _listeners(pid, ports, owner=uid, runs_as=uid) if ports else []
    held = [s for s in found if s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT)]
    for s in found:
        if s not in held:
            s.close()
    return held


def _listeners(pid: int, ports: set[int], owner: int, runs_as: int | None = None) -> list[socket.socket]:
    """Duplicates of ``pid``'s listening TCP sockets on ``ports`` that ``owner`` owns; none when
    ``pid`` does not run as ``runs_as`` alone. The pidfd pins the process: it is still alive after
    /proc was read, so what was read is of that process, not of a later one under its PID."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return []
    found: list[socket.socket] = []
    try:
        proc = psutil.Process(pid)
        if runs_as is not None and set(proc.uids()) != {runs_as}:
            return []
        for c in proc.net_connections("tcp"):
            if c.status != psutil.CONN_LISTEN or c.fd < 0 or not c.laddr or c.laddr.port not in ports:
                continue
            fd = _libc.syscall(_SYS_PIDFD_GETFD, pidfd, c.fd, 0)
            if fd < 0:
                continue
            s = socket.socket(fileno=fd)
            if os.fstat(fd).st_uid == owner and s.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                found.append(s)
            else:
                s.close()
        signal.pidfd_send_signal(pidfd, 0)
    except (psutil.Error, OSError):
        for s in found:
            s.close()
        return []
    finally:
        os.close(pidfd)
    return found

"""A suspended kernel's heartbeat, answered by the server.

Clients that connect by a kernel's connection file check its heartbeat before and while they wait
for their first reply (jupyter_client's ``wait_for_ready``, used by ``jupyter run --existing`` and
``jupyter console --existing``): a heartbeat that does not answer for a second reads as a dead
kernel. While the kernel is on disk (and while it is restored) the server echoes on the kernel's
own heartbeat socket, which it holds (``ports.py``), as ipykernel's heartbeat does: a ZeroMQ ROUTER
(``heldrouter.py``) that sends every message back. Answering a heartbeat is not a reason to restore.
"""
from __future__ import annotations

import socket

import zmq

from .heldrouter import HeldRouter


class HeartbeatEcho(HeldRouter):
    """Echo heartbeats on the listening socket ``held`` (bound to ``ip``:``port``) until :meth:`stop`."""

    def __init__(self, held: socket.socket, ip: str, port: int) -> None:
        super().__init__(held, ip, port, "heartbeat")

    def serve(self, sock: zmq.Socket) -> None:
        zmq.proxy(sock, sock)

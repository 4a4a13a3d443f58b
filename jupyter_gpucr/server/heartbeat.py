"""A suspended kernel's heartbeat, answered by the server.

Clients that connect by a kernel's connection file check its heartbeat before and while they wait
for their first reply (jupyter_client's ``wait_for_ready``, used by ``jupyter run --existing`` and
``jupyter console --existing``): a heartbeat that does not answer for a second reads as a dead
kernel. While the kernel is on disk (and while it is restored) the server echoes on the kernel's
own heartbeat socket, which it holds (``ports.py``), as ipykernel's heartbeat does: a ZeroMQ ROUTER
that sends every message back. ZeroMQ is given a duplicate of the held socket's descriptor
(``ZMQ_USE_FD``), so each side closes its own. Answering a heartbeat is not a reason to restore.
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading

import zmq


class HeartbeatEcho:
    """Echo heartbeats on the listening socket ``held`` (bound to ``ip``:``port``) until :meth:`stop`."""

    def __init__(self, held: socket.socket, ip: str, port: int) -> None:
        self._context = zmq.Context()
        self._socket = self._context.socket(zmq.ROUTER)
        self._socket.linger = 0
        fd = os.dup(held.fileno())
        try:
            self._socket.setsockopt(zmq.USE_FD, fd)
            self._socket.bind(f"tcp://{ip}:{port}")
        except zmq.ZMQError:
            os.close(fd)
            self._socket.close()
            self._context.term()
            raise
        self._thread = threading.Thread(target=self._echo, name=f"gpucr-heartbeat-{port}", daemon=True)
        self._thread.start()

    def _echo(self) -> None:
        with contextlib.suppress(zmq.ContextTerminated, zmq.ZMQError):
            zmq.proxy(self._socket, self._socket)
        self._socket.close(linger=0)  # what lets term() in stop() return

    def stop(self) -> None:
        """Stop answering: the restored kernel's own heartbeat takes the clients, which reconnect."""
        self._context.term()
        self._thread.join(5)

"""A ZeroMQ ROUTER that serves on one of a suspended kernel's held listening sockets (``ports.py``):
ZeroMQ is given a duplicate of the held descriptor (``ZMQ_USE_FD``), so each side closes its own,
and a thread of its own serves until :meth:`HeldRouter.stop` (the hand-over to the restored kernel).
The heartbeat echo (``heartbeat.py``) and the control answers (``control.py``) are two of them."""
from __future__ import annotations

import contextlib
import os
import socket
import threading

import zmq


class HeldRouter:
    """Serve :meth:`serve` on the listening socket ``held`` (bound to ``ip``:``port``) until :meth:`stop`."""

    def __init__(self, held: socket.socket, ip: str, port: int, name: str) -> None:
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
        self._thread = threading.Thread(target=self._run, name=f"gpucr-{name}-{port}", daemon=True)
        self._thread.start()

    def serve(self, sock: zmq.Socket) -> None:
        """Answer on ``sock`` until the context is terminated (a ZMQError ends it)."""
        raise NotImplementedError

    def _run(self) -> None:
        with contextlib.suppress(zmq.ContextTerminated, zmq.ZMQError):
            self.serve(self._socket)
        self._socket.close(linger=0)  # what lets term() in stop() return

    def stop(self) -> None:
        """Stop answering: the restored kernel's own socket takes the clients, which reconnect."""
        self._context.term()
        self._thread.join(5)

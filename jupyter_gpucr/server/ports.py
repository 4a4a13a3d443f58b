"""The listening ports of this server's kernels while they are on disk, and what a client's
connection to them means.

A kernel's ZeroMQ ports come from the system's ephemeral range: while it is suspended, a process
that took one (an outgoing connection, a server asking for any free port) would make its restore
fail. So the server holds them, as a waker holds an agent's ports (``core/activation``): before
the dump it takes its own reference to each of the kernel's listening sockets (``pidfd_getfd``)
and makes it ``SO_REUSEPORT``, which the image records. When the process is gone that socket stays
open, bound and listening in the server; nobody else can bind the port (only a socket of the same
owner that asks for ``SO_REUSEPORT`` could, as CRIU's restore does, beside it). Once the restore
has bound the kernel's own sockets, the server's close. The manifest names the ports held, so a
server started later on the same store binds them anew while it lists the kernel (``bind_anew``,
``SO_REUSEPORT`` too, the same owner: root) and holds them until the restore.

A client that connects by the kernel's connection file (``jupyter console --existing``, a
``BlockingKernelClient``) lands in the queue of a held socket. A connection to the shell or stdin
port is intent to use the kernel: it wakes it (``on_intent``). The heartbeat, iopub and control
ports do not: a monitor's heartbeat and its control requests (jupyter-resource-usage polls the
control port every few seconds) are answered by the server (``heartbeat.py``, ``control.py``), and a
subscriber waits for the kernel's next use. The waiting connections are reset when the held
sockets close after the restore; ZeroMQ reconnects, to the restored kernel, and sends what it
queued, so the first request is answered, not lost.

A kernel listed from object storage may be listed by several servers at once; there the held
sockets only reserve the ports (bound, not listening), so that no server's queue takes connections
meant for the kernel another server restored. Such a kernel is woken through its server.

Only where the server runs CRIU itself (through the gpucr daemon, the kernel's CRIU runs as the
user, and the server's sockets are not the kernel's).
"""
from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from ..core.pausing.activation import WakeOn, bind_anew, find_listeners, hold, steer_to_restored
from ..core.storage.store import Checkpoint
from .control import ControlAnswerer, ControlAnswers
from .heartbeat import HeartbeatEcho

#: The manifest's list of the addresses held while the kernel is on disk (``tcp:HOST:PORT``).
MANIFEST_KEY = "held_ports"
#: The manifest's map of those addresses to the kernel's channels (``shell``, ``hb``, ...).
CHANNELS_KEY = "held_channels"
#: How long the held sockets of the waking channels outlive the others at a hand-over (ZeroMQ
#: reconnects after 0.1 s by default).
HAND_OVER_S = 0.5
#: The channels whose connection wakes the kernel (not ``hb``, not ``iopub``: see the module docstring).
WAKING = ("shell", "stdin")
#: How long after a connection to a waking port the server looks whether its client is still
#: connected: a client that connects and closes at once is no use of the kernel. jupyter_client's
#: ``stop_channels`` connects every channel it had not used, and closes it; jupyter-resource-usage
#: does so after each usage request, every few seconds.
SETTLE_S = 0.3


@dataclass
class _Holding:
    """What the server holds for one kernel on disk."""

    sockets: dict[WakeOn, socket.socket]
    channels: dict[WakeOn, str]
    watched: list[int] = field(default_factory=list)
    echo: HeartbeatEcho | None = None
    control: ControlAnswerer | None = None


class HeldPorts:
    """The sockets this server holds for its kernels on disk, by kernel id; see the module docstring.
    ``listen_anew``: whether ports bound anew (a kernel listed by a later server) listen, and so
    wake the kernel. ``on_intent``: called with a kernel id when a client connects to a port that
    wakes it (once per holding). ``answers_for``: called with a kernel id, how to answer its
    control requests while it is on disk (``control.py``); None: they wait for the kernel."""

    def __init__(self, enabled: bool, log: Any, listen_anew: bool = True,
                 on_intent: Callable[[str], None] | None = None,
                 answers_for: Callable[[str], ControlAnswers | None] | None = None) -> None:
        self.enabled = enabled
        self.log = log
        self.listen_anew = listen_anew
        self.on_intent = on_intent
        self.answers_for = answers_for
        self._held: dict[str, _Holding] = {}

    def take(self, kernel_id: str, pid: int | None, ip: str, channels: dict[str, int]) -> dict[str, Any]:
        """Before the dump: hold the listening sockets on the ports of ``channels`` of the tree at
        ``pid`` (made ``SO_REUSEPORT``, which the dump records); for the manifest, the addresses held
        and their channels. :meth:`watch` starts waking on them once the kernel is on disk."""
        if not self.enabled or not pid:
            return {}
        named = {WakeOn("tcp", host=ip, port=port): channel for channel, port in channels.items() if port}
        try:
            found = find_listeners(pid, list(named))
            held = {w: hold(p, fd, w) for w, (p, fd) in found.items()}
        except OSError as e:  # the kernel exited meanwhile: its suspend says so
            self.log.warning("gpucr: the ports of kernel %s are not held while it is on disk: %s", kernel_id, e)
            return {}
        self._keep(kernel_id, _Holding(held, {w: named[w] for w in held}))
        return {MANIFEST_KEY: [str(w) for w in held], CHANNELS_KEY: {str(w): named[w] for w in held}}

    def watch(self, kernel_id: str) -> None:
        """The kernel is on disk: a connection to one of its waking ports wakes it, and its
        heartbeat and control requests are answered (see ``heartbeat.py``, ``control.py``)."""
        holding = self._held.get(kernel_id)
        if holding is None or holding.watched:
            return
        loop = asyncio.get_running_loop()
        for w, s in holding.sockets.items():
            channel = holding.channels.get(w)
            if channel in WAKING:
                loop.add_reader(s.fileno(), self._connected, kernel_id, s)
                holding.watched.append(s.fileno())
            elif channel == "hb" and holding.echo is None:
                try:
                    holding.echo = HeartbeatEcho(s, w.host, w.port)
                except zmq.ZMQError as e:
                    self.log.warning("gpucr: the heartbeat of kernel %s on disk is not answered: %s", kernel_id, e)
            elif channel == "control" and holding.control is None and self.answers_for is not None:
                answers = self.answers_for(kernel_id)
                if answers is None:
                    continue
                try:
                    holding.control = ControlAnswerer(s, w.host, w.port, answers, self.log)
                except zmq.ZMQError as e:
                    self.log.warning("gpucr: control requests to kernel %s on disk wait for it: %s", kernel_id, e)

    def hold_anew(self, kernel_id: str, ckpt: Checkpoint) -> None:
        """A kernel listed on disk (by a later server, or again): bind the ports its manifest
        names, unless they are held already, and watch them. One that is taken meanwhile is left
        to the restore, which names who holds it."""
        if not self.enabled or kernel_id in self._held:
            return
        held: dict[WakeOn, socket.socket] = {}
        recorded = ckpt.manifest.get(CHANNELS_KEY)
        channels: dict[str, str] = recorded if isinstance(recorded, dict) and self.listen_anew else {}
        for address in ckpt.manifest.get(MANIFEST_KEY) or []:
            w = WakeOn.parse(address)
            try:
                held[w] = bind_anew(w, listen=self.listen_anew)
            except OSError as e:
                self.log.warning("gpucr: port %s of kernel %s on disk cannot be held: %s", address, kernel_id, e)
        self._keep(kernel_id, _Holding(held, {w: channels[str(w)] for w in held if str(w) in channels}))
        self.watch(kernel_id)

    def hand_over(self, kernel_id: str) -> None:
        """The restore has bound the kernel's own sockets beside the held ones: new connections go
        to the kernel's from now on; the held sockets close, those of the waking channels
        ``HAND_OVER_S`` later, so that a client waiting in their queues reconnects its iopub
        subscription before its request reaches the kernel (else the request's output, published
        before the subscriber is back, would be lost to it)."""
        holding = self._let_go(kernel_id)
        if holding is None:
            return
        later = []
        for w, s in holding.sockets.items():
            with contextlib.suppress(OSError):
                steer_to_restored(s)
            if holding.channels.get(w) in WAKING:
                later.append(s)
            else:
                s.close()
        if later:
            asyncio.get_running_loop().call_later(HAND_OVER_S, _close_all, later)

    def release(self, kernel_id: str) -> None:
        """The kernel's own sockets are bound again (restored), or it is gone: let its ports go
        (a client waiting in their queues is reset, and reconnects to the kernel)."""
        holding = self._let_go(kernel_id)
        if holding is not None:
            _close_all(list(holding.sockets.values()))

    def _let_go(self, kernel_id: str) -> _Holding | None:
        """Stop holding ``kernel_id``'s ports: no more watching or answering on them; the holding,
        whose sockets the caller closes."""
        holding = self._held.pop(kernel_id, None)
        if holding is not None:
            self._unwatch(holding)
            self._stop_answering(holding)
        return holding

    def _connected(self, kernel_id: str, held: socket.socket) -> None:
        """A connection waits in the queue of ``held``: see in ``SETTLE_S`` whether it is a use."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(held.fileno())
        loop.call_later(SETTLE_S, self._settled, kernel_id, self._held.get(kernel_id), held)

    def _settled(self, kernel_id: str, holding: _Holding | None, held: socket.socket) -> None:
        if holding is None or self._held.get(kernel_id) is not holding:
            return  # handed over or released meanwhile
        live, closed = queued_connections(held.getsockname()[1])
        if live or not closed:  # a client waits (or one not known here): wake the kernel
            self._unwatch(holding)  # once: the connection stays queued until the restore
            if self.on_intent is not None:
                self.on_intent(kernel_id)
            return
        # every connection in the queue was closed by its client: take them out, and watch on
        held.setblocking(False)  # only this server has the socket now
        for _ in range(closed):
            try:
                conn, _address = held.accept()
            except (BlockingIOError, OSError):
                break
            conn.close()
        asyncio.get_running_loop().add_reader(held.fileno(), self._connected, kernel_id, held)

    @staticmethod
    def _stop_answering(holding: _Holding) -> None:
        for answering in (holding.echo, holding.control):
            if answering is not None:
                answering.stop()
        holding.echo = holding.control = None

    @staticmethod
    def _unwatch(holding: _Holding) -> None:
        if holding.watched:
            loop = asyncio.get_running_loop()
            for fd in holding.watched:
                loop.remove_reader(fd)
            holding.watched.clear()

    def _keep(self, kernel_id: str, holding: _Holding) -> None:
        self.release(kernel_id)
        if holding.sockets:
            self._held[kernel_id] = holding


def queued_connections(port: int) -> tuple[int, int]:
    """The TCP connections to the local ``port`` that are not a listener: how many are open
    (being set up, or established) and how many their client has closed (``CLOSE_WAIT``). While a
    kernel is on disk these are the ones in the queue of its held socket."""
    live = closed = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) < 4 or int(fields[1].rsplit(":", 1)[1], 16) != port:
                continue
            state = fields[3]
            if state == _CLOSE_WAIT:
                closed += 1
            elif state in _OPEN:
                live += 1
    return live, closed


#: /proc/net/tcp states: ESTABLISHED, SYN_RECV (an open connection); CLOSE_WAIT (closed by its client).
_OPEN, _CLOSE_WAIT = ("01", "03"), "08"


def _close_all(sockets: list[socket.socket]) -> None:
    for s in sockets:
        with contextlib.suppress(OSError):
            s.close()

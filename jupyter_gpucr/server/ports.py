"""The listening ports of this server's kernels while they are on disk.

A kernel's ZeroMQ ports come from the system's ephemeral range: while it is suspended, a process
that took one (an outgoing connection, a server asking for any free port) would make its restore
fail. So the server holds them, as a waker holds an agent's ports (``core/activation``): before
the dump it takes its own reference to each of the kernel's listening sockets (``pidfd_getfd``)
and makes it ``SO_REUSEPORT``, which the image records. When the process is gone that socket stays
open, bound and listening in the server; nobody else can bind the port (only a socket of the same
owner that asks for ``SO_REUSEPORT`` could, as CRIU's restore does, beside it). Once the restore
has bound the kernel's own sockets, the server's close. The manifest names the ports held, so a
server started later on the same store binds them anew while it lists the kernel (``bind_anew``,
``SO_REUSEPORT`` too, the same owner: root) and holds them until the restore: bound, not listening,
so that when several servers share the store and one of them restores the kernel, the others'
sockets take none of its connections.

Only where the server runs CRIU itself: through the gpucr daemon, CRIU restores as root beside
the user's sockets, which the kernel refuses (``daemon/heldports.py`` lends a waker's).
"""
from __future__ import annotations

import contextlib
import socket
from typing import Any

from ..core.activation import WakeOn, bind_anew, find_listeners, hold
from ..core.store import Checkpoint

#: The manifest's list of the addresses held while the kernel is on disk (``tcp:HOST:PORT``).
MANIFEST_KEY = "held_ports"


class HeldPorts:
    """The sockets this server holds for its kernels on disk, by kernel id; see the module docstring."""

    def __init__(self, enabled: bool, log: Any) -> None:
        self.enabled = enabled
        self.log = log
        self._held: dict[str, list[socket.socket]] = {}

    def take(self, kernel_id: str, pid: int | None, ip: str, ports: list[int]) -> list[str]:
        """Before the dump: hold the listening sockets on ``ports`` of the tree at ``pid`` (made
        ``SO_REUSEPORT``, which the dump records); the addresses held, for the manifest."""
        if not self.enabled or not pid:
            return []
        wanted = [WakeOn("tcp", host=ip, port=p) for p in ports if p]
        try:
            found = find_listeners(pid, wanted)
            held = {w: hold(p, fd, w) for w, (p, fd) in found.items()}
        except OSError as e:  # the kernel exited meanwhile: its suspend says so
            self.log.warning("gpucr: the ports of kernel %s are not held while it is on disk: %s", kernel_id, e)
            return []
        self._keep(kernel_id, list(held.values()))
        return [str(w) for w in held]

    def hold_anew(self, kernel_id: str, ckpt: Checkpoint) -> None:
        """A kernel listed on disk (by a later server, or again): bind the ports its manifest
        names, unless they are held already. One that is taken meanwhile is left to the restore,
        which names who holds it."""
        if not self.enabled or kernel_id in self._held:
            return
        held = []
        for address in ckpt.manifest.get(MANIFEST_KEY) or []:
            try:
                held.append(bind_anew(WakeOn.parse(address), listen=False))
            except OSError as e:
                self.log.warning("gpucr: port %s of kernel %s on disk cannot be held: %s", address, kernel_id, e)
        self._keep(kernel_id, held)

    def release(self, kernel_id: str) -> None:
        """The kernel's own sockets are bound again (restored), or it is gone: let its ports go."""
        for s in self._held.pop(kernel_id, []):
            with contextlib.suppress(OSError):
                s.close()

    def _keep(self, kernel_id: str, held: list[socket.socket]) -> None:
        self.release(kernel_id)
        if held:
            self._held[kernel_id] = held

"""A suspended kernel's control channel, answered by the server.

Monitors poll a kernel's control port on their own: jupyter-resource-usage's kernel panel sends a
``usage_request`` every few seconds over a connection of its own, and waits up to 10 s for the
reply. While the kernel is on disk the server holds that port (``ports.py``); without an answer
each poll would wait its full 10 s and the polls would pile up. So, as for the heartbeat
(``heartbeat.py``), the server answers on the held socket itself (``heldrouter.py``), replies signed with the kernel's own session key, their
content from :func:`.dormant.answer` (the usage of a kernel that uses nothing, the saved
kernel_info and debugInfo, interrupt "ok"). A request that would need the kernel itself is
answered with an error status (``KernelSuspended``): a control request never restores a kernel.
Messages that are not requests get no answer; a message whose signature does not verify is dropped.
Stopped at the hand-over, when the restored kernel's own control socket takes the clients.
"""
from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
from jupyter_client.session import Session

from .dormant import SUSPENDED_TEXT, Reply, error_content
from .heldrouter import HeldRouter


@dataclass(frozen=True)
class ControlAnswers:
    """How to answer one suspended kernel's control requests: its session's signing key and
    scheme, and ``answer(msg_type, content)`` (:func:`.dormant.answer` for the control channel)."""

    key: bytes
    signature_scheme: str
    answer: Callable[[str, dict[str, Any]], Reply | None]


def reply_to(msg_type: str, content: dict[str, Any], answers: ControlAnswers) -> Reply | None:
    """The reply to send for one request; None: nothing to send."""
    reply = answers.answer(msg_type, content)
    if reply is None and msg_type.endswith("_request"):  # it needs the kernel: say it is suspended
        return Reply(msg_type[: -len("_request")] + "_reply", "control", error_content("KernelSuspended", SUSPENDED_TEXT))
    if reply is None or not reply.msg_type or reply.channel != "control":
        return None  # not a request, or a reply meant for iopub (which nobody publishes now)
    return reply


class ControlAnswerer(HeldRouter):
    """Answer control requests on the listening socket ``held`` (bound to ``ip``:``port``) until :meth:`stop`."""

    def __init__(self, held: socket.socket, ip: str, port: int, answers: ControlAnswers, log: Any) -> None:
        self._answers = answers
        self._log = log
        # a session of its own: a Session remembers the signatures it saw, and this one runs in its own thread
        self._session = Session(key=answers.key, signature_scheme=answers.signature_scheme)
        super().__init__(held, ip, port, "control")

    def serve(self, sock: zmq.Socket) -> None:
        while True:
            self._answer(sock.recv_multipart())

    def _answer(self, frames: list[bytes]) -> None:
        try:
            idents, msg_list = self._session.feed_identities(frames)
            msg = self._session.deserialize(msg_list)  # checks the signature
        except Exception as e:  # not signed with the kernel's key, or not a message at all
            self._log.debug("gpucr: a message to a suspended kernel's control port was dropped: %s", e)
            return
        msg_type = msg["header"].get("msg_type", "")
        try:
            reply = reply_to(msg_type, msg.get("content") or {}, self._answers)
        except Exception as e:  # never let one request stop the answers
            self._log.warning("gpucr: a %s to a suspended kernel was not answered: %s", msg_type, e)
            return
        if reply is not None:
            self._session.send(self._socket, reply.msg_type, reply.content, parent=msg, ident=idents)

"""Kernel websocket connections that survive a suspend and restore the kernel on intent only.

:class:`GPUCRWebsocketConnection` implements jupyter_server's connection interface and
delegates to an ordinary :class:`ZMQChannelsWebsocketConnection` (``_live``) while the kernel
runs. Around a suspend it goes through three modes:

- *holding* (a suspend began): messages from the client are queued, not sent, so no request
  reaches a kernel that is about to be frozen; requests already sent are tracked until the
  kernel's ``idle`` for them went out, and the suspend waits for those (no request without a
  reply, ever).
- *dormant* (the kernel is on disk): the ZeroMQ sockets are closed, the websocket stays open.
  Requests clients send on their own are answered from what was saved (:mod:`.dormant`);
  requests that need the kernel to compute are queued and restore it.
- back to *live* (restored, or the suspend failed): a fresh live connection is made and the
  queue is delivered in order. A failed restore answers each queued request with an error
  reply naming the reason.

A connection that opens while a suspend runs starts out holding and dormant, as if it had been
open when the suspend began: a live one would wait for a kernel that is about to be frozen (or
is), and jupyter_server reads nothing from a websocket until its nudge of the kernel has been
answered. A suspend that begins while a connection is still being opened ends that nudge.

While a restore runs, a ``kernel_info_request`` is answered at once from what was saved, the
request that restores the kernel has its ``busy`` at once (a status whose parent is that request, as
the kernel's own first message for it; the kernel's own ``busy`` for it is then kept back), and an
interrupt cancels the requests waiting for the restore (each is answered as interrupted), not the
restore. After it the client hears what a fresh kernel sends: one ``busy`` and one ``idle`` per
request, in order, nothing without a parent, none of the server's own requests (``_TrackedChannels``);
``jupyter_kernel_test`` passes so. Keep-alive: a websocket ping every ``c.GPUCR.restore_keepalive_s``
(client libraries time out between two reads: ag2's executor after its ``timeout``), which is no
Jupyter message; the waiting request's ``busy`` again only every :attr:`BUSY_AGAIN_S` (autogen-ext
gives each message 60 s; the conformance suite counts a second ``busy`` as an error, but gives a
reply 15 s in all).

During a restore the client is told ``busy``, never ``restarting``: JupyterLab answers
``restarting`` by disposing of every pending request (services/src/kernel/default.ts), which
would drop the very cell that asked for the restore.
"""
from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import Callable
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import (
    BaseKernelWebsocketConnection,
    deserialize_msg_from_ws_v1,
    serialize_binary_message,
    serialize_msg_to_ws_v1,
)
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection
from traitlets import default

from ..core.errors import GPUCRError
from . import dormant
from .kernels import ConnectionHooks

V1 = "v1.kernel.websocket.jupyter.org"
INTERRUPTED_TEXT = ("Interrupted while the kernel was being restored from disk: this request did not run. "
                    "The restore goes on; send it again.")


#: Requests the server sends with the kernel manager's session on a client's behalf (REST
#: interrupt and shutdown in message mode): their statuses go to clients, as jupyter_server's do.
CLIENTS_HEAR = frozenset({"interrupt_request", "shutdown_request"})
#: Per kernel manager: the requests its server-side connections made themselves (see _RecordingSession).
_SERVER_REQUESTS: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()


def _status(session: Session, parts: list[Any]) -> str | None:
    """The execution state of a status message (its parts after the signature), else None."""
    if session.unpack(parts[1]).get("msg_type") != "status":
        return None
    return session.unpack(parts[4]).get("execution_state")


class _RecordingSession(Session):
    """The live connection's session: remembers the requests it makes itself (jupyter_server's
    nudge of the kernel, its ``kernel_info`` for the protocol version), which no client sent."""

    made: set[str]  # shared by the kernel's connections: each forwards none of their messages

    def msg(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        msg = super().msg(*args, **kwargs)
        self.made.add(msg["header"]["msg_id"])
        return msg


class _TrackedChannels(ZMQChannelsWebsocketConnection):
    """The stock connection, counting the requests the kernel has not finished yet and keeping
    from the client what it did not ask for (see :meth:`_forwards`)."""

    in_flight: set[str]
    said_busy: set[str]  # requests gpucr said busy for: the kernel's own busy for each is not sent on
    server_requests: set[str]  # the kernel's: requests made by the server's own connections to it
    internal_session: str  # the kernel manager's session: the server's own clients of the kernel
    ran: Callable[[], None]  # an execute_request goes to the kernel (``unused_ahead.py``)

    @default("session")
    def _default_session(self) -> Session:
        return _RecordingSession(config=self.config)

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        parsed = parse_ws_message(incoming_msg, self.subprotocol, self.session)
        if parsed and parsed[1].get("msg_type", "").endswith("_request"):
            self.in_flight.add(parsed[1]["msg_id"])
            if parsed[1]["msg_type"] == "execute_request":
                self.ran()
        super().handle_incoming_message(incoming_msg)

    def handle_outgoing_message(self, stream: Any, outgoing_msg: list[Any]) -> None:
        if getattr(stream, "channel", stream) == "iopub" and not self._forwards(outgoing_msg):
            return
        super().handle_outgoing_message(stream, outgoing_msg)

    def _forwards(self, msg_list: list[Any]) -> bool:
        """Whether an iopub message goes on to the client: not the kernel's ``busy`` for a request
        gpucr said ``busy`` for already (during its restore), nor a message for a request the
        server made itself (the suspend's preparation, the nudge of a connection made after a
        restore): after a restore the client hears what a fresh kernel would have said, one
        ``busy`` and one ``idle`` per request, in order. Notes the ``idle`` of a request in flight."""
        try:
            _, parts = self.session.feed_identities(msg_list)
            parent = self.session.unpack(parts[2])
            msg_id = parent.get("msg_id")
            if not msg_id:
                return True
            if msg_id in self.server_requests:
                if _status(self.session, parts) == "idle":
                    self.server_requests.discard(msg_id)  # its last message
                return False
            if parent.get("session") == self.internal_session and parent.get("msg_type") not in CLIENTS_HEAR:
                return False
            state = _status(self.session, parts)
            if state == "idle":
                self.in_flight.discard(msg_id)
            elif state == "busy" and msg_id in self.said_busy:
                self.said_busy.discard(msg_id)
                return False
        except Exception:  # a malformed message is the stock code's business
            pass
        return True


class GPUCRWebsocketConnection(BaseKernelWebsocketConnection):
    """See the module docstring."""

    _live: _TrackedChannels | None = None
    _holding = False
    _waking: asyncio.Task[None] | None = None
    _connecting: asyncio.Future[None] | None = None  # the live connection's nudge, while it runs
    _reconnecting = False  # wake() is making the live connection; it delivers what arrives meanwhile
    _closed = False
    #: seconds between two ``busy`` of a request that waits for a restore (see :meth:`_keepalive`):
    #: more than a conformance client waits for a reply in all (jupyter_kernel_test: 15 s), less
    #: than the per-message deadline of agent clients (autogen-ext: 60 s)
    BUSY_AGAIN_S = 15.0

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._queue: list[Any] = []
        self._in_flight: set[str] = set()
        self._said_busy: set[str] = set()  # see _TrackedChannels
        # The restore wakes every connection, and a connection that asked for the restore wakes
        # itself after it: one at a time, or both would make a live connection and one would leak.
        self._wake_lock = asyncio.Lock()

    # -- what the rest of the server sees --------------------------------------------------
    @property
    def suspender(self) -> ConnectionHooks:
        return self.multi_kernel_manager.runtime.suspender

    @property
    def subprotocol(self) -> str | None:
        return getattr(self.websocket_handler, "selected_subprotocol", None)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def _on_disk(self) -> bool:
        return self.multi_kernel_manager.lifecycle.is_on_disk(self.kernel_id)

    async def prepare(self) -> None:
        self.multi_kernel_manager.register_connection(self.kernel_id, self)
        if self.multi_kernel_manager.lifecycle.is_suspending(self.kernel_id):
            self.hold()  # as the connections open when the suspend began
        if self._holding or self._on_disk():
            self.session.key = self.kernel_manager.session.key
            if self._on_disk():
                self.suspender.prefetch(self.kernel_id)  # the user may be back soon; never a restore
            return
        self._live = self._new_live()
        await self._live.prepare()

    def connect(self) -> Any:
        if self._live is not None:
            return asyncio.ensure_future(self._connect_live(self._live))
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def disconnect(self) -> None:
        self._closed = True
        self.multi_kernel_manager.unregister_connection(self.kernel_id, self)
        if self._live is not None:
            self._live.disconnect()
            self._live = None
        else:
            self.multi_kernel_manager.notify_disconnect(self.kernel_id)

    async def _connect_live(self, live: _TrackedChannels) -> None:
        """Until the live connection is up, or a suspend that began meanwhile put this one to
        sleep (:meth:`sleep` ends the nudge): the websocket then stays open, dormant."""
        connected = live.connect()
        if connected is None:
            return
        self._connecting = connected
        try:
            await connected
        finally:
            self._connecting = None

    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if self._live is not None and not self._holding:
            return self._live.handle_incoming_message(incoming_msg)
        if self._waking is not None and self._answered_while_waking(incoming_msg):
            return
        self._queue.append(incoming_msg)
        if self._live is None and not (self._holding or self._reconnecting) and self._waking is None:
            self._answer_queue()

    def handle_outgoing_message(self, stream: str, outgoing_msg: list[Any]) -> None:
        if self._live is not None:
            self._live.handle_outgoing_message(stream, outgoing_msg)

    # -- driven by the kernel manager around a suspend or restore --------------------------
    def hold(self) -> None:
        """A suspend begins: queue what the client sends from now on."""
        self._holding = True

    def sleep(self) -> None:
        """The kernel is about to be frozen: close the ZeroMQ sockets, keep the websocket.

        No status is said: the client's last one is its last request's ``idle`` (the suspend
        waited for it), as the statuses of the server's own requests (the trim) never reach it."""
        live, self._live = self._live, None
        self._in_flight.clear()
        if live is None:
            return
        if self._connecting is not None:  # the kernel will not answer the nudge before it runs again
            self._connecting.cancel()
        # The dormant connection still counts as a connection; live.disconnect() takes one off.
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        live.disconnect()

    def settle(self) -> None:
        """The suspend is complete: answer or act on what was queued meanwhile."""
        self._holding = False
        self._answer_queue()

    async def wake(self) -> None:
        """The kernel runs (restored, or the suspend failed): connect afresh, deliver the queue."""
        async with self._wake_lock:
            await self._wake()

    async def _wake(self) -> None:
        self._holding = False
        if self._closed:
            return
        if self._live is None:
            live = self._new_live()
            self._reconnecting = True
            try:
                await live.prepare()
                self.multi_kernel_manager.notify_disconnect(self.kernel_id)  # live.connect() counts itself
                connected = live.connect()
                if connected is not None:
                    await connected
            except BaseException:
                # Cut short (the kernel died meanwhile and the wake was cancelled): the half-made
                # connection must not stay registered as this session, or the next wake's prepare()
                # would close this very websocket as a stale duplicate. Counted as in sleep().
                self.multi_kernel_manager.notify_connect(self.kernel_id)
                live.disconnect()
                raise
            finally:
                self._reconnecting = False
            self._live = live
        queued, self._queue = self._queue, []
        for msg in queued:
            self._live.handle_incoming_message(msg)

    # -- dormant -------------------------------------------------------------------------------
    def _new_live(self) -> _TrackedChannels:
        live = _TrackedChannels(parent=self.kernel_manager, websocket_handler=self.websocket_handler, config=self.config)
        live.session.session = self.session.session
        live.session.made = live.server_requests = _SERVER_REQUESTS.setdefault(self.kernel_manager, set())
        live.in_flight = self._in_flight
        live.said_busy = self._said_busy
        live.internal_session = self.kernel_manager.session.session
        live.ran = lambda: self.suspender.ahead_restores.ran(self.kernel_id)
        return live

    def _answer_queue(self) -> None:
        """Answer what a suspended kernel can answer; the first request that needs the kernel
        restores it, and everything from there on waits for the restore in order. A kernel that
        runs again (restored while this connection was being opened) takes the queue at once."""
        if not self._queue:
            return
        if not self._on_disk():
            self._waking = asyncio.ensure_future(self._catch_up())
            return
        saved = self.suspender.saved_for(self.kernel_id)
        restore_on = set(self.suspender.options.restore_on)
        while self._queue:
            parsed = parse_ws_message(self._queue[0], self.subprotocol, self.session)
            if parsed is None:
                self._queue.pop(0)
                continue
            channel, header, content = parsed
            reply = dormant.answer(header.get("msg_type", ""), channel, content, saved, restore_on)
            if reply is None:
                self._waking = asyncio.ensure_future(self._restore(header))
                return
            self._queue.pop(0)
            self._reply(reply, header, channel)

    def _reply(self, reply: dormant.Reply, parent: dict[str, Any], channel: str) -> None:
        """Say what the kernel says to a message that came on ``channel``: on shell and control,
        its answer (if any) between a ``busy`` and an ``idle`` (ipykernel's statuses for every
        message there, comm messages included); on stdin only the answer."""
        statuses = channel in ("shell", "control")
        if statuses:
            self._send({"execution_state": "busy"}, "status", "iopub", parent)
        if reply.msg_type:
            self._send(reply.content, reply.msg_type, reply.channel, parent, reply.buffers)
        if statuses:
            self._send({"execution_state": "idle"}, "status", "iopub", parent)

    def _answered_while_waking(self, msg: Any) -> bool:
        """While the kernel is being restored: see the module docstring. False: queue it."""
        parsed = parse_ws_message(msg, self.subprotocol, self.session)
        if parsed is None:
            return False
        channel, header, _content = parsed
        msg_type = header.get("msg_type", "")
        if msg_type == "kernel_info_request":
            saved = self.suspender.saved_for(self.kernel_id).replies.get("kernel_info")
            if saved:
                self._reply(dormant.Reply("kernel_info_reply", channel, saved), header, channel)
            return bool(saved)
        if msg_type == "interrupt_request":
            self.multi_kernel_manager.cancel_queued(self.kernel_id)
            self._reply(dormant.Reply("interrupt_reply", channel, {"status": "ok"}), header, channel)
            return True
        return False  # queued behind the request that restores the kernel: its busy comes from the kernel

    def _say_busy(self, header: dict[str, Any]) -> None:
        """``busy`` for a request before the kernel has it: the kernel's own ``busy`` for it is then
        kept from the client (one ``busy`` per request, as a kernel says)."""
        self._said_busy.add(header["msg_id"])
        self._send({"execution_state": "busy"}, "status", "iopub", header)

    async def _keepalive(self) -> None:
        """While a restore keeps requests waiting: a websocket ping every ``restore_keepalive_s``
        (a frame of the websocket protocol, not a Jupyter message: clients whose timeout runs
        between two frames, as ag2's websocket-client, keep waiting, and none of them hears a
        message it would count), and every :attr:`BUSY_AGAIN_S` the ``busy`` of the waiting
        request again, for clients that give each message a deadline (autogen-ext: 60 s)."""
        loop = asyncio.get_running_loop()
        busy_again = loop.time() + self.BUSY_AGAIN_S
        while True:
            await asyncio.sleep(self.suspender.options.restore_keepalive_s)
            try:
                self.websocket_handler.ping(b"gpucr: restoring")
            except Exception:  # closed: its on_close cleans up
                return
            if loop.time() >= busy_again:
                busy_again = loop.time() + self.BUSY_AGAIN_S
                for msg in self._queue:
                    parsed = parse_ws_message(msg, self.subprotocol, self.session)
                    if parsed is not None and parsed[1].get("msg_id") in self._said_busy:
                        self._send({"execution_state": "busy"}, "status", "iopub", parsed[1])

    async def _restore(self, header: dict[str, Any]) -> None:
        self._say_busy(header)
        progress = asyncio.ensure_future(self._keepalive())
        try:
            await self.suspender.resume(self.kernel_id)
        except GPUCRError as e:
            self._fail_queue(e)
        except Exception as e:  # never leave a cell waiting for a reply
            self.log.exception("gpucr: restore of kernel %s failed", self.kernel_id)
            self._fail_queue(GPUCRError(f"Restoring the kernel failed: {e}", "The checkpoint is kept; try again."))
        else:
            # the restore woke every connection already; this one for sure. Until the queue is
            # handed to the kernel the keepalive goes on (it never speaks for a delivered request)
            await self.wake()
        finally:
            progress.cancel()
            self._waking = None

    async def _catch_up(self) -> None:
        try:
            await self.wake()
        except Exception as e:  # the kernel stopped meanwhile: the restarter or a suspend takes it from here
            self.log.warning("gpucr: a connection to kernel %s could not be woken: %s", self.kernel_id, e)
        finally:
            self._waking = None

    def _fail_queue(self, e: GPUCRError) -> None:
        """Answer every queued request with an error reply that says why."""
        self._error_queue("RestoreFailed", f"The kernel could not be restored from disk: {e.message} {e.hint}".strip())

    def cancel_queued(self) -> int:
        """An interrupt while the kernel is on disk: answer the requests waiting for its restore
        as interrupted; how many there were."""
        return self._error_queue("KeyboardInterrupt", INTERRUPTED_TEXT)

    def _error_queue(self, ename: str, text: str) -> int:
        answered = 0
        queued, self._queue = self._queue, []
        for msg in queued:
            parsed = parse_ws_message(msg, self.subprotocol, self.session)
            if parsed is None or not parsed[1].get("msg_type", "").endswith("_request"):
                continue
            channel, header, _content = parsed
            if header["msg_id"] in self._said_busy:
                self._said_busy.discard(header["msg_id"])
            else:
                self._send({"execution_state": "busy"}, "status", "iopub", header)
            if header["msg_type"] == "execute_request":
                self._send({"ename": ename, "evalue": text, "traceback": [f"{ename}: {text}"]}, "error", "iopub", header)
            reply_type = header["msg_type"][: -len("_request")] + "_reply"
            self._send(dormant.error_content(ename, text), reply_type, channel, header)
            self._send({"execution_state": "idle"}, "status", "iopub", header)
            answered += 1
        return answered

    def _send(self, content: dict[str, Any], msg_type: str, channel: str, parent: dict[str, Any] | None,
              buffers: tuple[bytes, ...] = ()) -> None:
        if self._closed:
            return
        msg = self.session.msg(msg_type, content, parent=parent or {})
        try:
            if self.subprotocol == V1:
                parts = [self.session.pack(msg[part]) for part in ("header", "parent_header", "metadata", "content")]
                self.websocket_handler.write_message(serialize_msg_to_ws_v1([*parts, *buffers], channel), binary=True)
            elif buffers:  # the JSON protocol's binary frame, as jupyter_server sends a message with buffers
                msg["channel"] = channel
                msg["buffers"] = list(buffers)
                self.websocket_handler.write_message(serialize_binary_message(msg), binary=True)
            else:
                msg["channel"] = channel
                self.websocket_handler.write_message(json.dumps(msg, default=json_default))
        except Exception as e:  # the websocket closed under us; its on_close cleans up
            self.log.debug("gpucr: could not write to a closing websocket: %s", e)


def parse_ws_message(ws_msg: Any, subprotocol: str | None, session: Any) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """(channel, header, content) of a client message in either websocket protocol."""
    try:
        if subprotocol == V1:
            channel, parts = deserialize_msg_from_ws_v1(ws_msg)
            return channel, session.unpack(parts[0]), session.unpack(parts[3])
        msg = json.loads(ws_msg)
        return msg.get("channel") or "shell", msg.get("header") or {}, msg.get("content") or {}
    except Exception:
        return None

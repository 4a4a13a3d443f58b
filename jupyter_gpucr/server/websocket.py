"""Kernel websocket connections that survive a suspend and restore the kernel on demand.

While its kernel is suspended a connection is *dormant*: the websocket stays open but holds
no ZeroMQ sockets. ``kernel_info_request`` is answered from the reply cached at suspend time
(JupyterLab sends one on every connect; answering it must not wake the kernel). Any other
message is queued and restores the kernel; the queue is then delivered in order, so nothing
the user sent is dropped. During the restore the connection reports ``busy``: the
``restarting`` status is avoided on purpose, because JupyterLab answers it by disposing of
every pending request and reconnecting (services/src/kernel/default.ts), which would lose the
very cell that asked for the restore.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.services.kernels.connection.base import deserialize_msg_from_ws_v1, serialize_msg_to_ws_v1
from jupyter_server.services.kernels.connection.channels import ZMQChannelsWebsocketConnection

try:
    from jupyter_client.jsonutil import json_default
except ImportError:  # older jupyter_client
    from jupyter_client.jsonutil import date_default as json_default

from ..core.errors import GPUCRError

V1 = "v1.kernel.websocket.jupyter.org"


class RestoringWebsocketConnection(ZMQChannelsWebsocketConnection):
    """See the module docstring."""

    #: kernel id -> open connections, so a suspend or restore can put them to sleep or wake them.
    registry: dict[str, set["RestoringWebsocketConnection"]] = {}

    _dormant = False
    _waking: asyncio.Task | None = None

    @property
    def gpucr(self) -> Any:
        return getattr(self.multi_kernel_manager, "gpucr", None)

    def _suspended(self) -> bool:
        return self.gpucr is not None and self.gpucr.is_suspended(self.kernel_id)

    async def prepare(self) -> None:
        if not self._suspended():
            return await super().prepare()
        await self._register_session()
        self.session.key = self.kernel_manager.session.key
        self._dormant = True

    def connect(self) -> Any:
        self.registry.setdefault(self.kernel_id, set()).add(self)
        self._queue: list[Any] = []
        if not self._dormant:
            return super().connect()
        self.multi_kernel_manager.notify_connect(self.kernel_id)
        ZMQChannelsWebsocketConnection._open_sockets.add(self)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def disconnect(self) -> None:
        self.registry.get(self.kernel_id, set()).discard(self)
        if not self._dormant:
            return super().disconnect()
        self.multi_kernel_manager.notify_disconnect(self.kernel_id)
        if self._open_sessions.get(self.session_key) is self.websocket_handler:
            self._open_sessions.pop(self.session_key)
        ZMQChannelsWebsocketConnection._open_sockets.discard(self)
        if not self._close_future.done():
            self._close_future.set_result(None)

    # -- messages ------------------------------------------------------------------------
    def handle_incoming_message(self, incoming_msg: Any) -> None:
        if not self._dormant:
            return super().handle_incoming_message(incoming_msg)
        header = self._header_of(incoming_msg)
        cached = self.gpucr.kernel_info_of(self.kernel_id) if self.gpucr else None
        if header and header.get("msg_type") == "kernel_info_request" and cached:
            self._send({"execution_state": "idle"}, "status", "iopub", header)
            self._send(cached, "kernel_info_reply", "shell", header)
            return
        self._queue.append(incoming_msg)
        if self._waking is None:
            self._waking = asyncio.ensure_future(self._restore_kernel(header))

    def _header_of(self, ws_msg: Any) -> dict[str, Any] | None:
        try:
            if self.subprotocol == V1:
                _channel, parts = deserialize_msg_from_ws_v1(ws_msg)
                return self.session.unpack(parts[0])
            return json.loads(ws_msg).get("header")
        except Exception:
            return None

    def _send(self, content: dict[str, Any], msg_type: str, channel: str, parent: dict[str, Any] | None) -> None:
        msg = self.session.msg(msg_type, content, parent=parent or {})
        if self.subprotocol == V1:
            self.write_message(serialize_msg_to_ws_v1(msg, channel, self.session.pack), binary=True)
        else:
            msg["channel"] = channel
            self.write_message(json.dumps(msg, default=json_default))

    async def _restore_kernel(self, header: dict[str, Any] | None) -> None:
        self._send({"execution_state": "busy"}, "status", "iopub", header)
        try:
            await self.gpucr.resume(self.kernel_id)
        except GPUCRError as e:
            text = f"gpucr: this kernel could not be restored from disk: {e.message}\n{e.hint}\n"
            for msg in self._queue:
                parent = self._header_of(msg)
                if parent:
                    self._send({"name": "stderr", "text": text}, "stream", "iopub", parent)
            self._send({"execution_state": "idle"}, "status", "iopub", header)
            self._queue.clear()
            self._waking = None
            return
        # reattach_kernel has woken this connection through wake(); make sure of it.
        await self.wake()

    # -- sleep and wake (called by the kernel manager) -------------------------------------
    def sleep(self) -> None:
        """The kernel is being suspended: drop the ZeroMQ sockets, keep the websocket.

        The client's last status may be the ``busy`` of the server's own trim request, whose
        ``idle`` will not arrive any more: say ``idle`` so the notebook does not show busy."""
        if self._dormant:
            return
        self._dormant = True
        try:
            self._send({"execution_state": "idle"}, "status", "iopub", None)
        except Exception:  # the websocket may be closing at the same moment
            pass
        self.multi_kernel_manager.remove_restart_callback(self.kernel_id, self.on_kernel_restarted)
        self.multi_kernel_manager.remove_restart_callback(self.kernel_id, self.on_restart_failed, "dead")
        for stream in self.channels.values():
            if stream is not None and not stream.closed():
                stream.on_recv(None)
                stream.close()
        self.channels = {}

    async def wake(self) -> None:
        """The kernel runs again: reconnect, then deliver what was queued meanwhile."""
        if not self._dormant:
            return
        self._dormant = False
        self.session.key = self.kernel_manager.session.key
        self.create_stream()
        await self.nudge()
        for stream in self.channels.values():
            stream.on_recv_stream(self.handle_outgoing_message)
        self.multi_kernel_manager.add_restart_callback(self.kernel_id, self.on_kernel_restarted)
        self.multi_kernel_manager.add_restart_callback(self.kernel_id, self.on_restart_failed, "dead")
        queued, self._queue = self._queue, []
        for msg in queued:
            super().handle_incoming_message(msg)
        self._waking = None

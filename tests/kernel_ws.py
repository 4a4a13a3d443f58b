"""Talk to a kernel through the server's websocket, as JupyterLab does (legacy JSON protocol)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session
from jupyter_server.services.kernels.connection.base import deserialize_binary_message
from tornado.httpclient import HTTPRequest
from tornado.websocket import websocket_connect

_session = Session(key=b"")


def request(code: str, msg_type: str = "execute_request") -> dict[str, Any]:
    content = {"code": code, "silent": False, "store_history": True, "user_expressions": {},
               "allow_stdin": False, "stop_on_error": True} if msg_type == "execute_request" else {}
    msg = _session.msg(msg_type, content)
    msg["channel"] = "shell"
    return msg


def message(msg_type: str, content: dict[str, Any], channel: str = "shell") -> dict[str, Any]:
    """Any client message, as JupyterLab sends it (legacy JSON protocol)."""
    msg = _session.msg(msg_type, content)
    msg["channel"] = channel
    return msg


def decode(raw: str | bytes) -> dict[str, Any]:
    """A message read from the websocket: JSON text, or a binary frame for one with buffers
    (a widget's image, an array)."""
    return deserialize_binary_message(raw) if isinstance(raw, bytes) else json.loads(raw)


async def send(ws: Any, msg: dict[str, Any]) -> None:
    await ws.write_message(json.dumps(msg, default=json_default))


async def collect(ws: Any, msg_id: str, timeout: float = 120) -> tuple[dict[str, Any], str, list[str]]:
    """Read until the reply to ``msg_id`` and its idle status; return (reply, stdout, statuses)."""
    reply, out, statuses, idle = None, [], [], False
    async def loop() -> None:
        nonlocal reply, idle
        while reply is None or not idle:
            raw = await ws.read_message()
            if raw is None:
                raise ConnectionError("websocket closed")
            msg = decode(raw)
            parent = msg.get("parent_header", {}).get("msg_id")
            kind = msg["header"]["msg_type"]
            if kind == "status":
                statuses.append(msg["content"]["execution_state"])
            if parent != msg_id:
                continue
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                out.append("\n".join(msg["content"]["traceback"]))
            elif kind.endswith("_reply"):
                reply = msg
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                idle = True
    await asyncio.wait_for(loop(), timeout)
    return reply, "".join(out), statuses


async def execute(ws: Any, code: str, timeout: float = 120) -> tuple[dict[str, Any], str, list[str]]:
    msg = request(code)
    await send(ws, msg)
    return await collect(ws, msg["header"]["msg_id"], timeout)


def run_at(url: str, token: str, code: str) -> str:
    """Run ``code`` through the kernel channels at websocket ``url`` with ``token``; its output.
    The cell must succeed."""
    async def go() -> str:
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {token}"}))
        try:
            reply, out, _ = await execute(ws, code)
            assert reply["content"]["status"] == "ok", out
            return out.strip()
        finally:
            ws.close()

    return asyncio.run(go())


async def saved_history(db: Any, code: str, timeout: float = 10.0) -> list[str]:
    """The cells IPython saved in the history database ``db``, once ``code`` is among them (its
    saving thread writes after each cell), or as they are after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            saved = [row[0] for row in conn.execute("SELECT source_raw FROM history ORDER BY session, line")]
        if code in saved or time.monotonic() > deadline:
            return saved
        await asyncio.sleep(0.2)

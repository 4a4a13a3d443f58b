"""What a suspended kernel answers without coming back: replies built from what was saved at
suspend time, for the requests clients send on their own (JupyterLab on connect, its debugger
when a tab changes, jupyter-resource-usage every few seconds).

:func:`answer` returns the reply to send, or None when the request needs the kernel to compute
(the configured ``restore_on`` message types, and comm messages of a comm that was open when the
kernel was suspended): those restore the kernel. A page's ipywidgets manager asking for the state of
its widgets (on every load) is answered from the state the kernel gave at suspend time, as its
control comm would: a reload draws the widgets without a restore; a widget moved restores it.
"""
from __future__ import annotations

import base64
import os
import socket
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

SUSPENDED_TEXT = "The kernel is suspended to disk; run a cell or resume it to use it."
#: ipywidgets' comm that a page's widget manager opens to ask for every widget's state
WIDGET_CONTROL_TARGET = "jupyter.widget.control"


@dataclass(frozen=True)
class Reply:
    msg_type: str
    channel: str
    content: dict[str, Any]
    buffers: tuple[bytes, ...] = ()  # binary parts of a comm message (a widget's image, an array)


@dataclass
class Saved:
    """What the kernel said at suspend time, and where its own history database lives."""

    replies: dict[str, Any]
    history_file: Path | None = None


def answer(msg_type: str, channel: str, content: dict[str, Any], saved: Saved, restore_on: set[str]) -> Reply | None:
    """The reply a suspended kernel gives to one request; None: restore the kernel for it."""
    widgets = _widget_states(msg_type, content, saved)
    if widgets is not None:
        return widgets
    if msg_type in restore_on and not (msg_type == "comm_msg" and not _comm_is_live(content, saved)):
        return None
    if msg_type == "kernel_info_request" and "kernel_info" in saved.replies:
        return Reply("kernel_info_reply", channel, saved.replies["kernel_info"])
    if msg_type == "comm_info_request":
        return Reply("comm_info_reply", channel, _comm_info(content, saved))
    if msg_type == "history_request":
        return Reply("history_reply", channel, {"status": "ok", "history": _history(content, saved.history_file)})
    if msg_type == "debug_request":
        return Reply("debug_reply", channel, _debug(content, saved))
    if msg_type == "usage_request":
        return Reply("usage_reply", channel, _usage())
    if msg_type == "interrupt_request":
        return Reply("interrupt_reply", channel, {"status": "ok"})
    if msg_type == "comm_open":
        # A client-side comm to a target only the running kernel serves: closing it at once
        # makes the client fall back instead of waiting.
        return Reply("comm_close", "iopub", {"comm_id": content.get("comm_id"), "data": {}})
    if msg_type == "comm_msg":  # to a comm that was not open at suspend time
        return Reply("comm_close", "iopub", {"comm_id": content.get("comm_id"), "data": {}})
    if msg_type.endswith("_request"):
        return Reply(msg_type[: -len("_request")] + "_reply", channel, error_content("KernelSuspended", SUSPENDED_TEXT))
    return Reply("", channel, {})  # replies and input on stdin: nothing to answer, nothing to restore


def error_content(ename: str, evalue: str) -> dict[str, Any]:
    """A well-formed error reply; ``execution_count`` keeps execute_reply valid too."""
    return {"status": "error", "ename": ename, "evalue": evalue, "traceback": [f"{ename}: {evalue}"],
            "execution_count": None}


def _widget_states(msg_type: str, content: dict[str, Any], saved: Saved) -> Reply | None:
    """What ipywidgets in the kernel would answer a page's widget manager asking for state (its
    control comm opened, ``request_states`` on it; with older managers ``request_state`` on each
    widget's comm), from the state saved at suspend time; None: not such a request, or nothing
    was saved (the kernel had no widgets, or no control comm)."""
    widgets = saved.replies.get("widgets")
    if widgets is None:
        return None
    if msg_type == "comm_open" and content.get("target_name") == WIDGET_CONTROL_TARGET:
        return Reply("", "iopub", {})  # the kernel's control comm opens without a word
    if msg_type != "comm_msg":
        return None
    comm_id = content.get("comm_id")
    method = (content.get("data") or {}).get("method")
    if method == "request_states" and not _comm_is_live(content, saved):
        data = {"method": "update_states", "states": widgets["states"], "buffer_paths": widgets["buffer_paths"]}
        buffers = tuple(base64.b64decode(b) for b in widgets["buffers"])
        return Reply("comm_msg", "iopub", {"comm_id": comm_id, "data": data}, buffers)
    if method == "request_state" and comm_id in widgets["states"]:
        own = [(path[2:], base64.b64decode(buffer))  # paths in the full state: [widget, "state", ...]
               for path, buffer in zip(widgets["buffer_paths"], widgets["buffers"], strict=True)
               if path[:2] == [comm_id, "state"]]
        data = {"method": "update", "state": widgets["states"][comm_id]["state"], "buffer_paths": [p for p, _ in own]}
        return Reply("comm_msg", "iopub", {"comm_id": comm_id, "data": data}, tuple(b for _, b in own))
    return None


def _comm_is_live(content: dict[str, Any], saved: Saved) -> bool:
    comms = saved.replies.get("comm_info", {}).get("comms", {})
    return content.get("comm_id") in comms


def _comm_info(content: dict[str, Any], saved: Saved) -> dict[str, Any]:
    comms = dict(saved.replies.get("comm_info", {}).get("comms", {}))
    target = content.get("target_name")
    if target:
        comms = {k: v for k, v in comms.items() if v.get("target_name") == target}
    return {"status": "ok", "comms": comms}


def _debug(content: dict[str, Any], saved: Saved) -> dict[str, Any]:
    seq = content.get("seq", 0)
    command = content.get("command", "")
    info = saved.replies.get("debug_info")
    if command == "debugInfo" and info:
        return {**info, "request_seq": seq, "seq": seq}
    return {"type": "response", "request_seq": seq, "seq": seq, "success": False, "command": command,
            "message": SUSPENDED_TEXT, "body": {}}


def _usage() -> dict[str, Any]:
    """jupyter-resource-usage's reply shape: the kernel uses nothing while it is on disk."""
    return {"hostname": socket.gethostname(), "pid": None, "kernel_cpu": 0.0, "kernel_memory": 0,
            "host_cpu_percent": psutil.cpu_percent(interval=None), "cpu_count": os.cpu_count(),
            "host_virtual_memory": dict(psutil.virtual_memory()._asdict())}


def _history(content: dict[str, Any], path: Path | None) -> list[list[Any]]:
    """Entries of the kernel's own IPython history database, read without changing the file
    (CRIU checks the size of files the kernel had open)."""
    if path is None or not path.exists() or content.get("hist_access_type") not in ("tail", "range"):
        return []
    output = bool(content.get("output"))
    try:
        db = sqlite3.connect(f"{path.as_uri()}?mode=ro&immutable=1", uri=True)
    except sqlite3.Error:
        return []
    try:
        column = "history.source_raw" if content.get("raw", True) else "history.source"
        join = "LEFT JOIN output_history USING (session, line)" if output else ""
        select = f"SELECT session, line, {column}{', output' if output else ''} FROM history {join}"
        if content["hist_access_type"] == "tail":
            rows = db.execute(f"{select} ORDER BY session DESC, line DESC LIMIT ?", (int(content.get("n") or 10),)).fetchall()
            rows.reverse()
        else:
            session = int(content.get("session") or 0)
            if session <= 0:
                session += db.execute("SELECT MAX(session) FROM sessions").fetchone()[0] or 0
            rows = db.execute(f"{select} WHERE session = ? AND line >= ? AND line < ? ORDER BY line",
                              (session, int(content.get("start") or 0), int(content.get("stop") or 2**31))).fetchall()
    except sqlite3.Error:
        return []
    finally:
        db.close()
    return [list(r[:2]) + ([list(r[2:])] if output else [r[2]]) for r in rows]

"""The server's one way to talk to a kernel it manages: run the ``gpucr_hooks`` functions inside
it (trim, snapshot save/load) and collect the replies a suspended kernel answers from disk.

Each call sends one silent execute request (no history, no execution count, no output in
the notebook): its code runs the hook, so a failure comes back with the kernel's full
traceback; a user expression then returns the hook's result as JSON. The kernel imports
``gpucr_hooks`` on first use without binding any name in the user's namespace.

Use a client dedicated to this work (e.g. :func:`own_client` with its channels
started): replies to other requests read on the same client's shell channel are dropped.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["HISTORY_FILE", "SNAPSHOT_PAYLOAD", "SnapshotError", "follow_moved_history", "load", "load_device", "offload",
           "own_client", "prepare_load", "prepare_suspend",
           "reload", "reload_from", "reopen_history", "save", "saved_replies", "with_client"]

_POLL_S = 1.0
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_RESULT = "__import__('gpucr_hooks')._rpc.reply()"
#: The folder of a checkpoint (or of its portable copy) that the snapshot engine saves a namespace into.
SNAPSHOT_PAYLOAD = "snapshot"
HISTORY_FILE = "history.sqlite"  # an IPython kernel's own database, in its process folder
WIDGET_TARGET = "jupyter.widget"  # the comm target of each ipywidget


class SnapshotError(Exception):
    """A hook failed in the kernel, the kernel died, or it did not answer in time.

    ``kernel_traceback`` holds the kernel's traceback as plain text ("" if there is none).
    """

    def __init__(self, message: str, kernel_traceback: str = "") -> None:
        super().__init__(message)
        self.kernel_traceback = kernel_traceback

    def __str__(self) -> str:
        message = super().__str__()
        return f"{message}\n{self.kernel_traceback}" if self.kernel_traceback else message


def own_client(km: Any) -> Any:
    """A client of the kernel behind ``km`` with a session id of its own. ``km.client()`` shares
    the manager's session, whose id is also the ZeroMQ identity of the client's shell socket: a
    client that another part of the server makes the same way at the same time (jupyter-resource-
    usage's, for each usage poll) takes the same identity, and the kernel's replies to this one go
    to that one, or its requests are dropped (a suspend's preparation then waited 60 s for nothing)."""
    session = km.session.clone()
    session.session = str(uuid.uuid4())
    return km.client(session=session)


async def with_client(km: Any, fn: Callable[..., Awaitable[Any]], *args: Any, **kwargs: Any) -> Any:
    """Run ``fn(client, ...)`` with a fresh client of the kernel behind ``km``, closed afterwards."""
    client = own_client(km)
    client.start_channels()
    try:
        return await fn(client, *args, **kwargs)
    finally:
        client.stop_channels()


async def saved_replies(client: Any, timeout: float = 10.0) -> dict[str, Any]:
    """What a suspended kernel answers from disk: the replies clients ask for on their own
    when they connect (kernel_info, comm_info, the debugger's debugInfo, the state of its
    ipywidgets). A kernel that cannot answer one (no debugger) simply has no saved reply for it."""
    out: dict[str, Any] = {}
    # _reply, not reply=True: it notices a kernel that died instead of waiting out the timeout
    out["kernel_info"] = (await _reply(client, client.kernel_info(), "kernel_info", timeout))["content"]
    out["comm_info"] = (await _reply(client, client.comm_info(), "comm_info", timeout))["content"]
    if any(comm.get("target_name") == WIDGET_TARGET for comm in out["comm_info"].get("comms", {}).values()):
        # without gpucr_hooks in the kernel there is no saved state: a page that loads restores it
        with contextlib.suppress(SnapshotError):
            widgets = await _call(client, "widget_states", {}, timeout)
            if widgets is not None:
                out["widgets"] = widgets
    info = out["kernel_info"]
    if info.get("debugger") or "debugger" in info.get("supported_features", []):
        msg = client.session.msg("debug_request", {"type": "request", "seq": 1, "command": "debugInfo"})
        client.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                reply = await client.get_control_msg(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                out["debug_info"] = reply["content"]
                break
    return out


async def save(client: Any, path: str | os.PathLike[str], timeout: float | None = None) -> dict[str, Any]:
    """Save the kernel's namespace to the new directory ``path`` (see ``gpucr_hooks.snapshot_save``).

    ``path`` is made absolute here, so it means the same in the server and the kernel.
    """
    return await _call(client, "snapshot_save", {"path": os.path.abspath(path)}, timeout)


async def load(client: Any, path: str | os.PathLike[str], device: str | Mapping[str, str] | None = None,
               timeout: float | None = None) -> dict[str, Any]:
    """Load a snapshot into a fresh kernel; ``device`` maps saved GPUs (``"cuda:1"``, ``"cpu"``)."""
    if isinstance(device, Mapping):
        device = dict(device)
    return await _call(client, "snapshot_load", {"path": os.path.abspath(path), "device": device}, timeout)


async def prepare_load(client: Any, path: str | os.PathLike[str], device: str | None = None, gpu: bool = False,
                       timeout: float | None = None) -> dict[str, Any]:
    """Have a fresh kernel import what loading the snapshot at ``path`` will need, ahead of the load
    (``gpucr_hooks.snapshot_prepare``), and with ``gpu`` create the CUDA contexts the load onto
    ``device`` will use; returns what it imported, the GPUs it readied and what failed."""
    return await _call(client, "snapshot_prepare", {"path": os.path.abspath(path), "device": device, "gpu": gpu},
                       timeout)


def load_device(gpu: str) -> str | None:
    """The device a snapshot load is told for a restore onto ``gpu`` (an index: ``cuda:N``; else
    None: every tensor goes back to the GPU it was saved on)."""
    return f"cuda:{gpu}" if str(gpu).isdigit() else None


async def prepare_suspend(client: Any, timeout: float | None = 120.0) -> dict[str, Any]:
    """Collect garbage and release allocator caches in the kernel; returns its memory report."""
    return await _call(client, "prepare_suspend", {}, timeout)


async def offload(client: Any, path: str | os.PathLike[str], collect: bool = True, reuse: Sequence[Path] = (),
                  save_point: bool = False, timeout: float | None = 600.0) -> dict[str, Any]:
    """Move the kernel's CUDA tensors into the folder ``path`` and free their GPU memory
    (``gpucr_hooks.offload_tensors``); returns the bytes and storages moved. ``collect=False``
    when ``prepare_suspend`` has just collected garbage. ``reuse``: the tensor folders of the
    kernel's save points, whose files the tensors unchanged since its last save point are linked
    from instead of written again; ``save_point``: this offload is one's."""
    arguments: dict[str, Any] = {"path": os.path.abspath(path), "collect": collect}
    if reuse or save_point:
        arguments.update(remember=save_point, reuse=[os.path.abspath(p) for p in reuse])
    return await _call(client, "offload_tensors", arguments, timeout)


async def reload(client: Any, timeout: float | None = 600.0) -> dict[str, Any]:
    """Put offloaded tensors back on the GPU (after a restore, or a suspend that failed)."""
    return await _call(client, "reload_tensors", {}, timeout)


async def reload_from(client: Any, path: str | os.PathLike[str], timeout: float | None = 600.0) -> dict[str, Any]:
    """Put offloaded tensors back on the GPU from the folder ``path`` (a fork's own links to its
    source's files: the folder is deleted after, the source's stays)."""
    return await _call(client, "reload_tensors_from", {"path": os.path.abspath(path)}, timeout)


async def reopen_history(client: Any, path: str | os.PathLike[str], timeout: float | None = 60.0,
                         again: bool = False) -> dict[str, Any]:
    """Point IPython's history database at ``path``: the kernel was restored with its folder moved
    (another node, a fork), and SQLite will not write through the path it opened; ``again``: the
    same path, whose file was replaced by a copy (a state taken out of the trash)."""
    arguments: dict[str, Any] = {"path": os.path.abspath(path)}
    if again:
        arguments["again"] = True
    return await _call(client, "reopen_history", arguments, timeout)


async def follow_moved_history(km: Any, relocated: Mapping[str, str]) -> None:
    """A kernel restored with its files moved (``Running.relocated``) writes its history at the
    new path; a kernel that cannot be told so keeps running, without saving history (logged)."""
    moved = [(old, new) for old, new in relocated.items() if os.path.basename(new) == HISTORY_FILE]
    if not moved:
        return
    try:
        await with_client(km, reopen_history, moved[0][1], again=moved[0][0] == moved[0][1])
    except SnapshotError as e:
        km.log.warning("gpucr: kernel %s runs, but its history is not saved any more: %s", km.kernel_id, e)


async def _call(client: Any, hook: str, arguments: dict[str, Any], timeout: float | None) -> Any:
    code = f"__import__('gpucr_hooks')._rpc.run({hook!r}, {json.dumps(arguments)!r})"
    msg_id = client.execute(code, silent=True, store_history=False, user_expressions={"result": _RESULT},
                            allow_stdin=False, stop_on_error=False)
    content = (await _reply(client, msg_id, hook, timeout))["content"]
    if content.get("status") != "ok":
        raise _kernel_error(hook, content)
    result = content.get("user_expressions", {}).get("result", {})
    if result.get("status") != "ok":
        raise _kernel_error(hook, result)
    return json.loads(result["data"]["text/plain"])


async def _reply(client: Any, msg_id: str, hook: str, timeout: float | None) -> dict[str, Any]:
    """The shell reply to ``msg_id``; checks that the kernel is alive while waiting."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        wait = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
        if wait <= 0:
            raise SnapshotError(f"gpucr {hook}: the kernel did not answer within {timeout:g} s "
                                "(it may be busy running a cell; the request is still queued)")
        try:
            msg = await client.get_shell_msg(timeout=wait)
        except queue.Empty:
            if not await client.is_alive():
                raise SnapshotError(f"gpucr {hook}: the kernel died") from None
            continue
        if msg.get("parent_header", {}).get("msg_id") == msg_id:
            return msg


def _kernel_error(hook: str, content: Mapping[str, Any]) -> SnapshotError:
    if content.get("status") == "aborted":
        return SnapshotError(f"gpucr {hook}: the kernel aborted the request")
    ename, evalue = content.get("ename", "Error"), content.get("evalue", "")
    traceback = _ANSI.sub("", "\n".join(content.get("traceback") or []))
    if ename == "ModuleNotFoundError" and "gpucr_hooks" in evalue:
        return SnapshotError(f"gpucr {hook}: gpucr_hooks is not importable in the kernel; install "
                             "jupyter-gpucr into the kernel's Python environment", traceback)
    return SnapshotError(f"gpucr {hook} failed in the kernel: {ename}: {evalue}", traceback)

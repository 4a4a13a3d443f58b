"""For agent frameworks: find a kernel again by the label it was started with (a run or thread
id) on a jupyter server or a Kernel Gateway with gpucr, also after either restarted::

    from jupyter_gpucr.agents import kernel_for
    kernel = kernel_for("thread-42", "http://127.0.0.1:8888", token)   # None: start a new one
    kernel["kernel_id"], kernel["state"]                                 # suspended kernels restore on use

Save points, for a tool call that may have to be undone::

    from jupyter_gpucr.agents import save_point, go_back
    sp = save_point(kernel_id, url, token, name="before tool call")
    ...                                          # the tool call runs code in the kernel
    go_back(kernel_id, sp["id"], url, token)     # it failed: the kernel as it was, same id

docs/agents.md has a recipe for each framework.
"""
from __future__ import annotations

import contextlib
import urllib.parse
from typing import Any

from .cli.server_client import call


def kernels(url: str, token: str = "", label: str | None = None) -> list[dict[str, Any]]:
    """The kernels' gpucr states (``GET /api/gpucr/kernels``), only those labelled ``label`` if given.
    A server that is still listing the kernels of an earlier run answers once it has."""
    query = f"?label={urllib.parse.quote(label)}" if label is not None else ""
    return call(url.rstrip("/") + "/", token, f"api/gpucr/kernels{query}")


def kernel_for(label: str, url: str, token: str = "") -> dict[str, Any] | None:
    """The kernel labelled ``label``: the most recently restored or suspended one if there are several."""
    found = kernels(url, token, label)
    found.sort(key=lambda s: max(s.get("restored_at") or 0, s.get("suspended_at") or 0))
    return found[-1] if found else None


def about_to_use(kernel_id: str, url: str, token: str = "") -> dict[str, Any]:
    """Say that the kernel is about to be used (an agent that will send code after its next thought):
    a suspended kernel starts restoring in the background, so the request finds it back or waits
    less. Returns at once with the kernel's state (``POST .../resume`` with ``{"wait": false}``)."""
    return call(url.rstrip("/") + "/", token, f"api/gpucr/kernels/{urllib.parse.quote(kernel_id)}/resume", "POST",
                {"wait": False})


def save_point(kernel_id: str, url: str, token: str = "", name: str | None = None) -> dict[str, Any]:
    """Keep the kernel's whole state now (``POST .../savepoints``); the kernel is left as it was.
    Returns the save point: ``id``, ``name``, ``created``, ``size``, ``cell`` (the last one run),
    ``paused_s`` (how long a running kernel was paused for it)."""
    return call(url.rstrip("/") + "/", token, f"api/gpucr/kernels/{urllib.parse.quote(kernel_id)}/savepoints", "POST",
                {"name": name} if name else {})


def save_points(kernel_id: str, url: str, token: str = "") -> list[dict[str, Any]]:
    """The kernel's save points, oldest first."""
    return call(url.rstrip("/") + "/", token, f"api/gpucr/kernels/{urllib.parse.quote(kernel_id)}/savepoints")


def go_back(kernel_id: str, savepoint_id: str, url: str, token: str = "") -> dict[str, Any]:
    """Return the kernel to the save point, under the same id, running; the state it leaves goes
    to the trash (``trash_id`` in the answer). Returns the kernel's state."""
    return call(url.rstrip("/") + "/", token, f"api/gpucr/kernels/{urllib.parse.quote(kernel_id)}/savepoints/"
                f"{urllib.parse.quote(savepoint_id)}/restore", "POST", {})


async def reconnect(executor: Any) -> None:
    """After the server restarted, let an executor that keeps one websocket for its kernel's life
    (autogen-ext's ``DockerJupyterCodeExecutor``) go on with the same kernel: the next server lists
    it again, suspended, under the same id, but the executor's websocket died with the old server
    (``ConnectionClosedError``) and it never opens another. This closes that websocket and forgets
    it, so the next code block opens a new one to the same kernel, which restores it. Call it when
    a code block fails that way; the block that failed did not run if the error came on sending it."""
    client = getattr(executor, "_async_jupyter_kernel_client", None)
    if client is None:
        return
    with contextlib.suppress(Exception):  # the websocket is already gone
        await client.stop()
    executor._async_jupyter_kernel_client = None

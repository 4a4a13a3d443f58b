"""For agent frameworks: find a kernel again by the label it was started with (a run or thread
id) on a jupyter server or a Kernel Gateway with gpucr, also after either restarted::

    from jupyter_gpucr.agents import kernel_for
    kernel = kernel_for("thread-42", "http://127.0.0.1:8888", token)   # None: start a new one
    kernel["kernel_id"], kernel["state"]                                 # suspended kernels restore on use

docs/agents.md has a recipe for each framework.
"""
from __future__ import annotations

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

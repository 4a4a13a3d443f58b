"""Reach a running Jupyter server's gpucr API from the command line (``gpucr kernel ...``)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from ..core.errors import GPUCRError, NotFoundError


def find_server(url: str | None, token: str | None) -> tuple[str, str]:
    """The given server, or the one jupyter_server's runtime files list for this user."""
    if url:
        return url.rstrip("/") + "/", token or ""
    from jupyter_server.serverapp import list_running_servers

    servers = list(list_running_servers())
    if not servers:
        raise NotFoundError("No running Jupyter server found for this user.",
                            "Start one (bash scripts/serve.sh), or pass --server URL --token TOKEN.")
    return servers[0]["url"], token or servers[0].get("token", "")


def call(url: str, token: str, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=3600) as resp:
            raw = resp.read()
    except urllib.error.HTTPError as e:
        try:
            err = json.loads(e.read())
        except ValueError:
            err = {}
        raise GPUCRError(err.get("message") or f"The server answered {e.code} {e.reason}.",
                         err.get("hint") or err.get("reason") or "") from None
    except urllib.error.URLError as e:
        raise GPUCRError(f"Cannot reach the Jupyter server at {url}: {e.reason}.",
                         "Check --server, or that the server is running.") from None
    return json.loads(raw) if raw else None

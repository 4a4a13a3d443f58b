"""Reach a running Jupyter server's gpucr API from the command line (``gpucr kernel ...``)."""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from ..core.errors import GPUCRError, NotFoundError

#: Environment variables that name the server, as ``--server`` and ``--token`` do.
URL_ENV, TOKEN_ENV = "GPUCR_SERVER_URL", "GPUCR_SERVER_TOKEN"


def find_server(url: str | None, token: str | None, kernel_id: str | None = None,
                cwd: str | None = None) -> tuple[str, str]:
    """The server to talk to: ``url`` (or ``$GPUCR_SERVER_URL``); else, of the servers that
    jupyter_server's runtime files list for this user (what ``jupyter server list`` shows), the one
    that has ``kernel_id``, or the one whose root folder holds ``cwd`` most closely, or the only one.
    Several that fit equally: an error naming them, never a guess."""
    url = url or os.environ.get(URL_ENV)
    token = token or os.environ.get(TOKEN_ENV) or os.environ.get("JUPYTER_TOKEN")
    if url:
        return url.rstrip("/") + "/", token or ""
    from jupyter_server.serverapp import list_running_servers

    servers = list(list_running_servers())
    if not servers:
        raise NotFoundError("No running Jupyter server found for this user.",
                            "Start one ('jupyter lab'), or pass --server URL --token TOKEN.")
    if len(servers) > 1 and kernel_id:
        having = [s for s in servers if _has_kernel(s, kernel_id)]
        servers = having or servers
    if len(servers) > 1:
        servers = _closest_roots(servers, os.path.realpath(cwd or os.getcwd()))
    if len(servers) > 1:
        listed = "; ".join(f"{s['url']} (root {s.get('root_dir') or s.get('notebook_dir') or '?'})" for s in servers[:5])
        raise GPUCRError(f"{len(servers)} Jupyter servers are running and none is the obvious one: {listed}.",
                         f"Choose one with --server URL (or ${URL_ENV}), or run the command from inside its root folder.")
    return servers[0]["url"], token or servers[0].get("token", "")


def _has_kernel(server: dict[str, Any], kernel_id: str) -> bool:
    try:
        call(server["url"], server.get("token", ""), f"api/gpucr/kernels/{kernel_id}", timeout=5)
    except (GPUCRError, OSError):
        return False
    return True


def _closest_roots(servers: list[dict[str, Any]], cwd: str) -> list[dict[str, Any]]:
    """The servers whose root folder holds ``cwd`` with the longest root; all of them if none does."""
    def root(s: dict[str, Any]) -> str:
        return os.path.realpath(s.get("root_dir") or s.get("notebook_dir") or "/")

    holding = [s for s in servers if os.path.commonpath([root(s), cwd]) == root(s)]
    if not holding:
        return servers
    deepest = max(len(root(s)) for s in holding)
    return [s for s in holding if len(root(s)) == deepest]


def call(url: str, token: str, path: str, method: str = "GET", body: dict[str, Any] | None = None,
         timeout: float = 3600) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
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

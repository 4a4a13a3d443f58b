"""``gpucr doctor``: runs the checks of :mod:`jupyter_gpucr.core.doctor` and prints them."""
from __future__ import annotations

import os

from ..core.doctor import Report, report, run_checks
from ..core.errors import GPUCRError
from ..core.privileges import Check
from ..core.roomreport import room_checks
from ..core.store import Store
from ..daemon.client import DaemonClient
from ..daemon.protocol import DEFAULT_SOCKET
from .server_client import call, find_server


def doctor(store: str | None, criu_path: str | None) -> tuple[Report, str]:
    """The report, and its lines for a person; the daemon is the one ``$GPUCR_DAEMON_SOCKET`` names
    (else the default socket), as a JupyterHub user's server would ask."""
    daemon = DaemonClient(os.environ.get("GPUCR_DAEMON_SOCKET") or DEFAULT_SOCKET)
    rep = report(run_checks(Store(store), criu_path, daemon) + _room())
    return rep, "\n".join(_line(c["ok"], c["required"], c["name"], c["detail"], c["fix"]) for c in rep["checks"])


def _room() -> list[Check]:
    """What each GPU holds and how much of it idle kernels hold, as this user's running Jupyter
    server sees it (only a server knows which kernels are idle)."""
    try:
        url, token = find_server(None, None)
        return room_checks(call(url, token, "api/gpucr/room"))
    except GPUCRError as e:
        return [Check("room", True, f"not asked: {e.message}", required=False)]


def _line(ok: bool, required: bool, name: str, detail: str, fix: str) -> str:
    mark = "OK" if ok else ("NO" if required else "--")
    return f"{mark:3} {name:24} {detail}" + (f"\n    fix: {fix}" if fix and not ok else "")

"""``gpucr doctor``: runs the checks of :mod:`jupyter_gpucr.core.doctor` and prints them, then what
each GPU holds (:mod:`jupyter_gpucr.core.gpu.roomreport`)."""
from __future__ import annotations

import os
from typing import Any

from ..core.doctor import Report, report, run_checks
from ..core.errors import GPUCRError
from ..core.gpu import gpus
from ..core.gpu.roomreport import MemorySection, memory_lines, memory_section
from ..core.storage.store import Store
from ..daemon.client import DaemonClient
from ..daemon.protocol import DEFAULT_SOCKET
from .server_client import call, find_server


class DoctorReport(Report):
    memory: MemorySection


def doctor(store: str | None, criu_path: str | None) -> tuple[DoctorReport, str]:
    """The report, and its lines for a person; the daemon is the one ``$GPUCR_DAEMON_SOCKET`` names
    (else the default socket), as a JupyterHub user's server would ask."""
    daemon = DaemonClient(os.environ.get("GPUCR_DAEMON_SOCKET") or DEFAULT_SOCKET)
    rep: DoctorReport = {**report(run_checks(Store(store), criu_path, daemon)), "memory": _memory()}
    lines = [_line(c["severity"], c["name"], c["detail"], c["fix"]) for c in rep["checks"]]
    return rep, "\n".join([*lines, *memory_lines(rep["memory"])])


def _memory() -> MemorySection:
    """The GPUs as NVML sees them, with the kernels' share from this user's running Jupyter server
    (the one ``gpucr kernel`` finds): only a server knows which kernels are idle."""
    room: list[dict[str, Any]] | None = None
    server = not_asked = None
    try:
        server, token = find_server(None, None)
        room = call(server, token, "api/gpucr/room")
    except GPUCRError as e:
        server, not_asked = None, e.message
    return memory_section(gpus.list_gpus(), room, server, not_asked)


def _line(severity: str, name: str, detail: str, fix: str) -> str:
    """``OK``; ``--`` a note (suspend and restore work), with its advice; ``NO`` a failure, with its fix."""
    mark = {"ok": "OK", "note": "--"}.get(severity, "NO")
    advice = {"note": "note", "fail": "fix"}.get(severity)
    return f"{mark:3} {name:24} {detail}" + (f"\n    {advice}: {fix}" if fix and advice else "")

"""What each GPU (and the host memory budget) holds, as ``gpucr doctor`` and ``gpucr kernel room``
print it: the GPUs' totals come from NVML, which anyone on the machine can read; the kernels' share,
and how much of it idle kernels hold that could be suspended to make room, only a Jupyter server
knows (its ``/api/gpucr/room``), so it is there when a server answered."""
from __future__ import annotations

from typing import Any, TypedDict

from ..sizes import human
from .gpus import Gpu


class MemorySection(TypedDict):
    """The doctor's memory section (``--json``): ``places`` as ``/api/gpucr/room`` gives them; a
    GPU no server was asked about has no ``held_by_kernels``, ``idle`` or ``kernels``."""

    server: str | None  # the Jupyter server that gave the kernels' share
    not_asked: str | None  # why no server gave it
    places: list[dict[str, Any]]


def memory_section(machine: list[Gpu], room: list[dict[str, Any]] | None, server: str | None,
                   not_asked: str | None) -> MemorySection:
    """Each GPU of ``machine`` (the server's row for it when ``room`` has one), then what only
    ``room`` has: the host memory budget, or a GPU this process does not see."""
    by_place = {p.get("uuid") or p["where"]: p for p in room or []}
    places = [by_place.pop(g.uuid) if g.uuid in by_place else _gpu_place(g) for g in machine]
    return {"server": server, "not_asked": not_asked, "places": places + list(by_place.values())}


def _gpu_place(g: Gpu) -> dict[str, Any]:
    return {"where": f"GPU {g.index}", "index": g.index, "uuid": g.uuid, "name": g.name,
            "total": g.memory_total, "used": g.memory_used, "free": g.memory_free}


def memory_lines(section: MemorySection) -> list[str]:
    """The section for a person: one line per place, then whose kernels were counted."""
    rows = [place_line(p) for p in section["places"]]
    if not any("index" in p for p in section["places"]):
        rows.insert(0, "no GPU")
    rows.append(f"kernels: as the Jupyter server at {section['server']} counts them" if section["server"] else
                f"kernels: not counted ({section['not_asked']} 'gpucr kernel room --server URL --token TOKEN' "
                "asks a given server.)")
    return ["GPU memory:", *(f"    {row}" for row in rows)]


def place_line(p: dict[str, Any]) -> str:
    """One GPU or the host memory budget: what is used, by the kernels, idle, and free."""
    if "index" in p:
        head = f"GPU {p['index']} ({p['name']}): {human(p['used'])} of {human(p['total'])} used by all processes"
    else:
        head = f"host memory budget: {human(p['used'])} of {human(p['total'])} counted for kernels"
    free = f"{human(max(p['free'], 0))} free"
    if "held_by_kernels" not in p:
        return f"{head}, {free}"
    n = len(p["kernels"])
    if not n:
        return f"{head}, none of it by a kernel; {free}"
    idle = f"{human(p['idle'])} idle (could be made room of)" if p["idle"] else "none of it idle"
    return f"{head}, {human(p['held_by_kernels'])} of it held by {n} kernel{'' if n == 1 else 's'}, {idle}; {free}"


def kernel_lines(report: list[dict[str, Any]]) -> list[str]:
    """``gpucr kernel room``: each place, then each kernel on it, least recently used first, with
    why make-room would keep it."""
    lines = []
    for p in report:
        lines.append(place_line(p))
        lines.extend(f"    {k['kernel_id']}  {human(k['bytes']):>10}  idle {k['idle_s']:>8.0f} s  "
                     + (f"kept: {k['kept']}" if k["kept"] else "could be suspended to make room")
                     for k in p["kernels"])
    return lines or ["Nothing to report: no GPU, and no host memory budget (c.GPUCR.host_memory_budget)."]

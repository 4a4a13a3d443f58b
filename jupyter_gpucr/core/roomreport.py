"""The doctor's lines about room: what each GPU (and the host memory budget) holds, and how much
of it idle kernels hold that could be suspended to make room, from a server's ``/api/gpucr/room``."""
from __future__ import annotations

from typing import Any

from .privileges import Check
from .sizes import human


def room_checks(report: list[dict[str, Any]]) -> list[Check]:
    """One informational line per GPU and for the host budget."""
    rows = []
    for place in report:
        n = len(place["kernels"])
        detail = (f"{human(place['used'])} of {human(place['total'])} used, {human(place['held_by_kernels'])} of it by "
                  f"{n} kernel{'' if n == 1 else 's'}, {human(place['idle'])} idle (could be made room of)")
        rows.append(Check(f"room: {place['where']}", True, detail, required=False))
    return rows

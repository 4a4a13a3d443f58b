"""A process gpucr started or restored: what the checkpointer, its backends, forks and sessions
hand back."""
from __future__ import annotations

from dataclasses import dataclass, field

from .launcher import Started
from .record import ProcRecord


@dataclass
class Running:
    """A process gpucr started or restored, and how to reach it."""

    name: str
    pid: int
    ns_pid: int
    started: Started | None
    record: ProcRecord
    timings: dict[str, float] = field(default_factory=dict)
    relocated: dict[str, str] = field(default_factory=dict)  # path in the image -> the file it has now

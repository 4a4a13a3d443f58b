"""The cost of restoring ahead of use (``KernelSuspender.resume_ahead``: a user typing into a cell,
an agent about to send code) where no run followed: the kernel came back, no ``execute_request``
reached it (through the server's websockets), and it was suspended again or shut down. Such
restores are counted per kernel and in all, with how long the kernel was back and the most memory
(RSS) it was seen to hold, said in the log as each happens and in the server's doctor report, so
that an operator weighs restoring ahead against what it costs here (docs/ui.md)."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from ..core.process.privileges import Check
from ..core.process.procs import tree_rss
from ..core.sizes import human
from .kernels import Kernels

#: How many kernels the doctor's line names, those with the most unused restores first.
NAMED = 5


@dataclass
class _Back:
    """A kernel restored ahead of use that has run nothing since."""

    since: float | None = None  # monotonic: when it was back; None while it is being restored
    rss: int = 0  # the most it was seen to hold


@dataclass
class Unused:
    """Restores ahead that no run followed, of one kernel or all: how many, and what they held."""

    count: int = 0
    seconds: float = 0.0  # back, in all
    byte_seconds: float = 0.0  # RSS times seconds back, in all
    most: int = 0  # the most RSS one of them held

    def add(self, seconds: float, rss: int) -> None:
        self.count += 1
        self.seconds += seconds
        self.byte_seconds += seconds * rss
        self.most = max(self.most, rss)


class AheadRestores:
    """Counts the restores started ahead of use, and those no run followed; see the module docstring."""

    def __init__(self, log: Any, kernel_manager: Kernels) -> None:
        self.log = log
        self.kernel_manager = kernel_manager
        self.started = 0
        self.total = Unused()
        self.by_kernel: dict[str, Unused] = {}
        self._back: dict[str, _Back] = {}

    @contextlib.contextmanager
    def restoring(self, kernel_id: str) -> Iterator[None]:
        """Around a restore started ahead of use: a run that comes meanwhile (it waits for this
        restore) uses it; a restore that fails is no cost of this kind."""
        self.started += 1
        self._back[kernel_id] = _Back()
        try:
            yield
        except BaseException:
            self._back.pop(kernel_id, None)
            raise
        back = self._back.get(kernel_id)
        if back is not None:
            back.since = time.monotonic()
            self._measure(kernel_id, back)

    def ran(self, kernel_id: str) -> None:
        """An ``execute_request`` reached the kernel: its restore ahead, if any, was used."""
        self._back.pop(kernel_id, None)

    def leaving(self, kernel_id: str) -> None:
        """The kernel's suspend begins: what it holds now (all its memory is in by then)."""
        back = self._back.get(kernel_id)
        if back is not None:
            self._measure(kernel_id, back)

    def left(self, kernel_id: str, how: str) -> None:
        """The kernel was suspended again, or shut down (``how``): a restore ahead that no run
        followed counts, and is said in the log."""
        back = self._back.pop(kernel_id, None)
        if back is None or back.since is None:
            return
        seconds = time.monotonic() - back.since
        self.total.add(seconds, back.rss)
        self.by_kernel.setdefault(kernel_id, Unused()).add(seconds, back.rss)
        self.log.info("gpucr: kernel %s was restored ahead of use and %s unused after %.1f s, holding %s",
                      kernel_id, how, seconds, human(back.rss))

    def check(self) -> Check:
        """The doctor's line: how many restores ahead no run followed, and what they held."""
        if not self.total.count:
            return Check("restores ahead", True, f"{self.started} started ahead of use; none went back to disk or "
                         "was shut down before a run" if self.started else "none started ahead of use yet")
        named = sorted(self.by_kernel.items(), key=lambda kv: -kv[1].count)
        kernels = ", ".join(f"{kernel_id} {u.count}" for kernel_id, u in named[:NAMED])
        more = f" and {len(named) - NAMED} more" if len(named) > NAMED else ""
        t = self.total
        return Check("restores ahead", False,
                     f"{t.count} of {self.started} started ahead of use were followed by no run before the kernel "
                     f"went back to disk or was shut down: back {t.seconds:.0f} s in all, holding up to {human(t.most)} "
                     f"({human(int(t.byte_seconds))}·s); by kernel: {kernels}{more}",
                     "Each cost a restore, a suspend and the kernel's memory while it was back: where notebooks are "
                     "often edited without running, turn 'Restore while I type' off in JupyterLab's settings, or "
                     "shorten c.GPUCR.idle_timeout.", required=False)

    def _measure(self, kernel_id: str, back: _Back) -> None:
        if kernel_id not in self.kernel_manager:
            return
        pid = getattr(self.kernel_manager.get_kernel(kernel_id).provisioner, "kernel_pid", None)
        with contextlib.suppress(psutil.Error, OSError):
            back.rss = max(back.rss, tree_rss(pid) if pid else 0)

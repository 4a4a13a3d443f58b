"""The host memory budget checked as soon as kernels may have grown past it, not only every
``c.GPUCR.budget_check_interval``: when a cell ends (kernels grow in cells), and when memory comes
under pressure while a cell still runs. All three ask one runner, so that two checks never run at
once (a second check while the first one's kernel is still being suspended would count its memory
again, and suspend one kernel too many).

Pressure is what the kernel says of the memory cgroup the server runs in (:mod:`.memcgroup`), the
one whose limit gets a kernel OOM-killed: on cgroup v1 its ``memory.pressure_level`` (reclaim has
started, which with page cache in the cgroup is whenever memory is taken) and its usage crossing
each of ``LEVELS`` levels from the budget up to the limit (a cgroup without page cache reclaims
nothing before the limit, where the OOM killer comes), all by eventfd; on v2 its
``memory.events`` (the limit was reached) and its PSI. Where no cgroup limits the server, the host's PSI
(``/proc/pressure/memory``). A thread waits on those files; each signal, and each cell's end, asks
for one check, run on the event loop at most every ``MIN_GAP_S``. The check itself
(``RoomMaker.hold_budget``) suspends idle kernels, least recently used first, only when what the
kernels hold has passed the budget; a signal that finds the budget held costs one measurement.
A cell's end also has the room kept free on the GPUs (``c.GPUCR.room_headroom``) checked where
that cell's kernel holds GPU memory, with or without a budget: only a cell grows a kernel's GPU memory.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import select
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.sizes import human
from . import memcgroup
from .memcgroup import MemoryCgroup

#: The fewest seconds between two checks, however many signals come (a reclaim storm sends many).
MIN_GAP_S = 0.25
#: cgroup v1: how many usage levels signal, evenly from the budget (or USAGE_SHARE of the limit,
#: where that is lower) up to the limit.
LEVELS = 8
USAGE_SHARE = 0.9
#: PSI: 100 ms stalled on memory within 2 s (a window of whole seconds of 2 is allowed unprivileged).
PSI_TRIGGER = b"some 100000 2000000"
HOST_PSI = Path("/proc/pressure/memory")


@dataclass
class Signal:
    """A file descriptor that becomes ready under memory pressure."""

    what: str  # for the log: "cgroup v1 pressure", ...
    fd: int
    events: int  # the poll mask
    drain: Callable[[], None]  # read what made it ready, so that it waits again
    also_open: list[int] = field(default_factory=list)  # closed with it

    def close(self) -> None:
        for fd in (self.fd, *self.also_open):
            with contextlib.suppress(OSError):
                os.close(fd)


def open_signals(cgroup: MemoryCgroup | None, budget: int, log: Any) -> list[Signal]:
    """What says memory is under pressure here; each that cannot be opened (no permission, no
    PSI in this kernel) is left out and said in the debug log."""
    if cgroup is None:
        wanted = [lambda: _psi("host PSI", HOST_PSI)]
    elif cgroup.version == 1:
        wanted = [lambda: _v1_event("cgroup reclaim", cgroup.folder, "memory.pressure_level", "low,hierarchy")]
        wanted += [functools.partial(_v1_event, "cgroup usage levels", cgroup.folder, "memory.usage_in_bytes", str(level))
                   for level in usage_levels(cgroup.limit, budget)]
    else:
        wanted = [lambda: _events_file("cgroup memory events", cgroup.folder / "memory.events"),
                  lambda: _psi("cgroup PSI", cgroup.folder / "memory.pressure")]
    out = []
    for opener in wanted:
        try:
            out.append(opener())
        except OSError as e:
            log.debug("gpucr: a memory pressure signal is not watched: %s", e)
    return out


def usage_levels(limit: int, budget: int) -> list[int]:
    """The cgroup usages (bytes) whose crossing signals: ``LEVELS``, evenly below the limit."""
    low = min(budget, int(limit * USAGE_SHARE))
    return [low + (limit - low) * i // LEVELS for i in range(LEVELS)]


def _v1_event(what: str, folder: Path, control: str, args: str) -> Signal:
    """A cgroup v1 notification: an eventfd the kernel writes when ``control`` says so."""
    efd = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
    try:
        target = os.open(folder / control, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        os.close(efd)
        raise
    try:
        with open(folder / "cgroup.event_control", "w") as f:
            f.write(f"{efd} {target} {args}")
    except OSError:
        os.close(efd)
        os.close(target)
        raise
    return Signal(what, efd, select.POLLIN, lambda: _read_eventfd(efd), [target])


def _read_eventfd(efd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.eventfd_read(efd)


def _psi(what: str, path: Path) -> Signal:
    """A PSI trigger: ready (``POLLPRI``) once per window in which the stall passed the trigger."""
    fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        os.write(fd, PSI_TRIGGER + b"\0")
    except OSError:
        os.close(fd)
        raise
    return Signal(what, fd, select.POLLPRI, lambda: None)


def _events_file(what: str, path: Path) -> Signal:
    """cgroup v2's ``memory.events``: ready (``POLLPRI``) when one of its counters changed; read
    again, it waits for the next change."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def drain() -> None:
        os.pread(fd, 4096, 0)

    drain()  # what changed before it was opened
    return Signal(what, fd, select.POLLPRI, drain)


class _Watch(threading.Thread):
    """Waits on the signals and says which one came, at most every ``MIN_GAP_S``."""

    def __init__(self, signals: list[Signal], came: Callable[[str], object]) -> None:
        super().__init__(name="gpucr-memory-pressure", daemon=True)
        self.signals, self.came = signals, came
        self._wake = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)
        self._stopped = threading.Event()

    def run(self) -> None:
        poller = select.poll()
        poller.register(self._wake, select.POLLIN)
        by_fd = {s.fd: s for s in self.signals}
        for s in self.signals:
            poller.register(s.fd, s.events)
        while not self._stopped.is_set():
            for fd, _ in poller.poll():
                if fd in by_fd:
                    by_fd[fd].drain()
                    self.came(by_fd[fd].what)
            self._stopped.wait(MIN_GAP_S)

    def stop(self) -> None:
        self._stopped.set()
        os.eventfd_write(self._wake, 1)
        self.join(timeout=2)
        os.close(self._wake)
        for s in self.signals:
            s.close()


class GrowthChecks:
    """Runs the check (``check``, given the kernels whose cells ended since the last one) every
    ``interval`` s, when a cell ends and on memory pressure, one at a time; see the module
    docstring. Nothing runs before :meth:`start`, nor without a budget or checks after cells."""

    def __init__(self, check: Callable[[frozenset[str]], Awaitable[None]], log: Any) -> None:
        self._check, self.log = check, log
        self._budget = 0
        self._running = False  # a budget, or checks after cells
        self._cells_ended: set[str] = set()
        self._cgroup: MemoryCgroup | None = None
        self._watch: _Watch | None = None
        self._task: asyncio.Task[None] | None = None
        self._every: asyncio.Task[None] | None = None
        self._again = False
        self._last = 0.0
        self._why = ""
        self._oom_kills = 0

    def start(self, budget: int, interval: float, after_cells: bool = False) -> None:
        """Check ``budget`` (bytes; 0: none) every ``interval`` s and watch for pressure, and say in
        the log how the budget stands against the memory limit the server runs under; check after
        each cell with a budget or ``after_cells`` (room kept free on the GPUs)."""
        self._cgroup = memcgroup.find()
        self._advise(budget)
        self._running = after_cells or bool(budget)
        if not budget:
            return
        self._budget = budget
        self._oom_kills = self._read_oom_kills()
        signals = open_signals(self._cgroup, budget, self.log)
        loop = asyncio.get_running_loop()
        self._watch = _Watch(signals, lambda what: loop.call_soon_threadsafe(self.poke, what))
        self._watch.start()
        self._every = asyncio.ensure_future(self._periodically(interval))
        where = f"the memory cgroup {self._cgroup.folder} (limit {human(self._cgroup.limit)})" if self._cgroup else "the host"
        said = ", ".join(dict.fromkeys(s.what for s in signals)) or "none could be watched"
        self.log.info("gpucr: the host memory budget is also checked after each cell and on memory pressure in %s (%s)",
                      where, said)

    def stop(self) -> None:
        self._budget = 0
        self._running = False
        if self._every is not None:
            self._every.cancel()
            self._every = None
        if self._watch is not None:
            self._watch.stop()
            self._watch = None

    async def _periodically(self, interval: float) -> None:
        while True:
            await asyncio.sleep(interval)
            self.poke(f"every {interval:g} s")

    def cell_ended(self, kernel_id: str) -> None:
        if self._running:
            self._cells_ended.add(kernel_id)
            self.poke(f"a cell of kernel {kernel_id} ended")

    def poke(self, why: str) -> None:
        """Ask for a check: now, or once the one under way (or the last, ``MIN_GAP_S`` ago) is done."""
        if not self._running:
            return
        self._why = why
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._run())
        else:
            self._again = True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while self._running:
            await asyncio.sleep(max(0.0, self._last + MIN_GAP_S - loop.time()))
            self._again, self._last = False, loop.time()
            cells_ended, self._cells_ended = frozenset(self._cells_ended), set()
            self.log.debug("gpucr: checking what kernels grew into: %s", self._why)
            try:
                await self._check(cells_ended)
            except Exception:  # a background task: nothing else would report it
                self.log.exception("gpucr: checking what kernels grew into failed")
            self._say_oom_kills()
            if not self._again:
                return

    def _advise(self, budget: int) -> None:
        cgroup = self._cgroup
        if cgroup is None:
            return
        suggested = human(cgroup.limit - max(cgroup.limit // 8, 512 << 20))
        if not budget:
            self.log.warning("gpucr: this server runs under a memory limit of %s (%s) and c.GPUCR.host_memory_budget "
                             "is not set: kernels that grow past the limit are killed with their state. Set the budget "
                             "below the limit, e.g. '%s' (docs/jupyterhub.md).", human(cgroup.limit), cgroup.folder,
                             suggested)
        elif budget >= cgroup.limit:
            self.log.warning("gpucr: c.GPUCR.host_memory_budget (%s) is not below this server's memory limit (%s, %s): "
                             "kernels can be killed before the budget is passed. Set it below, e.g. '%s' "
                             "(docs/jupyterhub.md).", human(budget), human(cgroup.limit), cgroup.folder, suggested)

    def _read_oom_kills(self) -> int:
        try:
            return self._cgroup.oom_kills() if self._cgroup else 0
        except OSError:
            return 0

    def _say_oom_kills(self) -> None:
        """The OOM killer came anyway (a kernel grew faster than a check, or all kernels were in use):
        say so where the operator looks, with what to change."""
        kills = self._read_oom_kills()
        if kills > self._oom_kills and self._cgroup is not None:
            self.log.error("gpucr: the OOM killer killed %d process(es) in this server's memory cgroup (limit %s, "
                           "host memory budget %s): lower c.GPUCR.host_memory_budget, or raise the limit "
                           "(docs/jupyterhub.md).", kills - self._oom_kills, human(self._cgroup.limit), human(self._budget))
        self._oom_kills = max(kills, self._oom_kills)

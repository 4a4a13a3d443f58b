"""The composition root: every part gpucr runs beside a Jupyter server or a Kernel Gateway, built
once, in one place, as jupyter_server builds its managers in its app.

Both shells (``app.py`` for jupyter_server, ``gateway/personality.py`` for Kernel Gateway) get the
same :class:`GPUCRRuntime` from gpucr's kernel manager, mount the same :func:`.routes.routes`, and
call the same :meth:`~GPUCRRuntime.start` and :meth:`~GPUCRRuntime.stop`. The parts take the narrow
callables or protocols they use (``kernels.py``), never the suspender whole; handlers reach the
runtime through :attr:`.handlers.GPUCRHandler.runtime`.
"""
from __future__ import annotations

import shutil
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from tornado.ioloop import PeriodicCallback

from ..core.backend import CheckpointBackend
from ..core.sizes import human
from ..core.storage.store import Store
from . import portable
from .backend_choice import Backend, build_checkpointer, choose_backend
from .config import GPUCR
from .engines import OFFLOAD_DIR, CriuEngine, SnapshotEngine, SuspendEngine
from .kernel_forks import KernelForker
from .kernels import Kernels
from .lifecycle import SUSPENDED, KernelLifecycle
from .ports import HeldPorts
from .prefetch import Prefetcher
from .preparation import SavedReplies
from .pressure import GrowthChecks
from .readiness import Readiness
from .relist import Relister
from .remote import RemoteKernels, connect, local_root
from .room import RoomMaker
from .savepoints import SavePoints
from .service import KernelSuspender
from .trash import Trash
from .warm import WarmStarts


@dataclass
class GPUCRRuntime:
    """What one server runs of gpucr; see the module docstring."""

    options: GPUCR
    log: Any
    lifecycle: KernelLifecycle
    backend: Backend
    checkpointer: CheckpointBackend
    ports: HeldPorts
    remote: RemoteKernels | None
    trash: Trash
    room: RoomMaker
    warm: WarmStarts
    engines: dict[str, SuspendEngine]
    suspender: KernelSuspender
    forker: KernelForker
    savepoints: SavePoints
    _checks: list[PeriodicCallback] = field(default_factory=list)
    growth: GrowthChecks = field(init=False)  # the budget and GPU headroom checked after each cell, and on memory pressure

    def __post_init__(self) -> None:
        self.growth = GrowthChecks(self.room.hold_growth, self.log)

    @property
    def store(self) -> Store:
        return self.checkpointer.store

    @classmethod
    def build(cls, config: GPUCR, kernels: Kernels, lifecycle: KernelLifecycle, log: Any) -> GPUCRRuntime:
        """Every part, wired to the ones it uses. The room suspends kernels and the suspender makes
        room, so the room is handed the suspender's one verb it uses, bound once both exist."""
        store = Store(local_root(config))
        backend = choose_backend(config)
        checkpointer = build_checkpointer(config, backend, store, config.max_store_bytes or _half_of_disk(store))
        saved = SavedReplies(store)
        bucket = connect(config)  # object storage: kernels are uploaded after their suspend, downloaded to restore
        remote = RemoteKernels(bucket, store, lifecycle, log, config.keep_last, config.lease_timeout_s,
                               config.max_bucket_bytes or None) if bucket else None
        if remote is not None:
            remote.stream_from(checkpointer, (OFFLOAD_DIR, portable.PORTABLE_DIR))
        suspender: KernelSuspender | None = None

        def suspender_now() -> KernelSuspender:
            assert suspender is not None, "the suspender is made before any kernel is asked about"
            return suspender

        # whole-process kernels' ports, held while they are on disk; several servers may list a kernel of object storage
        ports = HeldPorts(backend.kind == "local", log, listen_anew=remote is None,
                          on_intent=lambda kernel_id: suspender_now().connected_while_on_disk(kernel_id),
                          answers_for=lambda kernel_id: suspender_now().control_answers(kernel_id))
        room = RoomMaker(config, log, lifecycle, kernels, store,
                         suspend=lambda kernel_id, reason: suspender_now().suspend(kernel_id, reason=reason),
                         drop_warm=lambda **kw: warm.drop_all(**kw), event_logger=lifecycle.event_logger)
        warm = WarmStarts(config, log, kernels, lifecycle, store, room,
                          busy=lambda kernel_id: suspender_now().busy(kernel_id),
                          stopping=lambda: suspender_now().stopping)
        engines: dict[str, SuspendEngine] = {e.name: e for e in (CriuEngine(checkpointer, backend, ports),
                                                                 SnapshotEngine(checkpointer, warm))}
        trash = Trash(config, checkpointer, kernels, lifecycle, remote, log)
        relister = Relister(checkpointer, kernels, lifecycle, saved, remote, ports, log)
        suspender = KernelSuspender(config, kernels, lifecycle, log, checkpointer=checkpointer, engines=engines,
                                    ports=ports, saved=saved, remote=remote, prefetcher=Prefetcher(store, config, log),
                                    trash=trash, relister=relister, room=room, warm=warm)
        forker = KernelForker(suspender, engines["criu"])
        return cls(config, log, lifecycle, backend, checkpointer, ports, remote, trash, room, warm, engines, suspender,
                   forker, SavePoints(suspender, engines["criu"], forker))

    # -- the server's start and stop ---------------------------------------------------------
    def log_engine(self, kernels_start_stock: bool) -> None:
        """Say at start which engine suspends kernels here, and how to get the whole-process one."""
        if self.backend.kind != "none":
            self.log.info("gpucr: whole-process engine: %s", self.backend.why)
            return
        stock = " (kernels start the stock way)" if kernels_start_stock else ""
        self.log.warning("gpucr: only the snapshot engine can suspend kernels%s: %s. Run 'gpucr doctor' as this user; "
                         "docs/jupyterhub.md says how the gpucr daemon gives such a server the whole-process engine.",
                         stock, self.backend.why)

    async def start(self, readiness: Readiness) -> None:
        """List the kernels an earlier server left (requests to kernels wait until then), then start
        the checks that run while the server does."""
        await readiness.open_after(self.suspender.relist_at_start, self.log)
        self._start_checks()

    def _start_checks(self) -> None:
        """Idle and expired kernels, and the host memory budget and the GPUs' room kept free as
        kernels grow; each says in the log what it does."""
        o = self.options
        self._every(o.idle_check_interval, self.suspender.check_kernels, o.idle_timeout > 0 or o.suspended_hours > 0)
        if o.idle_timeout > 0:
            self.log.info("gpucr: suspending kernels idle for more than %d s", o.idle_timeout)
        if o.suspended_hours > 0:
            self.log.info("gpucr: kernels suspended for more than %g h go to the trash", o.suspended_hours)
        if self.room.host_budget():
            self.log.info("gpucr: holding the host memory budget of %s as kernels grow", human(self.room.host_budget()))
        if self.room.headroom():
            self.log.info("gpucr: keeping %s free on each GPU as its kernels grow (checked after each cell)",
                          human(self.room.headroom()))
        self.growth.start(self.room.host_budget(), o.budget_check_interval, after_cells=bool(self.room.headroom()))

    def _every(self, seconds: float, check: Callable[[], Awaitable[None]], wanted: bool = True) -> None:
        if wanted:
            self._checks.append(PeriodicCallback(check, 1000 * seconds))
            self._checks[-1].start()

    async def stop(self, what: str = "server") -> None:
        """Before the shell shuts its kernels down: stop the checks, drop the processes started ahead
        of restores (their kernels stay on disk) and suspend every running kernel, within the stop
        budget, for the next start to list again."""
        for check in self._checks:
            check.stop()
        self._checks.clear()
        self.growth.stop()
        self.suspender.stopping = True
        await self.warm.drop_all()
        if not self.options.suspend_on_stop:
            return
        failures = await self.suspender.suspend_all("server-stop")
        for kernel_id, why in failures.items():
            self.log.error("gpucr: kernel %s could not be suspended and stops with the %s (its state is lost): %s",
                           kernel_id, what, why)
        self.log.info("gpucr: %d kernel(s) are on disk for the next start", len(self.lifecycle.kernel_ids_in(SUSPENDED)))


def _half_of_disk(store: Store) -> int:
    """The default store limit: half of the disk it is on, so checkpoints never fill it."""
    root = store.root
    while not root.exists():
        root = root.parent
    return shutil.disk_usage(root).total // 2

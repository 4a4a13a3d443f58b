"""Make room: a kernel that must come back (or start) and finds no room for its memory gets it by
suspending idle kernels, least recently used first, through the server's own suspend path.

:func:`decide` is the decision alone (no I/O; tested on its own). :class:`RoomMaker` measures
(NVML for a GPU; for host memory the kernels' RSS against ``c.GPUCR.host_memory_budget``),
decides, suspends the kernels it chose, and reserves the room for the kernel that asked until its
memory is in place, so that two restores never count on the same free bytes.

A kernel's "last use" is jupyter_server's ``last_activity`` (a cell, its output, any request), or
when room was last made for it, whichever is later.

With ``c.GPUCR.room_headroom`` the room is also made ahead: after each restore or start, idle
kernels are suspended in the background until that much is free where it was made, so that the
next user who comes back waits for their own restore only, not for another kernel's suspend too.
A restore that needs room while such a suspend is under way waits for it rather than choose
another victim. That room is also kept as kernels grow on a GPU: after a cell of a kernel that
holds memory there (:meth:`RoomMaker.hold_growth`), the same way, for the reason ``gpu-memory``.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import psutil
from jupyter_events import EventLogger
from traitlets import TraitError

from ..core.errors import GPUCRError, PreconditionError
from ..core.gpu import gpus
from ..core.process.procs import tree_rss
from ..core.sizes import human, parse_size
from ..core.storage.store import Checkpoint, Store
from .config import GPUCR
from .kernels import DropWarm, Kernels, SuspendKernel
from .lifecycle import RESTORING, RUNNING, SUSPENDED, WAITING, KernelLifecycle

POLICIES = ["lru", "never"]
ROOM_EVENT_ID = "https://events.jupyter.org/jupyter_gpucr/room/v1"
#: What a GPU keeps free beyond a kernel's memory (its CUDA context), as placement asks.
GPU_MARGIN = 256 << 20
#: How long the freed memory of suspended kernels may take to show in NVML.
SETTLE_S = 5.0
MAX_ROUNDS = 4


# -- the decision --------------------------------------------------------------------------
@dataclass(frozen=True)
class Resident:
    """A kernel holding memory where room is wanted."""

    kernel_id: str
    bytes: int
    last_used: float  # epoch seconds
    owner: int | None = None  # uid
    busy: bool = False
    running: bool = True  # False: suspending, pending a suspend, or being restored


@dataclass(frozen=True)
class Place:
    """Where a kernel's memory can go: a GPU, or the host memory budget."""

    key: str  # the GPU's UUID, or "host"
    where: str  # "on GPU 0", "in host memory"
    free: int  # for kernels, the room reserved for others taken off
    residents: tuple[Resident, ...] = ()
    target: str | None = None  # the GPU index a restore is told


@dataclass(frozen=True)
class Rules:
    """The operator's policy (``c.GPUCR``) and who asks, at one moment."""

    now: float
    policy: str = "lru"
    min_resident_s: float = 300.0
    evict_others: bool = False
    owner: int | None = None


def why_kept(r: Resident, rules: Rules) -> str | None:
    """Why ``r`` may not be suspended to make room; None: it may."""
    if not r.running:
        return "being suspended or restored"
    if r.busy:
        return "running a cell"
    if rules.now - r.last_used < rules.min_resident_s:
        return f"used in the last {rules.min_resident_s:g} s"
    if r.owner != rules.owner and not rules.evict_others:
        return "another user's"
    return None


@dataclass(frozen=True)
class Decision:
    need: int
    place: Place | None  # None: no room can be made
    victims: tuple[Resident, ...] = ()
    why: str = ""  # no room: why, and when there may be

    @property
    def message(self) -> str:
        """What the waiting user reads."""
        if self.place is None:
            return self.why
        n = len(self.victims)
        if not n:
            return f"room {self.place.where}"
        return f"waiting for room {self.place.where}: suspending {n} idle kernel{'s' if n > 1 else ''}"


def decide(need: int, places: list[Place], rules: Rules) -> Decision:
    """Room for ``need`` bytes: the first place that has it; else the place where suspending the
    fewest kernels (the user's own first, least recently used first) makes it; else why not."""
    for p in places:
        if p.free >= need:
            return Decision(need, p)
    if rules.policy == "lru":
        options = []
        for i, p in enumerate(places):
            movable = sorted((r for r in p.residents if why_kept(r, rules) is None),
                             key=lambda r: (r.owner != rules.owner, r.last_used))
            freed, victims = p.free, []
            for r in movable:
                if freed >= need:
                    break
                victims.append(r)
                freed += r.bytes
            if freed >= need:
                options.append((len(victims), sum(v.bytes for v in victims), i, tuple(victims)))
        if options:
            _, _, i, chosen = min(options)
            return Decision(need, places[i], chosen)
    return Decision(need, None, why=_why_not(need, places, rules))


def keep_free(place: Place, headroom: int, rules: Rules, spare: Collection[str] = ()) -> Decision | None:
    """What keeps ``headroom`` free at ``place`` for the kernels to come: None while it is free;
    else the idle kernels to suspend there as :func:`decide` chooses them, never those in
    ``spare`` (the kernel room was just made for, those that just ran a cell), or no place and why."""
    if place.free >= headroom:
        return None
    return decide(headroom, [_without(place, set(spare))], rules)


def _why_not(need: int, places: list[Place], rules: Rules) -> str:
    if not places:
        return f"Nowhere to put {human(need)}."
    parts = []
    for p in places:
        kept: dict[str, int] = {}
        for r in p.residents:
            reason = why_kept(r, rules) or "not enough"
            kept[reason] = kept.get(reason, 0) + 1
        held = ", ".join(f"{n} {why}" for why, n in kept.items()) or "no kernel of this server"
        parts.append(f"{p.where} {human(max(p.free, 0))} free ({held})")
    policy = " and c.GPUCR.room_policy is 'never'" if rules.policy == "never" else ""
    return f"No room for {human(need)}{policy}: " + "; ".join(parts) + "."


def _hint(places: list[Place], rules: Rules) -> str:
    recent = [r.last_used for p in places for r in p.residents
              if r.running and not r.busy and rules.now - r.last_used < rules.min_resident_s]
    wait = f" or retry in {rules.min_resident_s - (rules.now - max(recent)):.0f} s, when an idle kernel may be suspended for it" \
        if recent and rules.policy == "lru" else ""
    return f"Suspend or shut down a kernel{wait}. Nothing was changed; the checkpoint is kept."


# -- measuring and making it -------------------------------------------------------------------
def room_event_schema() -> dict[str, Any]:
    return {
        "$id": ROOM_EVENT_ID, "version": "1", "title": "gpucr room", "personal-data": True,
        "description": "A kernel needed room for its memory: where, how much, and which idle kernels were suspended.",
        "type": "object", "required": ["kernel_id", "outcome", "need", "message"],
        "properties": {
            "kernel_id": {"type": "string", "description": "The kernel that needs the room."},
            "for": {"enum": ["restore", "start", "headroom", "budget"],
                    "description": "headroom: room made ahead, in the background (c.GPUCR.room_headroom), after a "
                                   "restore or start, or after a cell of the kernel that grew into it on a GPU; "
                                   "budget: the kernels grew past c.GPUCR.host_memory_budget."},
            "outcome": {"enum": ["fits", "suspending", "refused"]},
            "where": {"type": ["string", "null"], "description": "'on GPU 0', 'in host memory'; null: refused."},
            "need": {"type": "integer", "description": "Bytes."},
            "free": {"type": ["integer", "null"], "description": "Bytes free there before any suspend."},
            "victims": {"type": "array", "items": {"type": "string"},
                        "description": "The idle kernels suspended for it, least recently used first."},
            "policy": {"type": "string", "description": "c.GPUCR.room_policy."},
            "message": {"type": "string", "description": "What the waiting user reads, or why no room can be made."},
        },
    }


@dataclass(frozen=True)
class Need:
    """What a kernel asks for: bytes and where they may go."""

    bytes: int
    places: Callable[[set[str]], list[Place]]  # the places now, given the kernels not to count


class RoomMaker:
    """Makes room for the kernels of one server; see the module docstring."""

    def __init__(self, config: GPUCR, log: Any, lifecycle: KernelLifecycle, kernel_manager: Kernels, store: Store,
                 suspend: SuspendKernel, drop_warm: DropWarm, event_logger: EventLogger | None = None) -> None:
        self.options = config
        self.log = log
        self.lifecycle = lifecycle
        self.kernel_manager = kernel_manager
        self.store = store
        self._suspend_kernel = suspend  # the suspender's: the kernel, suspended for the reason given
        self._drop_warm = drop_warm  # processes started ahead of restores, stopped before any kernel is suspended
        self.event_logger = event_logger
        self._lock = asyncio.Lock()
        self._reserved: dict[str, dict[str, int]] = {}  # kernel id -> place key -> bytes
        self._owners: dict[str, int | None] = {}
        self._arrived: dict[str, float] = {}  # kernel id -> when it started or room was last made for it (epoch seconds)
        self._freeing: dict[str, asyncio.Task[None]] = {}  # place key -> the suspend ahead under way there
        self._over_budget_said = False  # the budget is passed and nothing may be suspended: logged once
        self._short_said: set[str] = set()  # places short of the headroom where nothing may be suspended: logged once
        if event_logger is not None and ROOM_EVENT_ID not in event_logger.schemas.schema_ids:
            event_logger.register_event_schema(room_event_schema())

    def host_budget(self) -> int:
        return parse_size(self.options.host_memory_budget, psutil.virtual_memory().total)

    def rules(self, kernel_id: str | None) -> Rules:
        """The policy now, for ``kernel_id``'s owner (None: this server's user)."""
        return Rules(time.time(), self.options.room_policy, self.options.min_resident_s, self.options.evict_others,
                     self._owner(kernel_id) if kernel_id else os.getuid())

    # -- the two callers ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def for_restore(self, kernel_id: str, ckpt: Checkpoint, gpu: str) -> AsyncIterator[str]:
        """Room for a suspended kernel's checkpoint, held while the block restores it; yields
        the GPU to restore onto (``gpu`` unless room was made on a particular one)."""
        needs, target = [], gpu
        used = ckpt.manifest.get("gpu", {}).get("used", [])
        models = {g.name for g in gpus.list_gpus()}
        if len(used) == 1 and used[0]["name"] in models:  # else placement alone decides, and says why not
            beside = (ckpt.manifest.get("offload") or {}).get("bytes_by_gpu") or {}
            need = int(used[0]["memory_used"]) + int(beside.get(used[0]["uuid"], 0)) + GPU_MARGIN
            needs.append(Need(need, lambda skip: self.gpu_places(used[0]["name"], used[0]["uuid"], gpu, skip)))
        if self.host_budget():
            needs.append(Need(self._host_need(kernel_id, ckpt), self.host_places))
        async with self._room(kernel_id, "restore", needs) as places:
            target = next((p.target for p in places if p.target is not None), gpu)
            yield target

    def host_room_for_restore(self, kernel_id: str, ckpt: Checkpoint) -> bool:
        """Whether the host memory budget holds the restore of ``ckpt`` now without suspending any
        kernel (no budget: it does)."""
        if not self.host_budget():
            return True
        return self.host_places({kernel_id})[0].free >= self._host_need(kernel_id, ckpt)

    def _host_need(self, kernel_id: str, ckpt: Checkpoint) -> int:
        """What a restore of ``ckpt`` takes of the host memory budget: what the GPU does not hold."""
        gpu_bytes = sum(int(u["memory_used"]) for u in ckpt.manifest.get("gpu", {}).get("used", []))
        return max(self.request(kernel_id), ckpt.size - gpu_bytes)

    @contextlib.asynccontextmanager
    async def for_start(self, kernel_id: str, kernel_spec: Any) -> AsyncIterator[None]:
        """Room for a new kernel's declared memory, held while it starts: in host memory, and on
        the GPU a CUDA program uses unless told otherwise (GPU 0; the first of the kernel's
        ``CUDA_VISIBLE_DEVICES``)."""
        needs = []
        need = self.request(kernel_id, kernel_spec)
        if need and self.host_budget():
            needs.append(Need(need, self.host_places))
        metadata = getattr(kernel_spec, "metadata", None) or {}
        gpu_need = parse_size(metadata.get("gpucr_gpu_memory", self.options.kernel_gpu_memory))
        first = _visible_gpu(getattr(kernel_spec, "env", None) or {}, gpus.list_gpus(), 0)
        if gpu_need and first is not None:
            needs.append(Need(gpu_need + GPU_MARGIN, lambda skip: self.gpu_places(first.name, first.uuid, first.uuid, skip)))
        try:
            async with self._room(kernel_id, "start", needs):
                self._arrived[kernel_id] = time.time()  # it has no last activity until it is ready: it counts as just used
                yield
        except BaseException:
            self.forget(kernel_id)  # what was noted for a start that did not happen
            raise

    def gpu_room_for_context(self, kernel_spec: Any, devices: Iterable[int]) -> bool:
        """Whether each GPU a kernel of ``kernel_spec`` numbers ``devices`` (its ``cuda:N``) has room
        for a CUDA context now, beside the room reserved for others, without suspending any kernel."""
        machine = gpus.list_gpus()
        env = getattr(kernel_spec, "env", None) or {}
        for index in devices:
            g = _visible_gpu(env, machine, index)
            if g is None or self._gpu_place(g, set()).free < GPU_MARGIN:
                return False
        return True

    def request(self, kernel_id: str, kernel_spec: Any = None) -> int:
        """The memory a kernel is declared to take (kernelspec metadata ``gpucr_memory``, else
        ``c.GPUCR.kernel_memory``): counted against the host budget until its RSS is larger."""
        if kernel_spec is None and kernel_id in self.kernel_manager:
            kernel_spec = self.kernel_manager.get_kernel(kernel_id).kernel_spec
        metadata = getattr(kernel_spec, "metadata", None) or {}
        return parse_size(metadata.get("gpucr_memory", self.options.kernel_memory))

    def forget(self, kernel_id: str) -> None:
        """The kernel was shut down, or its restart replaces its process: drop what was noted of it."""
        self._arrived.pop(kernel_id, None)
        self._owners.pop(kernel_id, None)

    # -- the work -------------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _room(self, kernel_id: str, why: str, needs: list[Need]) -> AsyncIterator[list[Place]]:
        chosen: list[Place] = []
        try:
            for need in needs:
                chosen.append(await self._make(kernel_id, why, need))
            yield chosen
        finally:
            self._reserved.pop(kernel_id, None)
        self._arrived[kernel_id] = time.time()
        if chosen and self.headroom():
            for need, place in zip(needs, chosen):
                self._ahead(kernel_id, need, place.key)

    def headroom(self) -> int:
        return parse_size(self.options.room_headroom) if self.options.room_policy == "lru" else 0

    def _ahead(self, kernel_id: str, need: Need, key: str, reason: str = "room",
               spare: frozenset[str] = frozenset()) -> None:
        """Start suspending idle kernels (for ``reason``; never ``kernel_id`` nor ``spare``) in the
        background until ``c.GPUCR.room_headroom`` is free at ``key`` again (one pass at a time per place)."""
        running = self._freeing.get(key)
        if running is not None and not running.done():
            return
        task = asyncio.create_task(self._keep_headroom(kernel_id, need, key, reason, spare))
        self._freeing[key] = task
        task.add_done_callback(lambda t: self._freeing.pop(key, None) if self._freeing.get(key) is t else None)

    async def _keep_headroom(self, kernel_id: str, need: Need, key: str, reason: str, spare: frozenset[str]) -> None:
        try:
            await self._suspend_ahead(kernel_id, need, key, reason, spare)
        except Exception:  # a background task: nothing else would report it
            self.log.exception("gpucr: keeping room free failed")

    async def _suspend_ahead(self, kernel_id: str, need: Need, key: str, reason: str, spare: frozenset[str]) -> None:
        headroom = self.headroom()
        async with self._lock:
            rules = self.rules(None)
            place = next((p for p in need.places(set()) if p.key == key), None)
            decision = keep_free(place, headroom, rules, {kernel_id, *spare}) if place else None
            if place is None or decision is None:
                self._short_said.discard(key)
                return
            if decision.place is None:
                if key not in self._short_said:  # once until it is free again, not after every cell
                    self.log.info("gpucr: c.GPUCR.room_headroom is not kept free %s: %s", place.where, decision.why)
                    self._short_said.add(key)
                return
            self._emit(kernel_id, "headroom", "suspending", decision, rules)
            victims = ", ".join(v.kernel_id for v in decision.victims)
            if reason == "gpu-memory":
                self.log.warning("gpucr: kernel %s grew %s, leaving less than %s free there: suspending %s (least "
                                 "recently used, idle)", kernel_id, place.where, human(headroom), victims)
            else:
                self.log.info("gpucr: keeping %s free %s: suspending %s ahead (least recently used, idle)",
                              human(headroom), place.where, victims)
        for victim in decision.victims:
            try:
                await self._suspend_kernel(victim.kernel_id, reason)
            except GPUCRError as e:
                self.log.warning("gpucr: kernel %s was not suspended ahead to keep room free: %s", victim.kernel_id, e)
        await self._settle(Need(headroom, need.places), key, skip=set())

    async def hold_growth(self, cells_ended: frozenset[str]) -> None:
        """What kernels grew into (``pressure.GrowthChecks``): the host memory budget, and after the
        cells of ``cells_ended`` the room kept free on their GPUs."""
        await self.hold_budget()
        self.keep_gpu_headroom(cells_ended)

    def keep_gpu_headroom(self, cells_ended: frozenset[str]) -> None:
        """``c.GPUCR.room_headroom`` on each GPU where a kernel of ``cells_ended`` holds memory (GPU
        memory grows in cells): where less is free, idle kernels there are suspended in the background
        as after a restore, reason ``gpu-memory``, never those of ``cells_ended``."""
        if not cells_ended or not self.headroom():
            return
        need = Need(self.headroom(), self._gpus_now)
        for place in need.places(set()):
            grown = next((r.kernel_id for r in place.residents if r.kernel_id in cells_ended), None)
            if grown is not None and place.free < need.bytes:
                self._ahead(grown, need, place.key, "gpu-memory", cells_ended)

    async def hold_budget(self) -> None:
        """The host memory budget as kernels grow (every ``budget_check_interval``): when what the
        kernels hold has passed it, suspend idle kernels, least recently used first and under the
        make-room rules, until it holds. Skipped while room is being made (that holds the budget)."""
        if not self.host_budget() or self.options.room_policy != "lru" or self._lock.locked():
            return
        async with self._lock:
            rules = self.rules(None)
            [place] = self.host_places(set())
            if place.free >= 0:
                self._over_budget_said = False
                return
            decision = decide(0, [place], rules)
            if decision.place is None or not decision.victims:
                if not self._over_budget_said:  # once per excess, not every few seconds
                    self.log.warning("gpucr: the kernels hold %s more than the host memory budget, and none may be "
                                     "suspended: %s", human(-place.free), decision.why)
                    self._over_budget_said = True
                return
            self._emit(decision.victims[0].kernel_id, "budget", "suspending", decision, rules)
            self.log.warning("gpucr: the kernels hold %s more than the host memory budget: suspending %s (least "
                             "recently used, idle)", human(-place.free), ", ".join(v.kernel_id for v in decision.victims))
        for victim in decision.victims:
            try:
                await self._suspend_kernel(victim.kernel_id, "memory")
            except GPUCRError as e:
                self.log.warning("gpucr: kernel %s was not suspended to hold the host memory budget: %s",
                                 victim.kernel_id, e)

    async def _suspends_ahead(self, key: str) -> bool:
        """Wait for the suspend ahead under way at ``key``, if any; whether there was one."""
        task = self._freeing.get(key)
        if task is None or task.done():
            return False
        await asyncio.shield(task)
        return True

    async def _make(self, kernel_id: str, why: str, need: Need) -> Place:
        """Decide, suspend what the decision names, and again until it fits; then reserve."""
        tried: set[str] = set()  # kernels whose suspend failed: not asked twice
        async with self._lock:
            for _ in range(MAX_ROUNDS):
                rules = self.rules(kernel_id)
                places = need.places({kernel_id})
                decision = decide(need.bytes, [_without(p, tried) for p in places], rules)
                if (decision.place is None or decision.victims) and await self._warm_give_way(kernel_id, places):
                    continue
                if decision.victims and await self._suspends_ahead(decision.place.key):
                    continue
                if decision.place is None:
                    self._emit(kernel_id, why, "refused", decision, rules)
                    raise PreconditionError(decision.why, _hint(places, rules))
                if not decision.victims:
                    self._reserved.setdefault(kernel_id, {})[decision.place.key] = need.bytes
                    self._emit(kernel_id, why, "fits", decision, rules)
                    return decision.place
                self._emit(kernel_id, why, "suspending", decision, rules)
                self.log.warning("gpucr: kernel %s %s: suspending %s (least recently used, idle)", kernel_id,
                                 decision.message, ", ".join(v.kernel_id for v in decision.victims))
                await self._suspend(kernel_id, why, decision, tried)
                await self._settle(need, decision.place.key, skip={kernel_id})
            raise PreconditionError(f"No room could be made for {human(need.bytes)} after {MAX_ROUNDS} rounds of "
                                    "suspending idle kernels.", "Try again; the checkpoint is kept.")

    async def _warm_give_way(self, kernel_id: str, places: list[Place]) -> int:
        """Stop processes started ahead of restores before any kernel is suspended (they hold nothing
        of the user's): every one where host memory is wanted, those holding a CUDA context on the
        GPUs wanted. How many were stopped."""
        if any(p.key == "host" for p in places):
            return await self._drop_warm(but=kernel_id)
        return await self._drop_warm(but=kernel_id, among={r.kernel_id for p in places for r in p.residents})

    async def _suspend(self, kernel_id: str, why: str, decision: Decision, tried: set[str]) -> None:
        waiting = why == "restore" and self.lifecycle.state_of(kernel_id) == RESTORING
        room = {"where": decision.place.where if decision.place else None, "need": decision.need,
                "suspending": [v.kernel_id for v in decision.victims], "message": decision.message}
        if waiting:
            self.lifecycle.transition(kernel_id, WAITING, "waiting-for-room", room=room)
        try:
            for victim in decision.victims:
                try:
                    await self._suspend_kernel(victim.kernel_id, "room")
                except GPUCRError as e:
                    tried.add(victim.kernel_id)
                    self.log.warning("gpucr: kernel %s was not suspended to make room: %s", victim.kernel_id, e)
                    continue
                self.lifecycle.transition(victim.kernel_id, SUSPENDED, "done", made_room_for=kernel_id)
        finally:
            if waiting:
                self.lifecycle.transition(kernel_id, RESTORING, "restoring", room=None)

    async def _settle(self, need: Need, key: str, skip: set[str]) -> None:
        """Until the suspended kernels' memory shows as free (NVML lags the exit by a moment); what
        the ``skip`` kernels hold counts as free, as for :meth:`_make` (none for room made ahead)."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            place = next((p for p in need.places(skip) if p.key == key), None)
            if place is None or place.free >= need.bytes:
                return
            await asyncio.sleep(0.1)

    def _emit(self, kernel_id: str, why: str, outcome: str, d: Decision, rules: Rules) -> None:
        if outcome == "refused":
            self.log.warning("gpucr: no room for kernel %s: %s", kernel_id, d.why)
        if self.event_logger is None:
            return
        self.event_logger.emit(schema_id=ROOM_EVENT_ID, data={
            "kernel_id": kernel_id, "for": why, "outcome": outcome, "where": d.place.where if d.place else None,
            "need": d.need, "free": d.place.free if d.place else None, "victims": [v.kernel_id for v in d.victims],
            "policy": rules.policy, "message": d.message})

    # -- measuring ------------------------------------------------------------------------
    def _owner(self, kernel_id: str) -> int | None:
        """The uid the kernel runs as (its process record), else this server's."""
        if kernel_id not in self._owners:
            try:
                self._owners[kernel_id] = self.store.read_proc(kernel_id).get("uid", os.getuid())
            except (GPUCRError, OSError, ValueError):
                self._owners[kernel_id] = os.getuid()
        return self._owners[kernel_id]

    def _pids(self) -> dict[str, int]:
        """Kernels with a process now, by id."""
        out = {}
        for kernel_id in self.kernel_manager.list_kernel_ids():
            pid = getattr(self.kernel_manager.get_kernel(kernel_id).provisioner, "kernel_pid", None)
            if pid:
                out[kernel_id] = pid
        return out

    def _resident(self, kernel_id: str, nbytes: int) -> Resident:
        km = self.kernel_manager.get_kernel(kernel_id)
        try:
            last = getattr(km, "last_activity", None)
        except TraitError:  # a kernel still starting has none yet: its arrival (for_start) counts
            last = None
        used = max(last.timestamp() if last else 0.0, self._arrived.get(kernel_id, 0.0))
        return Resident(kernel_id, nbytes, used, self._owner(kernel_id),
                        busy=getattr(km, "execution_state", "") == "busy",
                        running=self.lifecycle.state_of(kernel_id) == RUNNING)

    def _reserved_on(self, key: str, skip: Iterable[str]) -> dict[str, int]:
        return {k: r[key] for k, r in self._reserved.items() if key in r and k not in skip}

    def host_places(self, skip: set[str]) -> list[Place]:
        """The host memory budget, less what the kernels hold: the larger of their RSS and their
        declared memory, and the room reserved for those being restored or started."""
        reserved = self._reserved_on("host", skip)
        held: dict[str, int] = {}
        for kernel_id, pid in self._pids().items():
            if kernel_id in skip:
                continue
            try:
                rss = tree_rss(pid)
            except (psutil.Error, OSError):
                continue
            held[kernel_id] = max(rss, self.request(kernel_id), reserved.get(kernel_id, 0))
        used = sum(held.values()) + sum(b for k, b in reserved.items() if k not in held)
        residents = tuple(self._resident(k, b) for k, b in held.items())
        return [Place("host", "in host memory", self.host_budget() - used, residents)]

    def gpu_places(self, model: str, original: str, spec: str | None, skip: set[str]) -> list[Place]:
        """The GPUs of ``model`` (the one named by ``spec``, or any: the original first, then the
        freest), each with the kernels of this server on it."""
        machine = gpus.list_gpus()
        wanted = gpus.parse_gpu_spec(spec, machine)
        cands = [wanted] if wanted else sorted((g for g in machine if g.name == model),
                                                key=lambda g: (g.uuid != original, -g.memory_free))
        return [self._gpu_place(g, skip) for g in cands if g.name == model]

    def _gpus_now(self, skip: set[str]) -> list[Place]:
        return [self._gpu_place(g, skip) for g in gpus.list_gpus()]

    def _gpu_place(self, g: gpus.Gpu, skip: set[str]) -> Place:
        """GPU ``g``; what the ``skip`` kernels hold on it counts as free: it is part of what they
        ask for (a kernel started ahead of its restore holds its CUDA context already)."""
        by_pid = self.kernel_manager.kernels_by_pid()
        held: dict[str, int] = {}
        own = 0
        for pid, nbytes in g.processes.items():
            kernel_id = by_pid.get(pid)
            if kernel_id in skip:
                own += nbytes
            elif kernel_id is not None:
                held[kernel_id] = held.get(kernel_id, 0) + nbytes
        free = g.memory_free + own - sum(self._reserved_on(g.uuid, skip).values())
        return Place(g.uuid, f"on GPU {g.index}", free, tuple(self._resident(k, b) for k, b in held.items()),
                     target=str(g.index))

    # -- the report -----------------------------------------------------------------------
    def report(self) -> list[dict[str, Any]]:
        """What each GPU (and the host budget, when set) holds, and how much of it is held by idle
        kernels that could be suspended to make room now (by this server's policy)."""
        rules = self.rules(None)
        out = []
        for g in gpus.list_gpus():
            place = self._gpu_place(g, set())
            out.append({"where": f"GPU {g.index}", "index": g.index, "uuid": g.uuid, "name": g.name,
                        "total": g.memory_total, "used": g.memory_used, "free": g.memory_free,
                        **_holdings(place, rules)})
        budget = self.host_budget()
        if budget:
            place = self.host_places(set())[0]
            out.append({"where": "host memory", "total": budget, "used": budget - place.free, "free": place.free,
                        **_holdings(place, rules)})
        return out


def _visible_gpu(env: dict[str, str], machine: list[gpus.Gpu], index: int) -> gpus.Gpu | None:
    """The GPU a kernel's CUDA programs call ``cuda:index`` (``cuda:0``: the one they take by default)."""
    visible = [v.strip() for v in (env.get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES") or "").split(",")
               if v.strip()]
    if visible and index >= len(visible):
        return None
    try:
        return gpus.parse_gpu_spec(visible[index] if visible else str(index), machine) if machine else None
    except GPUCRError:
        return None


def _without(p: Place, kernel_ids: set[str]) -> Place:
    if not kernel_ids:
        return p
    return Place(p.key, p.where, p.free, tuple(r for r in p.residents if r.kernel_id not in kernel_ids), p.target)


def _holdings(place: Place, rules: Rules) -> dict[str, Any]:
    kernels = [{"kernel_id": r.kernel_id, "bytes": r.bytes, "idle_s": round(rules.now - r.last_used, 1),
                "kept": why_kept(r, rules)} for r in sorted(place.residents, key=lambda r: r.last_used)]
    return {"held_by_kernels": sum(k["bytes"] for k in kernels),
            "idle": sum(k["bytes"] for k in kernels if k["kept"] is None), "kernels": kernels}

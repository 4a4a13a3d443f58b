"""One state machine per kernel: ``running -> [suspend-pending ->] suspending -> suspended ->
restoring [-> waiting-for-room -> restoring] -> running``, with the failure edges
``suspending -> running`` (the kernel keeps running) and ``restoring`` or ``waiting-for-room ->
suspended`` (the checkpoint is kept). A restore waits for room while idle kernels are suspended
to make it (``room.py``). With object storage a suspend passes through ``uploading`` (the kernel
is on this node's disk, its upload under way) before ``suspended`` (every object in the store).

:meth:`KernelLifecycle.transition` is the only place a state changes, and every change is
emitted on jupyter_server's event bus with the kernel's whole state, so the REST API, the events
and the UI cannot disagree, and a client needs no request after an event. The kernel state's shape
is ``schemas/kernel-state.json``; the event schema is derived from it.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Final

from jupyter_events import EventLogger
from traitlets import Instance
from traitlets.config import LoggingConfigurable

from ..core.errors import GPUCRError, StateError
from ..core.gpu.gpus import GpuUse
from ..core.storage.store import CheckpointSummary
from .records import EngineName, Failure, Kind, LostItem, Phase, Progress, RoomWait, StateName

STATE_SCHEMA_PATH = Path(__file__).parent / "schemas" / "kernel-state.json"
EVENT_SCHEMA_ID = "https://events.jupyter.org/jupyter_gpucr/kernel-state/v1"
PHASES = ["trimming", "gpu-checkpoint", "dumping", "verifying", "done", "restoring", "gpu-restore", "failed",
          "pending", "cancelled", "waiting-for-room", "uploading", "downloading"]

RUNNING: Final = "running"
PENDING: Final = "suspend-pending"
SUSPENDING: Final = "suspending"
SUSPENDED: Final = "suspended"
RESTORING: Final = "restoring"
WAITING: Final = "waiting-for-room"
UPLOADING: Final = "uploading"
TRANSITIONS: dict[StateName, set[StateName]] = {
    RUNNING: {PENDING, SUSPENDING},
    PENDING: {RUNNING, SUSPENDING},
    SUSPENDING: {RUNNING, SUSPENDED, UPLOADING},
    SUSPENDED: {RESTORING, UPLOADING},
    UPLOADING: {SUSPENDED, RESTORING},
    RESTORING: {RUNNING, SUSPENDED, WAITING},
    WAITING: {RESTORING, SUSPENDED},
}


def state_schema() -> dict[str, Any]:
    return json.loads(STATE_SCHEMA_PATH.read_text())


def event_schema() -> dict[str, Any]:
    """The event bus schema: the whole kernel state, plus what happened (phase) and its bytes.
    Every property is required, so that a client applies an event without asking for the state."""
    props = state_schema()["properties"]
    properties = {
        **props,
        "phase": {"enum": PHASES},
        "bytes_done": {"type": "integer"},
        "bytes_total": {"type": "integer"},
    }
    return {
        "$id": EVENT_SCHEMA_ID,
        "version": "1",
        "title": "gpucr kernel state",
        "personal-data": True,
        "description": "A kernel's suspend/restore state changed, or an operation progressed: the kernel's "
                       "whole state as the server last set it, with the phase and bytes of the change.",
        "type": "object",
        "required": list(properties),
        "properties": properties,
    }


@dataclass
class KernelState:
    """What the REST API reports for one kernel (``schemas/kernel-state.json``)."""

    kernel_id: str
    state: StateName = RUNNING
    kind: Kind = "cpu"
    engine: EngineName | None = None
    engine_reason: str | None = None
    checkpoint: CheckpointSummary | None = None
    gpu: GpuUse | None = None
    progress: Progress | None = None
    notebook_path: str | None = None
    label: str | None = None
    suspended_at: float | None = None
    pending_since: float | None = None
    restored_at: float | None = None
    suspended_for: float | None = None
    lost: list[LostItem] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    hint: str | None = None
    summary: str | None = None
    retryable: bool | None = None
    room: RoomWait | None = None
    made_room_for: str | None = None
    ahead: bool = False
    trim: dict[str, Any] | None = None
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


_FIELDS = {f.name for f in fields(KernelState)}


def failure(err: GPUCRError) -> Failure:
    """The state fields of a failed operation: what it said, what to do, the cause in plain words
    and whether asking again can succeed."""
    return {"error": err.message, "hint": err.hint, "summary": err.summary or None, "retryable": err.retryable}


class KernelLifecycle(LoggingConfigurable):
    """The states of all kernels of one server; see the module docstring."""

    event_logger = Instance(EventLogger, allow_none=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._states: dict[str, KernelState] = {}
        self._labels: dict[str, str] = {}  # kept when a state is replaced (restart, listed again)
        if self.event_logger is not None and EVENT_SCHEMA_ID not in self.event_logger.schemas.schema_ids:
            self.event_logger.register_event_schema(event_schema())

    def get(self, kernel_id: str) -> KernelState:
        """The kernel's state; a kernel gpucr has not touched yet is running."""
        st = self._states.setdefault(kernel_id, KernelState(kernel_id))
        st.label = self._labels.get(kernel_id)
        return st

    def set_label(self, kernel_id: str, label: str) -> None:
        """The label a framework gave the kernel (its run or thread id), to find it again by."""
        self._labels[kernel_id] = label
        self.get(kernel_id)

    def state_of(self, kernel_id: str) -> StateName:
        st = self._states.get(kernel_id)
        return st.state if st else RUNNING

    def is_on_disk(self, kernel_id: str) -> bool:
        """Suspended (or uploading) or being restored: there is no kernel process to talk to."""
        return self.state_of(kernel_id) in (SUSPENDED, RESTORING, WAITING, UPLOADING)

    def is_suspending(self, kernel_id: str) -> bool:
        return self.state_of(kernel_id) == SUSPENDING

    def kernel_ids_in(self, state: StateName) -> list[str]:
        return [k for k, st in self._states.items() if st.state == state]

    def transition(self, kernel_id: str, to: StateName, phase: Phase, **changes: Any) -> KernelState:
        """Move the kernel to ``to`` (checked against :data:`TRANSITIONS`), apply ``changes`` and
        emit the event; ``StateError`` when the move is not allowed from the current state."""
        st = self.get(kernel_id)
        if to != st.state and to not in TRANSITIONS[st.state]:
            raise StateError(f"The kernel is {st.state}; it cannot become {to} now.",
                             "Wait until the current operation finished, then try again.")
        unknown = set(changes) - _FIELDS
        if unknown:
            raise TypeError(f"Unknown kernel state fields: {sorted(unknown)}")
        st.state = to
        if "error" in changes:  # a new error (or none): the last one's summary no longer applies
            st.summary = st.retryable = None
        for name, value in changes.items():
            setattr(st, name, value)
        if to == RUNNING:
            st.suspended_at = st.pending_since = st.made_room_for = None
            st.ahead = False
        if to != PENDING:
            st.pending_since = None
        self.log.debug("gpucr: kernel %s is %s (%s)", kernel_id, to, phase)
        self._emit(st, phase)
        return st

    def progress(self, kernel_id: str, phase: str, done: int = 0, total: int = 0) -> None:
        """An operation advanced; the state stays."""
        self._emit(self.get(kernel_id), phase, done, total)

    def adopt(self, st: KernelState) -> None:
        """Take a state built elsewhere (a kernel listed again at server start)."""
        st.label = self._labels.get(st.kernel_id)
        self._states[st.kernel_id] = st
        self._emit(st, "done")

    def forget(self, kernel_id: str) -> None:
        self._states.pop(kernel_id, None)

    def _emit(self, st: KernelState, phase: str, done: int = 0, total: int = 0) -> None:
        st.progress = {"phase": phase, "bytes_done": int(done), "bytes_total": int(total)}
        if self.event_logger is None:
            return
        # A copy (to_dict is deep): listeners run later, the state changes on.
        data = {**st.to_dict(), "phase": phase, "bytes_done": int(done), "bytes_total": int(total)}
        self.event_logger.emit(schema_id=EVENT_SCHEMA_ID, data=data)

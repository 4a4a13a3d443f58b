"""The shapes of what the server reports of a kernel (``schemas/kernel-state.json``), typed so
that a misspelt state or field is a type error, not a silent ``None`` in a client."""
from __future__ import annotations

from typing import Literal, TypedDict

from ..core.gpu.gpus import GpuUse
from ..core.storage.store import CheckpointSummary

#: The lifecycle (``lifecycle.py``): ``suspend-pending`` waits for the running cell,
#: ``waiting-for-room`` for idle kernels to be suspended, ``uploading`` for object storage.
StateName = Literal["running", "suspend-pending", "suspending", "suspended", "restoring", "waiting-for-room",
                    "uploading"]
#: What a state change or a progress report says happened.
Phase = Literal["trimming", "gpu-checkpoint", "dumping", "verifying", "done", "restoring", "gpu-restore", "failed",
                "pending", "cancelled", "waiting-for-room", "uploading", "downloading", "saving-variables"]
Kind = Literal["cpu", "gpu"]
EngineName = Literal["criu", "snapshot"]  # as manifests and checkpoint summaries say


class Progress(TypedDict):
    """The running operation's phase and bytes."""

    phase: str
    bytes_done: int
    bytes_total: int


class LostItem(TypedDict, total=False):
    """Something a saved-variables restore could not bring back."""

    name: str
    type: str
    reason: str


class RoomWait(TypedDict):
    """What a restore in ``waiting-for-room`` waits for (``room.py``)."""

    where: str | None
    need: int
    suspending: list[str]
    message: str


class Failure(TypedDict):
    """The state fields of a failed operation (``lifecycle.failure``)."""

    error: str
    hint: str
    summary: str | None
    retryable: bool


__all__ = ["CheckpointSummary", "EngineName", "Failure", "GpuUse", "Kind", "LostItem", "Phase", "Progress",
           "RoomWait", "StateName"]

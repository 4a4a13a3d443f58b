"""Errors that tell the user what failed, why, and what to do about it.

Every public operation raises a subclass of :class:`GPUCRError`; its ``hint`` is the
"what you can do" half of the message, kept apart so the CLI, REST and UI can show it.
"""
from __future__ import annotations

from typing import Any


class GPUCRError(Exception):
    """Base class: ``message`` says what happened, ``hint`` what the user can do, ``summary`` the
    cause in a few plain words (no ids, no CRIU text: what a notification says first), and
    ``retryable`` whether asking again, unchanged, can succeed (a port freed, room made, a lock
    released) rather than fail the same way (a damaged checkpoint)."""

    #: HTTP status the server extension answers with.
    status = 500
    #: The summary when none is given; "" says the message is short and plain already.
    default_summary = ""
    retryable = True

    def __init__(self, message: str, hint: str = "", *, summary: str | None = None,
                 retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.summary = self.default_summary if summary is None else summary
        if retryable is not None:
            self.retryable = retryable

    def __str__(self) -> str:
        return f"{self.message} {self.hint}".strip()

    def to_dict(self) -> dict[str, Any]:
        return {"error": type(self).__name__, "message": self.message, "hint": self.hint,
                "summary": self.summary or self.message, "retryable": self.retryable}


class InvalidNameError(GPUCRError):
    status = 400
    retryable = False


class NotFoundError(GPUCRError):
    status = 404


class BusyError(GPUCRError):
    """Another operation holds the process or checkpoint."""

    status = 409


class StateError(GPUCRError):
    """The operation does not fit the current state (already running, not running...)."""

    status = 409
    retryable = False


class PreconditionError(GPUCRError):
    """A check before acting failed (disk, RAM, GPU memory, privileges); nothing was touched."""

    status = 507


class CheckpointDamagedError(GPUCRError):
    """Checksums or manifest do not match; the checkpoint is kept for inspection."""

    status = 422
    default_summary = "The saved state is damaged"
    retryable = False


class IncompatibleCheckpointError(GPUCRError):
    """The checkpoint was made on another driver, GPU model or engine version."""

    status = 422
    default_summary = "The saved state was made for another GPU, driver or version"
    retryable = False


class EngineError(GPUCRError):
    """CRIU or the CUDA driver failed; the message carries the translated reason."""

    status = 500


class AddressInUseError(EngineError):
    """A restore found a port (or UNIX socket name) the process had bound taken by another socket;
    the message names its holder where it can. Nothing was started and the checkpoint is kept: a
    retry once the holder let it go succeeds, hence a conflict, not a failure of the engine."""

    status = 409


class PutBackError(EngineError):
    """A checkpoint could not be finished, and the process was restored from its images: it runs
    again, under a new host PID (``started``), which whoever tracked the old one must adopt. From
    the daemon, ``started`` is first what its restore answers (a dict), which its client turns
    into the process it tracks."""

    def __init__(self, message: str, hint: str = "", started: object = None, *, summary: str | None = None,
                 retryable: bool | None = None) -> None:
        super().__init__(message, hint, summary=summary, retryable=retryable)
        self.started = started

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), **({"started": self.started} if isinstance(self.started, dict) else {})}


class AccessRefusedError(GPUCRError):
    """Restoring would give a process more than its owner may have (a file they may not open,
    credentials they do not hold); nothing was started and the checkpoint is kept."""

    status = 403
    default_summary = "The saved state needs access its owner does not have"
    retryable = False

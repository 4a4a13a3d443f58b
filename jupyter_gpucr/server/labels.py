"""Kernel labels: an agent framework starts a kernel with a label (its run or thread id) and
finds "its" kernel again by it, also after the server or gateway restarted (as LangGraph keeps
an E2B sandbox id in its state). Given at start as ``KERNEL_GPUCR_LABEL`` in the start request's
``env`` (Kernel Gateway passes ``KERNEL_*`` variables on) or as ``gpucr_label`` in the
kernelspec's metadata, or set later with ``PUT /api/gpucr/kernels/ID/label``. Kept beside the
kernel's process files, where the next server lists it from."""
from __future__ import annotations

from typing import Any

from ..core.errors import InvalidNameError
from ..core.storage.store import Store

ENV = "KERNEL_GPUCR_LABEL"
SPEC_KEY = "gpucr_label"
MAX_LENGTH = 200
_FILE = "label"


def check(label: Any) -> str:
    """The label, or a 400 error that says what a label may be."""
    if not isinstance(label, str) or not label.strip() or len(label) > MAX_LENGTH or not label.isprintable():
        raise InvalidNameError(f"A kernel label is a printable string of 1 to {MAX_LENGTH} characters, not {label!r}.",
                               "Use the agent's run or thread id.")
    return label


def given_at_start(env: dict[str, str] | None, spec_metadata: dict[str, Any]) -> str | None:
    label = (env or {}).get(ENV) or spec_metadata.get(SPEC_KEY)
    return check(label) if label else None


def save(store: Store, kernel_id: str, label: str) -> None:
    (store.proc_dir(kernel_id) / _FILE).write_text(label)


def load(store: Store, kernel_id: str) -> str | None:
    path = store.procs_root / kernel_id / _FILE
    return path.read_text() if path.is_file() else None

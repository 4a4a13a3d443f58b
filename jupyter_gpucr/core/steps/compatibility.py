"""Whether this node can restore a whole-process checkpoint, checked before anything is touched."""
from __future__ import annotations

from typing import Any, cast

from ..criu import nodecompat
from ..errors import IncompatibleCheckpointError
from ..storage.store import Checkpoint


def check_compatible(ckpt: Checkpoint, criu_path: str) -> None:
    """Refuse checkpoints this machine cannot restore (``criu_path``: the CRIU that would)."""
    m = ckpt.manifest
    if m.get("engine") != "criu":
        raise IncompatibleCheckpointError(f"Checkpoint {ckpt.id} was made by the {m.get('engine')} engine.",
                                          "Restore it through the Jupyter server, which runs that engine.")
    facts = cast(dict[str, Any], m)
    found = nodecompat.problems(ckpt.path, facts, criu_path)
    if found:
        raise IncompatibleCheckpointError(
            f"Checkpoint {ckpt.id} cannot run on this node: {'; '.join(found + nodecompat.differences(facts))}.",
            "Restore it on a node like the one that made it (same CPU features, NVIDIA driver and GPU model); a "
            "Jupyter server with c.GPUCR.portable_fallback restores the kernel's variables instead. The checkpoint "
            "is kept.")

"""Whether this process may checkpoint and restore other processes (root or the CRIU capabilities)."""
from __future__ import annotations

import os
from dataclasses import dataclass

CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_CHECKPOINT_RESTORE = 21, 19, 40


@dataclass
class Check:
    """One line of a capability report: what was checked, whether it holds, how to fix it.
    ``required``: whether checkpointing needs it; one that does not and fails is a note."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    required: bool = True

    @property
    def severity(self) -> str:
        """``ok``; ``note`` (something to know: suspend and restore work); ``fail`` (they do not)."""
        return "ok" if self.ok else ("fail" if self.required else "note")


def _effective_caps() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    return 0


def check_privileges() -> Check:
    caps = _effective_caps()
    if os.geteuid() == 0 and caps & (1 << CAP_SYS_ADMIN):
        return Check("privileges", True, "root with CAP_SYS_ADMIN")
    has = caps & (1 << CAP_CHECKPOINT_RESTORE) and caps & (1 << CAP_SYS_PTRACE)
    return Check("privileges", bool(has), "CAP_CHECKPOINT_RESTORE + CAP_SYS_PTRACE" if has else "not root, no checkpoint capabilities",
                 "" if has else "Run as root, or use the snapshot engine (no privileges needed).")

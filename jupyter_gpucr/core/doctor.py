"""What works on this machine for checkpointing, and how to fix what does not: the checks behind
``gpucr doctor`` and the server's ``/api/gpucr/doctor``, which each only show them."""
from __future__ import annotations

import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Protocol, TypedDict, cast

import psutil

from .criu.commands import NETWORK_LOCKS_MAX, Criu, network_locks_held
from .errors import GPUCRError
from .gpu import cuda, gpus
from .hostmemory import free_page_reporting
from .process.privileges import Check, check_privileges
from .sizes import human
from .storage.store import Store

#: Below this much free disk in the store hardly any checkpoint fits (each keeps 64 MiB spare): a
#: failure; below 1 GiB, a note (small processes are checkpointed, larger ones refused).
STORE_DISK_FAIL = 128 << 20


class DaemonProbe(Protocol):
    """The gpucr daemon's client, as far as the engine check asks it (the daemon sits above core)."""

    socket_path: str

    def unavailable_reason(self) -> str | None: ...


class CheckRow(TypedDict):
    name: str
    ok: bool
    detail: str
    fix: str
    required: bool
    severity: str  # ok, note (to know; suspend and restore work) or fail (only these make the report not ok)


class Report(TypedDict):
    ok: bool
    failing: int
    checks: list[CheckRow]


def install_criu_command() -> str:
    """The command that installs CRIU where gpucr finds it, as this installation has it: its own
    CLI (a pip install has no scripts/ folder; a checkout has the CLI too)."""
    beside = Path(sys.executable).with_name("gpucr")  # this environment's CLI
    on_path = shutil.which("gpucr")
    if on_path and (not beside.exists() or Path(on_path) == beside):
        return "gpucr install-criu"
    if beside.exists():
        return f"{beside} install-criu"
    return f"{sys.executable} -m jupyter_gpucr.cli.main install-criu"


def _check_criu(criu_path: str | None) -> list[Check]:
    try:
        criu = Criu(criu_path)
    except GPUCRError as e:
        return [Check("criu", False, e.message,
                      f"Run '{install_criu_command()}' (CRIU 4.2+ beside this Python), or set GPUCR_CRIU to a CRIU 4.2+.")]
    ok, out = criu.check()
    last = out.splitlines()[-1] if out else ""
    paged = criu.lazy_pages_supported
    return [
        Check("criu", True, f"CRIU {criu.version_string} at {criu.path}"),
        Check("criu check", ok, last, "" if ok else "Run 'criu check' as root and read its output."),
        Check("userfaultfd", paged,
              "restores bring memory in with many threads, or lazily" if paged else "not available to CRIU",
              "" if paged else "Restores fall back to CRIU reading the memory with one thread (about 1.5 GB/s). "
              "Needs a kernel with userfaultfd (CONFIG_USERFAULTFD) and its non-cooperative events.", required=False),
        Check("dirty-page tracking", criu.dirty_tracking,
              "save points after the first hold only the pages written since" if criu.dirty_tracking
              else "not in this kernel: every save point is a full dump",
              "" if criu.dirty_tracking else "Unchanged pages are still kept once (the older save point takes them from "
              "the newer after the pause), but each pause is a full dump's. Needs a kernel with CONFIG_MEM_SOFT_DIRTY.",
              required=False),
    ]


def _check_gpu() -> list[Check]:
    driver = gpus.driver_version()
    if driver is None:
        return [Check("nvidia driver", False, "no NVIDIA driver or GPU (NVML did not initialise): "
                      "CPU processes are checkpointed as usual", required=False)]
    major = int(driver.split(".")[0])
    checks = [
        Check("nvidia driver", True, f"driver {driver}"),
        Check("checkpoint API (r570+)", major >= 570, f"driver {driver}", "" if major >= 570 else "Upgrade the driver to r570+."),
        Check("GPU remap (r580+)", major >= 580, f"driver {driver}",
              "" if major >= 580 else "Upgrade to r580+ to restore onto another GPU.", required=False),
    ]
    reason = cuda.unavailable_reason()
    checks.append(Check("cuda-bindings", reason is None, reason or "driver checkpoint API reachable", reason or ""))
    try:
        import pynvml

        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        on = pynvml.nvmlDeviceGetPersistenceMode(h) == 1
        checks.append(Check("persistence mode", on, "on" if on else "off",
                            "" if on else "nvidia-smi -pm 1 keeps the driver loaded between processes.", required=False))
    except Exception as e:
        checks.append(Check("persistence mode", False, f"unknown: {e}", required=False))
    return checks


def _check_engine(daemon: DaemonProbe | None) -> tuple[Check, bool]:
    """Which engine a server started by this user gets, and why (the server decides the same way,
    ``server.backend_choice.choose_backend``); and whether that is the daemon."""
    privileges = check_privileges()
    if privileges.ok:
        return Check("engine", True, "whole process: this user may run CRIU itself"), False
    reason = daemon.unavailable_reason() if daemon else "no daemon configured"
    if daemon and reason is None:
        return Check("engine", True, f"whole process through the gpucr daemon at {daemon.socket_path}"), True
    return Check("engine", False, f"snapshot only: not root, no checkpoint capabilities, and {reason}",
                 "Ask the administrator to run gpucr-daemon (docs/jupyterhub.md), or run as root.", required=False), False


#: The checks of this user's own CRIU and privileges: where the daemon runs CRIU they do not apply.
OWN_CRIU_CHECKS = ("criu", "criu check", "userfaultfd", "privileges")


def _not_needed(name: str, daemon: DaemonProbe) -> Check:
    return Check(name, True, f"not needed: the gpucr daemon at {daemon.socket_path} runs CRIU for this user")


def run_checks(store: Store, criu_path: str | None, daemon: DaemonProbe | None) -> list[Check]:
    """Every check, required ones first; ``daemon``: the gpucr daemon a server would ask (None: none configured)."""
    engine, through_daemon = _check_engine(daemon)
    if through_daemon and daemon is not None:
        own = [_not_needed(name, daemon) for name in OWN_CRIU_CHECKS]
    else:
        own = _check_criu(criu_path) + [check_privileges()]
    checks = [*own, engine]
    for tool in ("unshare", "nsenter"):
        path = shutil.which(tool)
        checks.append(Check(tool, bool(path), path or "missing", "" if path else "Install util-linux."))
    checks += _check_gpu()
    free = store.free_bytes()
    checks.append(Check("store disk", free > 1 << 30, f"{human(free)} free in {store.root}",
                        "" if free > 1 << 30 else "Checkpoints larger than that are refused (the process keeps "
                        "running): free disk or set GPUCR_STORE to a larger disk.", required=free < STORE_DISK_FAIL))
    avail = psutil.virtual_memory().available
    checks.append(Check("host memory", True, f"{human(avail)} available (GPU memory is staged here while suspending)"))
    if free_page_reporting():
        checks.append(Check("freed memory", False, "the hypervisor takes back the memory this VM frees (free page reporting)",
                            "Suspends and restores write into such memory and can take several times as long after "
                            "the machine was idle; turn the balloon's free page reporting off for steady times.",
                            required=False))
    held = network_locks_held()
    if held is not None:
        room = held < NETWORK_LOCKS_MAX * 0.9
        checks.append(Check("network locks", room, f"{held} of {NETWORK_LOCKS_MAX} held (one per recent suspension)",
                            "" if room else "Restore or delete old checkpoints: each releases its lock; a suspend "
                            "releases those of its store older than the hold (c.GPUCR.network_lock_hold).", required=False))
    return checks


def report(checks: list[Check]) -> Report:
    """The checks as the REST API and ``gpucr doctor --json`` show them: only a ``fail`` makes
    the report not ok and counts as failing; a ``note`` is something to know."""
    failing = sum(1 for c in checks if c.severity == "fail")
    rows = [cast(CheckRow, {**asdict(c), "severity": c.severity}) for c in checks]
    return {"ok": failing == 0, "failing": failing, "checks": rows}

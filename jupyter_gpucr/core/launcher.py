"""Start a holder (PID 1 of a fresh PID + mount namespace) and wait until it reports."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import EngineError, PreconditionError
from .procs import find_descendant_by_ns_pid

# jupyter_client sets this so ipykernel exits when its parent changes; inside a holder the
# parent is PID 1 and, after a restore, a different process: it must not be inherited.
_DROP_ENV = ("JPY_PARENT_PID",)


HOLDER = Path(__file__).with_name("holder.py")


@dataclass(frozen=True)
class Started:
    """A process running inside its own namespaces."""

    popen: subprocess.Popen
    holder_pid: int  # host PID of the ``unshare`` process that owns the namespace
    pid: int  # host PID of the workload (what signals and the CUDA driver take)
    ns_pid: int  # its PID inside the namespace (what CRIU records)


def unshare_argv(holder_args: list[str]) -> list[str]:
    unshare = shutil.which("unshare")
    if not unshare:
        raise PreconditionError("The 'unshare' command (util-linux) is missing.", "Install util-linux.")
    return [
        unshare, "--pid", "--fork", "--mount-proc", "--propagation", "slave", "--kill-child",
        # Run as a plain script in isolated mode: the holder needs only the standard library,
        # and importing the package would add ~0.3 s to every start and restore.
        sys.executable, "-I", "-S", str(HOLDER), *holder_args,
    ]


def clean_env(env: dict[str, str] | None) -> dict[str, str]:
    env = dict(os.environ if env is None else env)
    for key in _DROP_ENV:
        env.pop(key, None)
    return env


def start_holder(
    holder_args: list[str],
    status_path: Path,
    env: dict[str, str] | None = None,
    timeout: float = 120.0,
    detach: bool = False,
    log_path: Path | None = None,
) -> Started | None:
    """Start a holder; return where the workload runs, or None when the holder said it failed."""
    status_path.unlink(missing_ok=True)
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        popen = subprocess.Popen(
            unshare_argv([f"--status={status_path}", *holder_args]),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=clean_env(env),
            start_new_session=detach,
            close_fds=True,
        )
    finally:
        if log_path:
            log.close()
    deadline = time.monotonic() + timeout
    while not status_path.exists():
        if popen.poll() is not None and not status_path.exists():
            raise EngineError(
                f"The namespace holder exited with code {popen.returncode} before reporting.",
                f"See {log_path}." if log_path else "Check that unshare works: 'gpucr doctor'.",
            )
        if time.monotonic() > deadline:
            popen.kill()
            raise EngineError(f"The namespace holder did not report within {timeout:.0f} s.")
        time.sleep(0.01)
    status = json.loads(status_path.read_text())
    status_path.unlink(missing_ok=True)
    if not status.get("ok"):
        popen.wait(timeout=10)
        return None
    ns_pid = int(status["ns_pid"])
    host_pid = None
    while host_pid is None and time.monotonic() < deadline:
        host_pid = find_descendant_by_ns_pid(popen.pid, ns_pid)
        if host_pid is None:
            time.sleep(0.01)
    if host_pid is None:
        raise EngineError("The process started but could not be found in the process table.")
    return Started(popen, popen.pid, host_pid, ns_pid)

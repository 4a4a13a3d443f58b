"""The criu engine: the whole process tree (memory, files, sockets, threads) via CRIU 4.2+.

Dumps run inside the target's own PID and mount namespaces (``nsenter``) so that CRIU sees
them as its own and dumps neither; restores run under a fresh holder (see ``holder``), so the
restored tree gets its original PIDs whatever the host is doing with them.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .errors import EngineError, PreconditionError
from .procs import in_own_pidns, innermost_pid

MIN_VERSION = (4, 2)

# Options every dump and restore needs (FINDINGS.md): kernels hold loopback TCP connections to
# themselves; no iptables binary exists, so the network lock goes through libnftables.
COMMON_OPTS = ["--tcp-established", "--network-lock", "nftables", "--file-locks", "--shell-job"]
DUMP_OPTS = ["--link-remap"]

# Log lines CRIU prints as errors on every run here although the operation succeeds.
_HARMLESS = ("RLIMIT_NOFILE", "kdat cache")

_HINTS: list[tuple[str, str]] = [
    (r"No space left on device", "The store's disk is full. Free space or point the store elsewhere (GPUCR_STORE / --store)."),
    (r"Can't fork for \d+: File exists", "A process holds the PID the checkpoint needs. Retry; gpucr restores into a fresh PID namespace."),
    (r"has bad size", "A file the process had open changed size since the checkpoint (a log written by someone else?)."),
    (r"Iptables configuration failed|nft", "The network lock failed: CRIU needs nftables support (libnftables) and CAP_NET_ADMIN."),
    (r"Operation not permitted|Permission denied", "CRIU needs root or CAP_CHECKPOINT_RESTORE + CAP_SYS_PTRACE. Run 'gpucr doctor'."),
    (r"/dev/nvidia", "The process still holds GPU device files: a child process using CUDA (e.g. a DataLoader worker) cannot be checkpointed by the driver."),
    (r"unix.*(external|peer)|Can't dump.*unix", "The process has a UNIX socket connected to a process outside its tree."),
    (r"Address already in use", "A TCP port the process listened on is in use by another process, or held in TIME_WAIT "
     "and the socket lacks SO_REUSEADDR: stop the other process or retry in a minute."),
    (r"Connected TCP socket", "The process has a TCP connection CRIU was not told to keep."),
]


@dataclass(frozen=True)
class CriuFailure:
    """The first meaningful error of a CRIU log and what the user can do."""

    line: str
    hint: str


def explain_log(log: Path, returncode: int | None = None, stderr: str = "") -> CriuFailure:
    try:
        lines = log.read_text(errors="replace").splitlines() + stderr.splitlines()
    except OSError:
        lines = stderr.splitlines()
    lines = [line for line in lines if not any(h in line for h in _HARMLESS)]
    errors = [line for line in lines if "Error" in line]
    text = "\n".join(errors) or "\n".join(lines[-5:])
    hint = next((h for pat, h in _HINTS if re.search(pat, text)), f"See the CRIU log {log}.")
    if errors:
        return CriuFailure(re.sub(r"^\(\s*[\d.]+\)\s*", "", errors[0]).strip(), hint)
    how = (f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}") if returncode else "failed"
    return CriuFailure(f"CRIU stopped ({how}) without reporting an error", hint)


def find_criu(explicit: str | None = None) -> str | None:
    """CRIU from the config, $GPUCR_CRIU, beside this Python (the venv's bundle), or PATH."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for cand in (os.environ.get("GPUCR_CRIU"), str(Path(sys.executable).parent / "criu")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return shutil.which("criu") or (os.access("/usr/sbin/criu", os.X_OK) and "/usr/sbin/criu") or None


class Criu:
    """One CRIU binary and the commands gpucr runs with it."""

    def __init__(self, path: str | None = None) -> None:
        found = find_criu(path)
        if not found:
            raise PreconditionError(
                "CRIU is not installed.",
                "Install CRIU 4.2+ (scripts/install-criu.sh does) or set GPUCR_CRIU to its path.",
            )
        self.path = found
        self.version = self._version()
        if self.version < MIN_VERSION:
            raise PreconditionError(
                f"CRIU {'.'.join(map(str, self.version))} at {self.path} is too old for this kernel.",
                "Install CRIU 4.2 or newer (scripts/install-criu.sh does).",
            )

    def _version(self) -> tuple[int, ...]:
        try:
            out = subprocess.run([self.path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired) as e:
            raise PreconditionError(f"CRIU at {self.path} does not run: {e}", "Reinstall it.") from e
        m = re.search(r"Version:\s*(\d+)\.(\d+)(?:\.(\d+))?", out)
        if not m:
            raise PreconditionError(f"Cannot read the version of CRIU at {self.path}: {out!r}")
        return tuple(int(x) for x in m.groups() if x is not None)

    @property
    def version_string(self) -> str:
        return ".".join(map(str, self.version))

    def check(self) -> tuple[bool, str]:
        proc = subprocess.run([self.path, "check"], capture_output=True, text=True, timeout=60)
        out = (proc.stdout + proc.stderr).strip()
        return proc.returncode == 0 and "Looks good" in out, out

    def dump(self, pid: int, images: Path, workdir: Path, leave_running: bool = False,
             keep_log: Path | None = None) -> float:
        """Dump the tree rooted at host PID ``pid`` into ``images``; return the seconds it took.

        On failure CRIU resumes the tree, so the process keeps running; we raise with the reason,
        and CRIU's log is copied to ``keep_log`` (the work directory is discarded).
        """
        argv = [self.path, "dump", "-D", str(images), "-W", str(workdir), "-o", "dump.log", *COMMON_OPTS, *DUMP_OPTS]
        if leave_running:
            argv.append("--leave-running")
        if in_own_pidns(pid):
            argv = ["nsenter", "-t", str(pid), "-p", "-m", "--", *argv, "-t", str(innermost_pid(pid))]
        else:
            argv += ["-t", str(pid)]
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True)
        elapsed = time.perf_counter() - start
        if proc.returncode != 0:
            failure = explain_log(workdir / "dump.log", proc.returncode, proc.stderr)
            hint = failure.hint
            if keep_log is not None and (workdir / "dump.log").exists():
                try:  # best effort: the disk may be the very thing that is full
                    shutil.copyfile(workdir / "dump.log", keep_log)
                    hint = f"{hint} CRIU's log: {keep_log}."
                except OSError:
                    pass
            raise EngineError(f"CRIU could not dump process {pid}: {failure.line}", hint)
        return elapsed

    def restore_argv(self, images: Path, workdir: Path, pidfile: Path) -> list[str]:
        """``criu restore`` as the holder runs it, detached, writing the restored root's PID."""
        return [
            self.path, "restore", "-D", str(images), "-W", str(workdir), "-o", "restore.log",
            *COMMON_OPTS, "--restore-detached", "--pidfile", str(pidfile),
        ]

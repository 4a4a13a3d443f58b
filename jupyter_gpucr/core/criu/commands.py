"""The criu engine: the whole process tree (memory, files, sockets, threads) via CRIU 4.2+.

Dumps run inside the target's own PID and mount namespaces (``nsenter``) so that CRIU sees
them as its own and dumps neither; restores run under a fresh holder (see ``holder``), so the
restored tree gets its original PIDs whatever the host is doing with them.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..errors import EngineError, PreconditionError
from ..files import private_files
from ..jsonfile import write_json_atomic
from ..process.identity import CRIU_RECORD, ProcId, criu_at_work, spawn_recorded, start_time
from ..process.procs import in_own_pidns, innermost_pid
from .pagefill import FillError, read_varint, varint_fields

MIN_VERSION = (4, 2)

# Options every dump and restore needs: kernels hold established loopback TCP connections to
# themselves (--tcp-close would break them); without "--network-lock nftables" CRIU looks for the
# iptables binary, which the bundle does not have, so the network lock goes through libnftables.
COMMON_OPTS = ["--tcp-established", "--network-lock", "nftables", "--file-locks", "--shell-job"]
# -v3 makes the log end with "Dumping finished successfully", the proof recovery needs that a
# dump completed when the process that started it died before reading CRIU's exit status.
# --skip-in-flight: a connection still in a listening socket's accept queue at the freeze (a
# monitor such as jupyter-resource-usage connects to a kernel's control port every few seconds)
# is not the process's yet; without it CRIU refuses the whole dump ("inet: In-flight connection").
# The connection stays queued on the listening socket the server holds (server/ports.py), or is
# reset when the process ends; either way its client connects again.
DUMP_OPTS = ["--link-remap", "--skip-in-flight", "-v3"]
DUMP_DONE = "Dumping finished successfully"
# Where a lazy restore's page daemon listens and logs, in the restore's work directory.
LAZY_SOCKET, LAZY_LOG = "lazy-pages.socket", "lazy-pages.log"
PAGEFILL = Path(__file__).with_name("pagefill.py")

# CRIU could not bind a UNIX socket name the restored process had: another socket still holds it.
UNIX_NAME_TAKEN = r"unix: Can't bind .*Address already in use"

# Log lines CRIU prints as errors on every run here although the operation succeeds.
_HARMLESS = ("RLIMIT_NOFILE", "kdat cache")

_HINTS: list[tuple[str, str]] = [
    (r"No space left on device", "The store's disk is full. Free space or point the store elsewhere (GPUCR_STORE / --store)."),
    (r"Can't fork for \d+: File exists", "A process holds the PID the checkpoint needs. Retry; gpucr restores into a fresh PID namespace."),
    (r"Iptables configuration failed|nft", "The network lock failed: CRIU needs nftables support (libnftables) and CAP_NET_ADMIN."),
    (r"Operation not permitted|Permission denied", "CRIU needs root or CAP_CHECKPOINT_RESTORE + CAP_SYS_PTRACE. Run 'gpucr doctor'."),
    (r"/dev/nvidia", "The process still holds GPU device files: a child process using CUDA (e.g. a DataLoader worker) cannot be checkpointed by the driver."),
    (r"unix.*(external|peer)|Can't dump.*unix", "The process has a UNIX socket connected to a process outside its tree."),
    (UNIX_NAME_TAKEN, "A UNIX socket name the process had bound is taken by another process "
     "(or the old process is still exiting): stop that process, or retry."),
    (r"Address already in use", "A TCP port the process listened on is in use by another process, or held in TIME_WAIT "
     "and the socket lacks SO_REUSEADDR: stop the other process or retry in a minute."),
    (r"Connected TCP socket", "The process has a TCP connection CRIU was not told to keep."),
    (r"uffd: |lazy-pages", "The daemon that brings the process's memory in stopped during the restore (its log: "
     f"{LAZY_LOG} in the checkpoint's folder)."),
]

# The cause in a few plain words, for the first line a user reads (a notification); the CRIU
# text stays in the message behind it.
_SUMMARIES: list[tuple[str, str]] = [
    (r"No space left on device", "The disk is full"),
    (r"Can't fork for \d+: File exists", "The process ID the kernel needs is taken"),
    (r"Operation not permitted|Permission denied", "CRIU lacks the privileges it needs"),
    (UNIX_NAME_TAKEN, "A socket name the kernel had is taken by another process"),
    (r"Address already in use", "A port the kernel had is in use by another process"),
    (r"uffd: |lazy-pages", "The kernel's memory could not be brought back"),
]


@dataclass(frozen=True)
class CriuFailure:
    """The first meaningful error of a CRIU log (``raw``), said for the user (``line``), and what to do."""

    line: str
    hint: str
    raw: str = ""
    #: The cause in a few plain words ("The disk is full"); "" when there is none to say.
    summary: str = ""


def _file_changed(m: re.Match) -> tuple[str, str, str]:
    path, now, then = "/" + m["path"].lstrip("/"), m["now"], m["then"]
    line = (f"The file {path}, which the process had open, changed size while it was suspended: {now} bytes now, "
            f"{then} at the checkpoint. CRIU restores open files only as they were.")
    hint = (f"Put the file back as it was (from a backup or version control) and restore again. If the process can live "
            f"with its current content, make it the recorded size instead: 'truncate -s {then} {path}' (this cuts or "
            "pads the file), then restore again.")
    return line, hint, f"The file {path} changed while the kernel was suspended"


def _file_gone(m: re.Match) -> tuple[str, str, str]:
    path = "/" + m["path"].lstrip("/")
    line = (f"The file {path}, which the process had open, cannot be opened: {m['why']}. It was probably deleted or "
            "moved while the process was suspended.")
    hint = (f"Put the file back at {path} and restore again. For a file the process only writes to, an empty one does: "
            f"'touch {path}' (if CRIU then reports a size, follow that message).")
    return line, hint, f"The file {path}, which the kernel had open, is gone"


# Terse CRIU errors turned into a sentence naming the thing and what to do about it.
_TRANSLATIONS: list[tuple[str, Callable[[re.Match], tuple[str, str, str]]]] = [
    (r"File (?P<path>\S+) has bad size (?P<now>\d+) \(expect (?P<then>\d+)\)", _file_changed),
    (r"Can't open file (?P<path>\S+?)(?: on restore)?: (?P<why>.+)$", _file_gone),
]


def explain_log(log: Path, returncode: int | None = None, stderr: str = "") -> CriuFailure:
    try:
        lines = log.read_text(errors="replace").splitlines() + stderr.splitlines()
    except OSError:
        lines = stderr.splitlines()
    lines = [line for line in lines if not any(h in line for h in _HARMLESS)]
    errors = [re.sub(r"^\(\s*[\d.]+\)\s*", "", line).strip() for line in lines if "Error" in line]
    for pattern, translate in _TRANSLATIONS:
        for line in errors:
            m = re.search(pattern, line)
            if m:
                said, hint, summary = translate(m)
                return CriuFailure(said, hint, raw=line, summary=summary)
    text = "\n".join(errors) or "\n".join(lines[-5:])
    hint = next((h for pat, h in _HINTS if re.search(pat, text)), f"See the CRIU log {log}.")
    summary = next((s for pat, s in _SUMMARIES if re.search(pat, text)), "")
    if errors:
        return CriuFailure(errors[0], hint, raw=errors[0], summary=summary)
    how = (f"killed by signal {-returncode}" if returncode < 0 else f"exit status {returncode}") if returncode else "failed"
    return CriuFailure(f"CRIU stopped ({how}) without reporting an error", hint, summary=summary)


def dump_finished(workdir: Path) -> bool:
    """Whether the CRIU dump that wrote ``workdir/dump.log`` completed (the process it dumped is gone
    unless it was left running)."""
    try:
        with open(workdir / "dump.log", "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 4096))
            return DUMP_DONE.encode() in f.read()
    except OSError:
        return False


_STATS_MAGICS = (0x55105940, 0x57093306)  # CRIU's service-image magic, then its stats image's


def dump_stats(workdir: Path) -> dict[str, float]:
    """CRIU's own split of the dump it wrote in ``workdir`` (its ``stats-dump`` image, a protobuf
    of microsecond counters): how long the tree was frozen, and of that how long its memory took
    to collect and to write. Empty when there is none, or in a form this does not know: it only
    informs."""
    try:
        data = (workdir / "stats-dump").read_bytes()
        if struct.unpack_from("<II", data) != _STATS_MAGICS:
            return {}
        (size,) = struct.unpack_from("<I", data, 8)
        key, i = read_varint(data, 12)
        length, i = read_varint(data, i)
        if key != (1 << 3 | 2) or i + length > 12 + size:  # field 1, a message: the dump's stats
            return {}
        fields = varint_fields(data[i:i + length])
    except (OSError, struct.error, IndexError, FillError):
        return {}
    return {name: fields[n] / 1e6 for name, n in (("criu_frozen", 2), ("criu_memdump", 3), ("criu_memwrite", 4))
            if n in fields}


def at_work_in(dirs: list[Path]) -> list[int]:
    """PIDs of the CRIU dumps recorded in ``dirs`` (work directories) that still run: while one runs,
    the images there are being written and the process is in flux. Only the recorded run counts
    (see :meth:`Criu.dump`), never a process that merely shows such a directory in its arguments."""
    return [proc.pid for proc in map(criu_at_work, dirs) if proc is not None]


def _run_recorded(argv: list[str], workdir: Path, pass_fds: tuple[int, ...] = ()) -> tuple[int, str]:
    """Run CRIU, its PID and start time recorded in ``workdir`` (see :func:`at_work_in`) before it
    may start and until it ends; its exit code and stderr."""
    record = workdir / CRIU_RECORD
    proc, _ = spawn_recorded(argv, lambda me: write_json_atomic(record, me.to_dict(), durable=False), stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, pass_fds=pass_fds)
    try:
        _out, err = proc.communicate()
    except BaseException:
        proc.kill()  # interrupted before knowing the outcome, as subprocess.run does
        proc.wait()
        raise
    record.unlink(missing_ok=True)
    return proc.returncode, err


#: nsenter's option for a namespace file of /proc/PID/ns.
NSENTER_FLAG = {"pid": "pid", "pid_for_children": "pid", "mnt": "mount", "net": "net"}


def _pinned_namespaces(holder: ProcId, kinds: list[str]) -> list[int]:
    """Descriptors of ``holder``'s namespaces of ``kinds``, opened while it provably still ran (its
    start time checked after the opening), so that no later process under its PID is entered."""
    fds: list[int] = []
    try:
        for kind in kinds:
            fds.append(os.open(f"/proc/{holder.pid}/ns/{kind}", os.O_RDONLY | os.O_CLOEXEC))
        if not holder.alive():
            raise ProcessLookupError(holder.pid)
    except OSError:
        for fd in fds:
            os.close(fd)
        raise EngineError(f"Process {holder.pid}, whose namespaces CRIU works in, ended before the dump.",
                          "The process was left as it was; try again.") from None
    return fds


def _own_netns(pid: int) -> bool:
    """Whether ``pid`` lives in a network namespace other than ours (a fork's)."""
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino != os.stat("/proc/self/ns/net").st_ino
    except OSError:
        return False


def criu_candidates() -> list[str]:
    """Where CRIU is looked for, in order: $GPUCR_CRIU, beside this Python (the venv's bundle that
    ``gpucr install-criu`` puts there), beside the Python environment this package is installed in
    (a server started from another environment that imports it), a checkout's ``.venv`` (an
    editable install), ``~/.local/bin``, PATH, /usr/sbin."""
    package = Path(__file__).resolve().parents[2]  # .../site-packages/jupyter_gpucr, or a checkout's
    found = [os.environ.get("GPUCR_CRIU") or "", str(Path(sys.executable).parent / "criu"),
             str(package.parents[2] / "bin" / "criu"), str(package.parent / ".venv" / "bin" / "criu"),
             str(Path.home() / ".local" / "bin" / "criu"), shutil.which("criu") or "", "/usr/sbin/criu"]
    return [c for c in dict.fromkeys(found) if c]


def find_criu(explicit: str | None = None) -> str | None:
    """CRIU from the config, else the first of :func:`criu_candidates` that can run."""
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    return next((c for c in criu_candidates() if os.access(c, os.X_OK)), None)


class Criu:
    """One CRIU binary and the commands gpucr runs with it."""

    def __init__(self, path: str | None = None) -> None:
        found = find_criu(path)
        if not found:
            looked = path or ", ".join(criu_candidates())
            raise PreconditionError(
                f"CRIU is not installed (looked at {looked}).",
                "Install CRIU 4.2+ ('gpucr install-criu' puts it beside this Python), or point at it: "
                "c.GPUCR.criu_path, or the GPUCR_CRIU environment variable.",
            )
        self.path = found
        #: Called with the host PID of a tree right before CRIU dumps it; it may stop and check the
        #: tree, raising to refuse the dump (with the tree as it found it), and returns what puts
        #: the tree back as it was, called after a failed dump or one that leaves it running.
        self.before_seize: Callable[[int], Callable[[], None]] | None = None
        #: The process whose namespaces a dump of a tree in a PID namespace of its own enters (its
        #: holder, as recorded when it was started); None: the tree's root's own. The daemon sets it:
        #: the tree's processes are the user's, and may have made mount namespaces of their own.
        self.enter_namespaces_of: ProcId | None = None
        #: Options of the daemon's criu (``daemon/criu_as_owner``) put before every dump's and
        #: restore's own: whose credentials CRIU runs with.
        self.owner_args: list[str] = []
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
             keep_log: Path | None = None, leave_stopped: bool = False, track_mem: bool = False,
             prev_images: str | None = None) -> float:
        """Dump the tree rooted at host PID ``pid`` into ``images``; return the seconds it took.
        Afterwards the tree runs on (``leave_running``), stays stopped (``leave_stopped``: the
        caller ends it) or is killed. ``track_mem``: the kernel starts tracking the pages written
        from now on (:attr:`dirty_tracking`), and ``prev_images`` (relative to ``images``: the
        images of the tree's last such dump) receives the pages not written since, for a dump
        that holds only the others (CRIU's ``parent`` link).

        On failure CRIU resumes the tree, so the process keeps running; we raise with the reason,
        and CRIU's log is copied to ``keep_log`` (the work directory is discarded).

        CRIU's PID and start time are recorded in ``workdir`` before it may start, so that whoever
        finds the directory after this process died knows whether that CRIU still works.
        """
        argv = [self.path, "dump", *self.owner_args, "-D", str(images), "-W", str(workdir), "-o", "dump.log",
                *COMMON_OPTS, *DUMP_OPTS]
        if leave_running:
            argv.append("--leave-running")
        elif leave_stopped:
            argv.append("--leave-stopped")
        if track_mem:
            argv += ["--track-mem", *(["--prev-images-dir", prev_images] if prev_images else [])]
        thaw = self.before_seize(pid) if self.before_seize is not None else None
        namespaces: list[int] = []
        try:
            if in_own_pidns(pid):
                # a fork's network namespace too (see process/relay.py): CRIU would otherwise try to dump it
                # the holder (unshare) is outside the PID namespace it made: its children's is the tree's
                holder = self.enter_namespaces_of
                kinds = ["pid_for_children" if holder else "pid", "mnt", *(["net"] if _own_netns(pid) else [])]
                namespaces = _pinned_namespaces(holder or ProcId(pid, start_time(pid) or 0), kinds)
                entered = [f"--{NSENTER_FLAG[k]}=/proc/self/fd/{fd}" for k, fd in zip(kinds, namespaces, strict=True)]
                argv = ["nsenter", *entered, "--", *argv, "-t", str(innermost_pid(pid))]
            else:
                argv += ["-t", str(pid)]
            start = time.perf_counter()
            returncode, stderr = _run_recorded(argv, workdir, tuple(namespaces))
            elapsed = time.perf_counter() - start
        except BaseException:
            if thaw is not None:
                thaw()
            raise
        finally:
            for fd in namespaces:
                os.close(fd)
        if thaw is not None and (returncode != 0 or leave_running):
            thaw()
        if returncode != 0:
            failure = _locks_exhausted(explain_log(workdir / "dump.log", returncode, stderr))
            hint = failure.hint
            if keep_log is not None and (workdir / "dump.log").exists():
                try:  # best effort: the disk may be the very thing that is full; 0600, as all of a checkpoint
                    private_files(keep_log.parent, keep_log.name)
                    shutil.copyfile(workdir / "dump.log", keep_log)
                    hint = f"{hint} CRIU's log: {keep_log}."
                except OSError:
                    pass
            raise EngineError(f"CRIU could not dump process {pid}: {failure.line}", hint)
        return elapsed

    def restore_argv(self, images: Path, workdir: Path, pidfile: Path, leave_stopped: bool = False,
                     lazy: bool = False) -> list[str]:
        """``criu restore`` as the holder runs it, detached, writing the restored root's PID;
        ``leave_stopped`` keeps every restored task stopped until the caller sends SIGCONT;
        ``lazy`` leaves the memory to the daemon of :meth:`lazy_pages_argv`."""
        return [
            self.path, "restore", *self.owner_args, "-D", str(images), "-W", str(workdir), "-o", "restore.log",
            *COMMON_OPTS, "--restore-detached", "--pidfile", str(pidfile), *(["--leave-stopped"] if leave_stopped else []),
            *(["--lazy-pages"] if lazy else []),
        ]

    @staticmethod
    def page_fill_argv(images: Path, workdir: Path) -> list[str]:
        """gpucr's own lazy-pages daemon (``pagefill``) for a restore from ``images``: it copies the
        whole memory in with many threads, then exits; the restore is handed back only then (the
        tree stays stopped meanwhile, but for a GPU process: see ``steps/restore.py``)."""
        return [sys.executable, "-I", "-S", str(PAGEFILL), "-D", str(images), "-W", str(workdir), "-o", LAZY_LOG]

    def lazy_pages_argv(self, images: Path, workdir: Path) -> list[str]:
        """CRIU's lazy-pages daemon for a restore from ``images``: it listens on
        ``workdir/LAZY_SOCKET``, serves the restored tree's page faults from the images and
        copies the remaining pages in behind them, then exits."""
        return [self.path, "lazy-pages", "-D", str(images), "-W", str(workdir), "-o", LAZY_LOG]

    @functools.cached_property
    def dirty_tracking(self) -> bool:
        """Whether this kernel tracks the pages a process writes (soft-dirty bits,
        CONFIG_MEM_SOFT_DIRTY), which incremental dumps need (``--track-mem``); asked once per binary."""
        try:
            proc = subprocess.run([self.path, "check", "--feature", "mem_dirty_track"], capture_output=True, text=True,
                                  timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return proc.returncode == 0

    @functools.cached_property
    def lazy_pages_supported(self) -> bool:
        """Whether this kernel gives CRIU what lazy restores need (userfaultfd for a process not
        its own); asked once per binary."""
        try:
            proc = subprocess.run([self.path, "check", "--feature", "uffd-noncoop"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return proc.returncode == 0


# -- CRIU's network lock ------------------------------------------------------------------
# A dump with --network-lock nftables creates the table "inet CRIU-<dump id>" that drops the
# packets of the dumped TCP connections, and leaves it after a successful dump: the restore
# deletes it. When the restore never comes (the checkpoint is deleted, or the process was put
# back by recovery), the table would stay for good; these helpers find and drop it over netlink
# (the nft binary is not installed here).
_NFNL_SUBSYS_NFTABLES = 10
_NFT_MSG_GETTABLE, _NFT_MSG_DELTABLE = 1, 2
_NFNL_MSG_BATCH_BEGIN, _NFNL_MSG_BATCH_END = 0x10, 0x11
_NFPROTO_INET, _NFTA_TABLE_NAME = 1, 1
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_DUMP = 0x1, 0x4, 0x300
_NLMSG_ERROR, _NLMSG_DONE = 2, 3
_UUID = re.compile(rb"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def dump_id(images: Path) -> str | None:
    """The id CRIU gave a dump (kept in inventory.img); its network-lock table is named after it."""
    try:
        m = _UUID.search((images / "inventory.img").read_bytes())
    except OSError:
        return None
    return m.group().decode() if m else None


def _nl_msg(kind: int, flags: int, seq: int, family: int, res_id: int = 0, attrs: bytes = b"") -> bytes:
    body = struct.pack("!BBH", family, 0, res_id) + attrs
    return struct.pack("=IHHII", 16 + len(body), kind, flags, seq, 0) + body


def _nl_attr(kind: int, data: bytes) -> bytes:
    attr = struct.pack("=HH", 4 + len(data), kind) + data
    return attr + b"\0" * (-len(attr) % 4)


def _nl_exchange(request: bytes) -> list[tuple[int, bytes]]:
    """Send netfilter netlink ``request``; return the (type, payload) replies up to DONE or the last ACK."""
    replies: list[tuple[int, bytes]] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 12) as s:  # NETLINK_NETFILTER
        s.settimeout(5)
        s.send(request)
        while True:
            data, off = s.recv(1 << 16), 0
            while off + 16 <= len(data):
                length, kind = struct.unpack_from("=IH", data, off)
                payload = data[off + 16: off + length]
                off += (length + 3) & ~3
                if kind == _NLMSG_DONE:
                    return replies
                if kind == _NLMSG_ERROR:
                    err = -struct.unpack_from("=i", payload)[0]
                    if err:
                        raise OSError(err, os.strerror(err))
                    return replies
                replies.append((kind, payload))


def _table_name(payload: bytes) -> str | None:
    off = 4  # after the nfgenmsg header
    while off + 4 <= len(payload):
        length, kind = struct.unpack_from("=HH", payload, off)
        if kind == _NFTA_TABLE_NAME:
            return payload[off + 4: off + length].rstrip(b"\0").decode(errors="replace")
        off += max((length + 3) & ~3, 4)
    return None


def network_lock_tables() -> list[str]:
    """Names of the inet nftables tables CRIU created (``CRIU-...``)."""
    kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_GETTABLE
    replies = _nl_exchange(_nl_msg(kind, _NLM_F_REQUEST | _NLM_F_DUMP, 1, _NFPROTO_INET))
    names = [_table_name(p) for _, p in replies if p[:1] == bytes([_NFPROTO_INET])]
    return [n for n in names if n and n.startswith("CRIU-")]


def _delete_table(name: str) -> None:
    kind = (_NFNL_SUBSYS_NFTABLES << 8) | _NFT_MSG_DELTABLE
    batch = (_nl_msg(_NFNL_MSG_BATCH_BEGIN, _NLM_F_REQUEST, 1, socket.AF_UNSPEC, _NFNL_SUBSYS_NFTABLES)
             + _nl_msg(kind, _NLM_F_REQUEST | _NLM_F_ACK, 2, _NFPROTO_INET,
                       attrs=_nl_attr(_NFTA_TABLE_NAME, name.encode() + b"\0"))
             + _nl_msg(_NFNL_MSG_BATCH_END, _NLM_F_REQUEST, 3, socket.AF_UNSPEC, _NFNL_SUBSYS_NFTABLES))
    _nl_exchange(batch)


# CRIU's nftables lock registers hooks on the host's input and output paths, one set per dumped
# process until it is restored; Linux allows 1024 entries per hook (MAX_HOOK_COUNT), so the
# 1025th lock fails ("Locking network failed using nftables").
NETWORK_LOCKS_MAX = 1024


def network_locks_held() -> int | None:
    """How many CRIU network locks the host holds; None where they cannot be listed."""
    try:
        return len(network_lock_tables())
    except OSError:
        return None


def drop_network_locks_except(keep: set[str]) -> int:
    """Delete every CRIU network lock not named in ``keep``; how many. For test runs, whose stores
    are deleted with the checkpoints never restored: their locks would stay until a reboot."""
    dropped = 0
    for table in network_lock_tables():
        if table not in keep:
            _delete_table(table)
            dropped += 1
    return dropped


def _locks_exhausted(failure: CriuFailure) -> CriuFailure:
    """A failed network lock, when the host is out of them, said as such."""
    held = network_locks_held() if "Locking network failed" in failure.raw else None
    if held is None or held < NETWORK_LOCKS_MAX - 8:
        return failure
    return CriuFailure(f"the host holds {held} CRIU network locks, one per recent suspension, and Linux allows "
                       f"{NETWORK_LOCKS_MAX}", "Restore or delete old checkpoints: each restore or deletion "
                       "releases its lock, as suspends do for their store's checkpoints older than "
                       "c.GPUCR.network_lock_hold ('gpucr doctor' counts them).", failure.raw)


def drop_network_lock(images: Path) -> str | None:
    """Delete the network-lock table of the dump in ``images`` if it is still there; return its name.

    For a dump that will never be restored, or whose process already runs again: the table blocks
    that process's TCP connections; or for one suspended long enough (``drop_network_locks``).
    """
    dropped = drop_network_locks([images])
    return dropped[0] if dropped else None


def drop_network_locks(image_dirs: list[Path]) -> list[str]:
    """Delete the network-lock tables of the dumps in ``image_dirs`` that are still there (the
    host's tables are listed once); return their names. A restore without its table works: CRIU
    only logs that the table it would delete is missing. CRIU cuts the table name short, so it is
    matched as a prefix of the dump id."""
    dropped: list[str] = []
    try:
        tables = network_lock_tables()
        ids = [did for did in map(dump_id, image_dirs) if did] if tables else []
        for table in tables:
            suffix = table.removeprefix("CRIU-")
            if len(suffix) >= 8 and any(did.startswith(suffix) for did in ids):
                _delete_table(table)
                dropped.append(table)
    except OSError:  # no nftables in this kernel, or no CAP_NET_ADMIN: CRIU could not have locked either
        pass
    return dropped


def drop_network_lock_of(run_id: str) -> str | None:
    """Delete the network-lock table of the CRIU run ``run_id`` (named at the start of its log) if it
    is still there; return its name. For a dump that died after taking its lock: it left no images
    that name the table, and nothing else would ever release it."""
    try:
        for table in network_lock_tables():
            suffix = table.removeprefix("CRIU-")
            if len(suffix) >= 8 and run_id.startswith(suffix):
                _delete_table(table)
                return table
    except OSError:  # no nftables in this kernel, or no CAP_NET_ADMIN: CRIU could not have locked either
        pass
    return None

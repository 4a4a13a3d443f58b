"""Per-uid limits on what the daemon's users share: CRIU's network locks, their processes' logs and
the bytes of their stores.

- Network locks. Each dump that stops its process leaves one nftables table until the restore, and
  a host holds at most ``NETWORK_LOCKS_MAX``. Before a user's dump, the locks of that user's oldest
  checkpoints beyond ``locks_per_user`` are released rather than the dump refused: a lock only
  matters while the suspended process's TCP peers retransmit (minutes), its checkpoint restores
  without it, and a refusal would leave the user unable to suspend at all. A dump that fails or is
  killed leaves a table that no checkpoint names; its id is the first line of the dump's log, which
  the checkpointer keeps (``dump-failed.log``), so that table, and only that one (other CRIU users of
  the host have tables of their own), is dropped once the request ends.
- Logs. A process's stdout.log and stderr.log are in the daemon's root-owned store, where the
  user's disk quota does not apply, and the process holds them open for writing: it can grow them
  with holes (ftruncate) or blocks past their end (fallocate) as well as by writing. A log counts
  the blocks it holds, and a running process's log its size too. A watchdog cuts a running
  process's log back to its newest half when it passes ``log_bytes``, with a line saying so; the
  log of a process that does not run (suspended or ended) keeps its size, which CRIU checks when
  it restores, and gives back its blocks but for the newest half (holes punched). Never while an
  operation holds the process. The watchdog reads a log in bounded chunks, never whole.
- Store bytes. The store counts the blocks its files hold (checkpoints and logs). ``run`` is
  refused when the store, with what the logs of the user's running processes may still take,
  leaves no room for the new process's logs. A checkpoint whose estimate would take the store past
  ``store_bytes`` is refused before the process is touched; the estimates of a user's checkpoints
  under way are counted together, and each dump is watched as it writes (CRIU also writes memory
  that no estimate sees, such as unmapped memfds): one that takes the store past the quota is
  killed, the process left running, and the request says so. One that ends between two looks is
  checked once more before its commit and, past the quota, not committed: the process CRIU left
  stopped is put back from the images and runs again, and the request says so. A file of several hard links (a
  copy of a checkpoint: a save point) counts once. A ``copy`` is refused once the store has
  reached the quota.
"""
from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import signal
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from ..core.criu.commands import drop_network_lock_of, drop_network_locks, dump_id, network_lock_tables
from ..core.errors import BusyError, GPUCRError, PreconditionError, PutBackError
from ..core.gpu import cuda, gpus
from ..core.process.procs import is_alive, tree, tree_rss
from ..core.storage.locks import exclusive
from ..core.storage.names import validate_name
from ..core.storage.store import Checkpoint, Store, name_of_id, read_record

log = logging.getLogger("gpucr-daemon")
#: How often the watchdog looks at the logs: a process may pass the cap by what it writes meanwhile.
LOG_CHECK_EVERY = 1.0
LOGS = ("stdout.log", "stderr.log")
#: How often a dump's growth is measured: a dump may pass the quota by what CRIU writes meanwhile.
DUMP_CHECK_EVERY = 0.05
_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 1, 2
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
_RUN_ID = re.compile(r"CRIU run id = ([0-9a-f]{8}-[0-9a-f-]{27})")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class QuotaSettings:
    """Each None (or 0 on the command line) turns that limit off."""

    store_bytes: int | None = None
    log_bytes: int | None = 64 << 20
    locks_per_user: int | None = 32


_QUOTA_HINT = ("Delete suspended kernels or checkpoints you no longer need (and empty the trash), or ask the "
               "administrator for a larger quota (gpucr-daemon --store-quota).")


def parse_size(text: str, whole: Path | None = None) -> int | None:
    """Bytes from "64M", "2G", "1048576" or, given ``whole`` (a path on the file system meant, or
    to be made there), "50%" of that file system; None for "0"."""
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text.endswith("%") and whole is not None:
        there = next(p for p in [whole, *whole.absolute().parents] if p.exists())
        size = int(shutil.disk_usage(there).total * float(text[:-1]) / 100)
    elif text and text[-1] in _UNITS:
        size = int(float(text[:-1]) * _UNITS[text[-1]])
    else:
        size = int(text)
    return size or None


def mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


@dataclass(eq=False)
class _Dump:
    """A checkpoint under way: what its estimate reserved, what its retention will free, what it
    has written so far, and whether its dump was killed for the quota."""

    name: str
    need: int
    freed: int
    written: int = 0
    killed: bool = False


class Quotas:
    """The limits of one daemon over its ``state_dir/users/UID`` stores."""

    def __init__(self, state_dir: Path, settings: QuotaSettings = QuotaSettings(), keep_last: int = 1) -> None:
        self.users = state_dir / "users"
        self.settings = settings
        self.keep_last = keep_last
        self._stop = threading.Event()
        self._dumps: dict[int, list[_Dump]] = {}
        self._dumps_lock = threading.Lock()

    @contextmanager
    def around(self, op: str, uid: int, args: dict[str, Any]) -> Iterator[Callable[[], None] | None]:
        """Around one request: ``run`` is checked against the store quota; a checkpoint is too,
        is watched while it dumps, and makes room for its network lock first, and the lock of a
        dump that failed is released after. For a checkpoint under a quota, it yields the check
        to run before the checkpoint is committed (else None)."""
        name = args.get("name")
        if op == "run":
            self.check_run(uid)
        if op == "copy":
            self.check_copy(uid)
        if op != "checkpoint" or not isinstance(name, str):
            yield None
            return
        store = Store(self.users / str(uid))
        validate_name(name)
        with self._watched(uid, store, name) as before_commit:
            if not args.get("leave_running"):  # a dump that leaves the process running releases its lock itself
                self.make_room_for_lock(uid, store)
            since = time.time()
            try:
                yield before_commit
            except BaseException:
                self.release_failed_dump(uid, store, name, since)
                raise

    # -- store bytes ----------------------------------------------------------------------
    def check_run(self, uid: int) -> None:
        """Refuse a new process when its logs would have no room in the store."""
        quota = self.settings.store_bytes
        if quota is None:
            return
        used = self.committed(uid)
        logs = len(LOGS) * (self.settings.log_bytes or 0)
        if used + logs <= quota and used < quota:
            return
        raise PreconditionError(
            f"Starting a process would take your checkpoints and logs past your quota of {mib(quota)} on this host: "
            f"its logs may take {mib(logs)}, and your checkpoints and logs use or may soon use {mib(used)}.",
            _QUOTA_HINT)

    def check_copy(self, uid: int) -> None:
        """Refuse a copy of a checkpoint (its folders and manifest take a little) once the store is full."""
        quota = self.settings.store_bytes
        if quota is None:
            return
        used = self.committed(uid)
        if used >= quota:
            raise PreconditionError(f"Your checkpoints and logs use or may soon use {mib(used)}, your whole quota of "
                                    f"{mib(quota)} on this host: no checkpoint can be copied.", _QUOTA_HINT)

    def committed(self, uid: int) -> int:
        """The user's store bytes, with what their checkpoints under way have yet to write of their
        estimates and what the logs of their running processes may still take."""
        root = self.users / str(uid)
        with self._dumps_lock:
            pending = sum(max(0, d.need - d.written) for d in self._dumps.get(uid, []))
        return disk_usage(root) + pending + self._log_room(root)

    def _log_room(self, root: Path) -> int:
        cap = self.settings.log_bytes
        if cap is None:
            return 0
        room = 0
        for proc_dir in root.glob("procs/*"):
            rec = read_record(proc_dir)
            if rec.get("state") == "running" and is_alive(rec.get("pid")):
                room += sum(max(0, cap - _blocks(proc_dir / n)) for n in LOGS)
        return room

    @contextmanager
    def _watched(self, uid: int, store: Store, name: str) -> Iterator[Callable[[], None] | None]:
        """Check the checkpoint of ``name`` against the quota, counting the user's other
        checkpoints under way, and watch its dump; a dump killed for the quota is said so. Yields
        the check before its commit: the watcher looks every ``DUMP_CHECK_EVERY`` and a dump can end
        in between (beside others, under load), so a written dump that takes the store past the
        quota is not committed either: the process runs again, put back from its images."""
        quota = self.settings.store_bytes
        rec = read_record(store.root / "procs" / name)
        pid = rec.get("pid")
        if quota is None or rec.get("state") != "running" or not isinstance(pid, int) or not is_alive(pid):
            yield None  # the verb says why it cannot checkpoint
            return
        dump = self._admit_dump(uid, store, name, pid, quota)
        before = {p.name for p in store.checkpoints_root.glob(".tmp-*")} if store.checkpoints_root.is_dir() else set()
        stop = threading.Event()
        watcher = threading.Thread(target=self._watch_dump, args=(uid, store, dump, before, stop, quota), daemon=True,
                                   name=f"dump-watch-{uid}")
        watcher.start()

        def before_commit() -> None:
            stop.set()
            watcher.join()
            folder = _dump_folder(store, name, before)
            dump.written = disk_usage(folder) if folder is not None else dump.written
            if self._over_quota(uid, store, quota):
                dump.killed = True
                raise PreconditionError(f"it takes your checkpoints and logs past your quota of {mib(quota)}")

        try:
            yield before_commit
        except GPUCRError as e:
            if dump.killed:
                stopped = (f"Checkpointing {name!r} was stopped: it took your checkpoints and logs past your quota of "
                           f"{mib(quota)} on this host ({mib(dump.written)} written, about {mib(dump.need)} estimated "
                           "from its memory).")
                if isinstance(e, PutBackError):  # written, not committed: the process runs again
                    e.message, e.hint = f"{stopped} The process was put back and runs again.", _QUOTA_HINT
                    raise
                left = "The process was left running." if is_alive(pid) else "The process did not survive it."
                raise PreconditionError(f"{stopped} {left}", _QUOTA_HINT) from e
            raise
        finally:
            stop.set()
            watcher.join()
            with self._dumps_lock:
                self._dumps[uid].remove(dump)
                if not self._dumps[uid]:
                    del self._dumps[uid]

    def _admit_dump(self, uid: int, store: Store, name: str, pid: int, quota: int) -> _Dump:
        """Reserve the estimate of a dump of ``name``, or refuse it (the process untouched)."""
        need = checkpoint_estimate(pid)
        older = store.suspended_in(name)  # retention keeps save points and those in the server's trash
        freed = sum(c.size for c in older[:max(0, len(older) - (self.keep_last - 1))])  # what retention deletes
        with self._dumps_lock:
            others = self._dumps.setdefault(uid, [])
            pending = sum(max(0, d.need - d.written) for d in others)
            used = disk_usage(store.root)
            if used + pending - freed + need > quota:
                if not others:
                    del self._dumps[uid]
                also = f", {mib(freed)} of which its older checkpoints would free" if freed else ""
                under_way = f", and your checkpoints under way may take {mib(pending)} more" if pending else ""
                raise PreconditionError(
                    f"Checkpointing {name!r} would take your checkpoints past your quota of {mib(quota)} on this host: "
                    f"it needs about {mib(need)}, your checkpoints and logs use {mib(used)} now{also}{under_way}. "
                    "The process was left running.", _QUOTA_HINT)
            dump = _Dump(name, need, freed)
            others.append(dump)
            return dump

    def _watch_dump(self, uid: int, store: Store, dump: _Dump, before: set[str], stop: threading.Event,
                    quota: int) -> None:
        """Measure what the dump has written; once the user's store, less what the retention of
        their dumps under way frees, passes the quota, kill the dump's CRIU."""
        folder: Path | None = None
        while not stop.wait(DUMP_CHECK_EVERY):
            if folder is None:
                folder = _dump_folder(store, dump.name, before)
                if folder is None:
                    continue
            dump.written = disk_usage(folder)
            if self._over_quota(uid, store, quota):
                dump.killed = True
                log.warning("uid %d: killed the dump of %s at %s written: the store passed its quota of %s", uid,
                            dump.name, mib(dump.written), mib(quota))
                _kill_writers(folder)
                return

    def _over_quota(self, uid: int, store: Store, quota: int) -> bool:
        """Whether the user's store, less what the retention of their dumps under way frees, is
        past the quota."""
        with self._dumps_lock:
            freed = sum(d.freed for d in self._dumps.get(uid, []))
        return disk_usage(store.root) - freed > quota

    # -- network locks --------------------------------------------------------------------
    def make_room_for_lock(self, uid: int, store: Store) -> list[str]:
        """Release the locks of this user's oldest checkpoints so that their dump makes at most
        ``locks_per_user``; the tables dropped."""
        cap = self.settings.locks_per_user
        try:
            tables = network_lock_tables() if cap else []
        except OSError:  # no nftables here: CRIU cannot lock either
            return []
        held = [c for c in store.list_checkpoints() if _holds_lock(c, tables)] if tables else []  # oldest first
        excess = len(held) - (cap or 0) + 1
        if excess <= 0:
            return []
        dropped = drop_network_locks([c.images for c in held[:excess]])
        log.info("uid %d: released the network locks of its %d oldest checkpoints (at most %d per user)", uid,
                 len(dropped), cap)
        return dropped

    def release_failed_dump(self, uid: int, store: Store, name: str, since: float) -> str | None:
        """Drop the network lock of a dump of ``name`` that failed since ``since`` (killed or crashed
        after taking it); its table's name."""
        path = store.root / "procs" / name / "dump-failed.log"
        try:
            if path.stat().st_mtime < since - 1:
                return None
            with open(path, "rb") as f:
                m = _RUN_ID.search(f.read(4096).decode(errors="replace"))
        except OSError:
            return None
        table = drop_network_lock_of(m.group(1)) if m else None
        if table:
            log.info("uid %d: released the network lock %s of a dump that failed", uid, table)
        return table

    # -- logs -----------------------------------------------------------------------------
    def start(self) -> threading.Thread | None:
        """The log watchdog, when logs are capped."""
        if self.settings.log_bytes is None:
            return None
        thread = threading.Thread(target=self._watch_logs, daemon=True, name="log-watchdog")
        thread.start()
        return thread

    def stop(self) -> None:
        self._stop.set()

    def _watch_logs(self) -> None:
        while not self._stop.wait(LOG_CHECK_EVERY):
            try:
                self.cut_logs()
            except Exception:  # noqa: BLE001 - the watchdog must outlive any one store's surprise
                log.exception("the log watchdog failed; it goes on")

    def cut_logs(self) -> list[Path]:
        """Cut back every log over the cap whose process no operation holds: a running process's
        to its newest half, another's by punching holes (its size kept for CRIU); the logs cut.
        A log's copies kept by a restore (``stdout.log.TIME``) are cut as a running one."""
        cap = self.settings.log_bytes
        cut: list[Path] = []
        if cap is None:
            return cut
        for proc_dir in self.users.glob("*/procs/*"):
            logs = [p for n in LOGS for p in proc_dir.glob(f"{n}*")]
            running = _running(proc_dir) if logs else False
            if not any(_over(p, cap, running or p.name not in LOGS) for p in logs):
                continue
            try:
                with exclusive(proc_dir, proc_dir.name, "cutting its log"):
                    running = _running(proc_dir)  # again, under the lock
                    for path in logs:
                        dropped = _cut_one(path, cap, running or path.name not in LOGS)
                        if dropped:
                            log.info("uid %s: cut %d bytes from the start of %s (at most %d per log)",
                                     proc_dir.parent.parent.name, dropped, path, cap)
                            cut.append(path)
            except (BusyError, OSError):
                continue  # an operation holds it, or it went away: next round
        return cut


def _dump_folder(store: Store, name: str, before: set[str]) -> Path | None:
    """The temporary folder of the dump of ``name`` under way (not among those there ``before``)."""
    return next((p for p in store.checkpoints_root.glob(".tmp-*") if p.name not in before and name_of_id(p.name) == name),
                None)


def _running(proc_dir: Path) -> bool:
    rec = read_record(proc_dir)
    return rec.get("state") == "running" and is_alive(rec.get("pid"))


def _over(path: Path, cap: int, may_shrink: bool) -> bool:
    """Whether a log passes ``cap``: by its blocks, or by its size too where it may be cut."""
    return _blocks(path) > cap or (may_shrink and _size(path) > cap)


def _cut_one(path: Path, cap: int, may_shrink: bool) -> int:
    """Bring one log under ``cap``, cut or holes punched; the bytes it gave back (0: it was under)."""
    if not _over(path, cap, may_shrink):
        return 0
    return cut_log(path, cap) if may_shrink else punch_log(path, cap)


def cut_log(path: Path, cap: int) -> int:
    """Cut ``path`` back to its newest ``cap // 2`` bytes (from a line start), behind a line saying
    so; the bytes dropped. Output written meanwhile can be lost. The copy moves toward the start
    of the file, chunk by chunk, so the daemon never holds a log in memory."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # not O_APPEND: pwrite would append
    try:
        size = os.fstat(fd).st_size
        src = max(0, size - cap // 2)
        first = os.pread(fd, 4096, src).find(b"\n")
        src += first + 1 if first >= 0 else 0
        note = (f"[gpucr: {src} bytes of earlier output were cut here; gpucr-daemon keeps at most {cap} bytes "
                "of a process's log]\n").encode()
        os.pwrite(fd, note, 0)
        dst = len(note)
        while src < size:
            chunk = os.pread(fd, min(1 << 20, size - src), src)
            if not chunk:
                break
            os.pwrite(fd, chunk, dst)
            src += len(chunk)
            dst += len(chunk)
        os.ftruncate(fd, dst)  # also frees blocks allocated past the end (fallocate --keep-size)
        return size - dst + len(note)
    finally:
        os.close(fd)


def punch_log(path: Path, cap: int) -> int:
    """Give back the blocks of ``path`` but for its newest ``cap // 2`` bytes, keeping its size
    (CRIU checks it when it restores the process that holds the log), behind a line saying so;
    the bytes given back."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)
    try:
        before = os.fstat(fd).st_blocks * 512
        size = os.fstat(fd).st_size
        keep_from = max(0, size - cap // 2)
        _punch(fd, 0, keep_from)
        os.ftruncate(fd, size)  # the same size: frees blocks allocated past the end
        note = (f"[gpucr: {keep_from} bytes of earlier output were cut here; gpucr-daemon keeps at most {cap} "
                "bytes of a process's log]\n").encode()
        if len(note) <= keep_from:
            os.pwrite(fd, note, 0)
        return max(0, before - os.fstat(fd).st_blocks * 512)
    finally:
        os.close(fd)



def _punch(fd: int, start: int, end: int) -> None:
    """Free the blocks of ``fd`` from ``start`` to ``end`` (below its size), its size kept."""
    if end > start and _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, start, end - start) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _kill_writers(folder: Path) -> None:
    """SIGKILL every process of this daemon that was started on ``folder`` (the dump's CRIU and its
    wrappers), the deepest first: the checkpointer sees the dump fail and puts the process back."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        with suppress(psutil.Error):
            if any(str(folder) in arg for arg in proc.cmdline()):
                found.append(proc)
    for proc in reversed(found):
        with suppress(psutil.Error):
            proc.send_signal(signal.SIGKILL)


def checkpoint_estimate(pid: int) -> int:
    """About what a checkpoint of the tree at ``pid`` writes: its memory and its GPU memory."""
    pids = tree(pid)
    used = gpus.gpus_of(pids) if any(cuda.uses_cuda(p) for p in pids) else []
    return tree_rss(pid) + sum(u["memory_used"] for u in used)


def disk_usage(root: Path) -> int:
    """Bytes on disk under ``root`` (a log with holes counts what it holds, a file of several
    links once)."""
    total = 0
    seen: set[tuple[int, int]] = set()
    for top, dirs, files in os.walk(root):
        for name in files + dirs:
            with suppress(OSError):
                st = os.lstat(os.path.join(top, name))
                if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def _blocks(path: Path) -> int:
    """The bytes a file holds on disk, holes left out and blocks allocated past its end counted."""
    try:
        return os.stat(path, follow_symlinks=False).st_blocks * 512
    except OSError:
        return 0


def _size(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError:
        return 0


def _holds_lock(ckpt: Checkpoint, tables: list[str]) -> bool:
    did = dump_id(ckpt.images)
    return bool(did) and any(did.startswith(t.removeprefix("CRIU-")) for t in tables if len(t) > 12)


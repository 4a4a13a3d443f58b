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
  user's disk quota does not apply: a watchdog cuts a running process's log back to its newest half
  when it passes ``log_bytes``, with a line saying so, and never while an operation holds the
  process (CRIU checks an open file's size when it restores).
- Store bytes. A checkpoint whose estimate would take the user's store past ``store_bytes`` is
  refused before the process is touched.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core import cuda, gpus
from ..core.criu import drop_network_lock_of, drop_network_locks, dump_id, network_lock_tables
from ..core.errors import BusyError, PreconditionError
from ..core.locks import exclusive
from ..core.names import validate_name
from ..core.procs import is_alive, tree, tree_rss
from ..core.store import Checkpoint, Store, read_record

log = logging.getLogger("gpucr-daemon")
#: How often the watchdog looks at the logs: a process may pass the cap by what it writes meanwhile.
LOG_CHECK_EVERY = 1.0
LOGS = ("stdout.log", "stderr.log")
_RUN_ID = re.compile(r"CRIU run id = ([0-9a-f]{8}-[0-9a-f-]{27})")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class QuotaSettings:
    """Each None (or 0 on the command line) turns that limit off."""

    store_bytes: int | None = None
    log_bytes: int | None = 64 << 20
    locks_per_user: int | None = 32


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


class Quotas:
    """The limits of one daemon over its ``state_dir/users/UID`` stores."""

    def __init__(self, state_dir: Path, settings: QuotaSettings = QuotaSettings(), keep_last: int = 1) -> None:
        self.users = state_dir / "users"
        self.settings = settings
        self.keep_last = keep_last
        self._stop = threading.Event()

    @contextmanager
    def around(self, op: str, uid: int, args: dict[str, Any]) -> Iterator[None]:
        """Around one request: a checkpoint is checked against the store quota and makes room for
        its network lock first, and the lock of a dump that failed is released after."""
        name = args.get("name")
        if op != "checkpoint" or not isinstance(name, str):
            yield
            return
        store = Store(self.users / str(uid))
        validate_name(name)
        self.check_store(store, name)
        if not args.get("leave_running"):  # a dump that leaves the process running releases its lock itself
            self.make_room_for_lock(uid, store)
        since = time.time()
        try:
            yield
        except BaseException:
            self.release_failed_dump(uid, store, name, since)
            raise

    # -- store bytes ----------------------------------------------------------------------
    def check_store(self, store: Store, name: str) -> None:
        quota = self.settings.store_bytes
        rec = read_record(store.root / "procs" / name)
        pid = rec.get("pid")
        if quota is None or rec.get("state") != "running" or not isinstance(pid, int) or not is_alive(pid):
            return  # the verb says why it cannot checkpoint
        need = checkpoint_estimate(pid)
        used = disk_usage(store.root)
        older = store.list_checkpoints(name)
        freed = sum(c.size for c in older[:max(0, len(older) - (self.keep_last - 1))])  # what retention deletes
        if used - freed + need <= quota:
            return
        also = f", {mib(freed)} of which its older checkpoints would free" if freed else ""
        raise PreconditionError(
            f"Checkpointing {name!r} would take your checkpoints past your quota of {mib(quota)} on this host: it "
            f"needs about {mib(need)}, and your checkpoints and logs use {mib(used)} now{also}. The process was left running.",
            "Delete suspended kernels or checkpoints you no longer need (and empty the trash), or ask the "
            "administrator for a larger quota (gpucr-daemon --store-quota).")

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
        """Cut back every running process's log over the cap whose process no operation holds;
        the logs cut."""
        cap = self.settings.log_bytes
        cut: list[Path] = []
        if cap is None:
            return cut
        for proc_dir in self.users.glob("*/procs/*"):
            over = [p for p in (proc_dir / n for n in LOGS) if _bytes(p) > cap]
            if not over:
                continue
            try:
                with exclusive(proc_dir, proc_dir.name, "cutting its log"):
                    rec = read_record(proc_dir)
                    if rec.get("state") != "running" or not is_alive(rec.get("pid")):
                        continue  # a suspended process's log must keep the size CRIU recorded
                    for path in over:
                        dropped = cut_log(path, cap)
                        log.info("uid %s: cut %d bytes from the start of %s (at most %d per log)",
                                 proc_dir.parent.parent.name, dropped, path, cap)
                        cut.append(path)
            except (BusyError, OSError):
                continue  # an operation holds it, or it went away: next round
        return cut


def cut_log(path: Path, cap: int) -> int:
    """Cut ``path`` back to its newest ``cap // 2`` bytes (from a line start), behind a line saying
    so; the bytes dropped. Output written meanwhile can be lost. The copy moves toward the start
    of the file, chunk by chunk, so the daemon never holds a log in memory."""
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW)  # not O_APPEND: pwrite would append
    try:
        size = os.fstat(fd).st_size
        src = size - cap // 2
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
        os.ftruncate(fd, dst)
        return size - dst + len(note)
    finally:
        os.close(fd)


def checkpoint_estimate(pid: int) -> int:
    """About what a checkpoint of the tree at ``pid`` writes: its memory and its GPU memory."""
    pids = tree(pid)
    used = gpus.gpus_of(pids) if any(cuda.uses_cuda(p) for p in pids) else []
    return tree_rss(pid) + sum(u["memory_used"] for u in used)


def disk_usage(root: Path) -> int:
    """Bytes on disk under ``root`` (a log with holes counts what it holds)."""
    total = 0
    for top, dirs, files in os.walk(root):
        for name in files + dirs:
            with suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_blocks * 512
    return total


def _bytes(path: Path) -> int:
    """What a log takes: its size, or the blocks it holds where the writer left holes (a process
    can clear O_APPEND on its output and write past the cut)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return 0
    return min(st.st_size, st.st_blocks * 512)


def _holds_lock(ckpt: Checkpoint, tables: list[str]) -> bool:
    did = dump_id(ckpt.images)
    return bool(did) and any(did.startswith(t.removeprefix("CRIU-")) for t in tables if len(t) > 12)


"""Save points: keep a kernel's whole state at a moment, go on, and go back to it (issue 44).

``POST /api/gpucr/kernels/{id}/savepoints`` with ``{"name": "before training"}`` takes one. Of a
running kernel it is the checkpoint a fork's source gets (``fork_source.py``): its messages wait
in the server, its GPU tensors go out into files and back, CRIU dumps it and leaves it running;
the kernel runs on as it was. Of a suspended kernel it is a copy of the checkpoint it is in, made
of hard links (instant). Either way it is a checkpoint of the kernel with the reason
``savepoint`` (``core/storage/store.py``), kept with the copies of the files the kernel had open for
writing (its history database and logs: ``fork-files/ID``) and links to its offloaded GPU
tensors (``savepoint-tensors/ID``). A kernel keeps ``c.GPUCR.max_save_points`` of them, the
oldest dropped; they count in the store's byte quota like every checkpoint; shutting the
kernel down takes them with it (to the trash when it is on disk). One whose server died while
taking it is half made (its kept files, its tensors): the next server's recovery removes it.

Going back (``POST .../savepoints/{sp}/restore``) suspends a running kernel as usual, puts the
checkpoint it is then in into the trash (restorable from there, which replaces the kernel), and
restores the kernel under its id from a copy of the save point (hard links again: the save point
stays, to go back to again). Before anything is touched, the files the save point's image has
open are checked as a restore checks them: one that changed size since is named, and nothing is
done. The kernel's own files (history, logs) go back with it. A server that dies going back
leaves the kernel at the save point (once its copy is made: the copy names the kernel as the
suspend's checkpoint did) or in the state it left (before: the next server puts that state back
from the trash, ``relist.py``), never in neither.

``POST .../savepoints/{sp}/fork``: new kernels from the save point, as a fork of a suspended
kernel is made; the kernel itself is not touched.

Only the whole-process engine makes save points (not the snapshot engine), the server's own or
the gpucr daemon's; going back is refused with object storage (``c.GPUCR.store`` a URL). Through
the daemon, the images stay in the user's store of the daemon: the daemon dumps, copies and reads
them (``CheckpointBackend``), for that user only, every save point dumped in full and sharing no
pages; forks from a save point are not made there.

Save points share the pages that did not change (``core/storage/chain.py``). Where the machine's
kernel tracks the pages a process writes, a running kernel's second and later save points are
dumped incrementally (CRIU's ``--track-mem`` against its last save point: only the pages written
since, which shortens its pause; ``core/steps/incremental.py``). Where it does not (no
CONFIG_MEM_SOFT_DIRTY: the machines this was built on), every dump is full and says why in its
``memory``; the previous save point is then rewritten to take its unchanged pages from the new
one, after the pause (the newest holds all its pages, so going back to it restores as fast as
ever, and dropping the oldest copies nothing). Either way only the changed pages stay on disk
more than once, and a save point whose pages another takes copies them in before it goes.

GPU tensors too: a running kernel's save point writes only the tensors whose bytes changed since its
last save point (``gpucr_hooks.fingerprints``); the others are hard links to that save point's
files (``savepoint-tensors/ID``). A save point's size counts the tensor files no newer one links to.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from tornado import web

from ..core.errors import GPUCRError, NotFoundError, PreconditionError, StateError
from ..core.files import make_private_dir
from ..core.forks.copies import KEPT_FILES, _flat, written_files
from ..core.storage.store import GO_BACK, SAVE_POINT, Checkpoint, is_save_point
from . import kernel_rpc
from .engines import OFFLOAD_DIR, SuspendEngine
from .fork_source import checkpoint_running, keep_files, link_all
from .kernel_forks import MAX_FORKS, KernelForker
from .kernels import KernelOperations
from .lifecycle import RUNNING, SUSPENDED
from .preparation import SAVEPOINT_TENSORS, save_point_tensors

#: The longest name a save point may have, and how much of the last cell's code is kept.
MAX_NAME = 200
MAX_CODE = 2000
_NOT_CHECKED = ("/proc/", "/sys/", "/dev/")


class SavePoints:
    """The save points of one server's kernels (see the module docstring)."""

    def __init__(self, ops: KernelOperations, criu: SuspendEngine, forker: KernelForker) -> None:
        self.ops = ops
        self.store = ops.store
        self.criu = criu  # the whole-process engine, whose checks a running kernel's save point passes
        self.forker = forker

    # -- looking -------------------------------------------------------------------------
    def listed(self, kernel_id: str) -> list[dict[str, Any]]:
        """The kernel's save points, oldest first."""
        self.ops.kernel(kernel_id)
        return [self.summary(c) for c in self._of(kernel_id)]

    def _of(self, kernel_id: str) -> list[Checkpoint]:
        return [c for c in self.store.list_checkpoints(kernel_id) if is_save_point(c)]

    def get(self, kernel_id: str, sp_id: str) -> Checkpoint:
        self.ops.kernel(kernel_id)
        for c in self._of(kernel_id):
            if c.id == sp_id:
                return c
        raise NotFoundError(f"Kernel {kernel_id} has no save point {sp_id!r}.",
                            f"List them with GET /api/gpucr/kernels/{kernel_id}/savepoints.")

    def summary(self, ckpt: Checkpoint) -> dict[str, Any]:
        sp = ckpt.manifest.get("savepoint") or {}
        return {"id": ckpt.id, "kernel_id": ckpt.name, "name": sp.get("name"), "created": ckpt.created,
                "size": ckpt.size + self._tensor_bytes(ckpt), "cell": sp.get("cell"), "kernel_state": sp.get("kernel_state"),
                "paused_s": sp.get("paused_s"), "kind": ckpt.kind, "parent": ckpt.manifest.get("parent"),
                "memory": ckpt.manifest.get("memory")}

    def _tensor_bytes(self, ckpt: Checkpoint) -> int:
        """The bytes of the save point's GPU tensor files that no newer save point links to (those
        count with the newest that has them, as shared pages do), so that the sizes add up."""
        mine = self._tensors(ckpt)
        if not mine.is_dir():
            return 0
        newer = [c for c in self._of(ckpt.name) if c.created > ckpt.created]
        theirs = {f.stat().st_ino for c in newer if self._tensors(c).is_dir() for f in self._tensors(c).iterdir()}
        return sum(st.st_size for f in mine.iterdir() if (st := f.stat()).st_ino not in theirs)

    # -- save ----------------------------------------------------------------------------
    async def save(self, kernel_id: str, name: str | None = None) -> dict[str, Any]:
        """Take a save point; the kernel is left as it was. Returns its summary (``paused_s``: how
        long a running kernel was paused for it, ``pause``: where that went)."""
        km = self._kernel(kernel_id)
        name = _checked_name(name)
        t0 = time.perf_counter()
        async with self.ops.operation(kernel_id):
            state = self.ops.lifecycle.state_of(kernel_id)
            if state == RUNNING:
                await self._check_running(km)  # before the history request, whose own 'busy' it would see
            idle = km.execution_state
            details = {"name": name, "cell": await self._last_cell(kernel_id, km, state), "kernel_state": state}
            if state == RUNNING:
                source = await checkpoint_running(self.ops, kernel_id, km, SAVE_POINT, {"savepoint": details},
                                                  detach=idle, incremental=True,
                                                  save_point_after=save_point_tensors(self.store, kernel_id))
                ckpt, pause = source.checkpoint, source.report
                if source.tensors is not None:
                    make_private_dir(self.store.proc_dir(kernel_id) / SAVEPOINT_TENSORS)
                    os.rename(source.tensors, self._tensors(ckpt))
            elif state == SUSPENDED:
                now = self._criu_checkpoint(kernel_id)
                ckpt = await asyncio.to_thread(self.ops.checkpointer.copy_checkpoint, now.id, SAVE_POINT,
                                               {"savepoint": details})
                pause = None
                offloaded = self.store.proc_dir(kernel_id) / OFFLOAD_DIR
                if offloaded.is_dir():
                    link_all(offloaded, self._tensors(ckpt))
                await asyncio.to_thread(keep_files, self.ops, ckpt)
            else:
                raise StateError(f"The kernel is {state}.", "Take a save point once it is running or suspended.")
            shared = await asyncio.to_thread(self._share_with, ckpt)
            dropped = self._apply_limit(kernel_id)
        out = self.summary(ckpt)
        out["took_s"] = round(time.perf_counter() - t0, 3)
        if pause is not None:
            out["paused_s"] = pause.get("paused_s")
            out["pause"] = pause
        out["dropped"] = dropped
        out["shared"] = shared
        self.ops.log.info("gpucr: save point %s of kernel %s (%s, %d MiB)", ckpt.id, kernel_id, name or "unnamed",
                              out["size"] >> 20)
        return out

    def _share_with(self, ckpt: Checkpoint) -> dict[str, Any] | None:
        """Where the new save point holds all its pages (a full dump, or a copy of the checkpoint
        a suspended kernel is in), the previous one takes those it has unchanged from it instead
        (see the module docstring). What was shared: the previous save point, and its bytes before
        and after; None when nothing was (the new one is incremental, or the first, or the backend
        shares no pages: the daemon's)."""
        if ckpt.manifest.get("parent"):
            return None
        older = [c for c in self._of(ckpt.name) if c.id != ckpt.id and not c.manifest.get("parent")]
        if not older:
            return None
        previous, t0 = older[-1], time.perf_counter()
        try:
            size_after = self.ops.checkpointer.share_pages(previous.id, ckpt.id)
        except (GPUCRError, OSError) as e:  # it stays as it was: whole, only bigger
            self.ops.log.warning("gpucr: save point %s keeps all its pages: %s", previous.id, e)
            return None
        if size_after is None:
            return None
        return {"id": previous.id, "size_before": previous.size, "size_after": size_after,
                "seconds": round(time.perf_counter() - t0, 3)}

    def _apply_limit(self, kernel_id: str) -> list[str]:
        """Drop the oldest save points past ``c.GPUCR.max_save_points``."""
        keep = max(1, int(self.ops.options.max_save_points))
        dropped = []
        for old in self._of(kernel_id)[:-keep]:
            self._remove(old)
            dropped.append(old.id)
        return dropped

    async def _last_cell(self, kernel_id: str, km: Any, state: str) -> dict[str, Any] | None:
        """The cell the kernel ran last (its execution count and code), from the kernel's own
        history: asked of a running kernel (one round trip), read from a suspended one's history
        database. None when neither answers."""
        try:
            if state == RUNNING:
                return await asyncio.wait_for(kernel_rpc.with_client(km, _history_tail), 3.0)
            db = self.store.proc_dir(kernel_id) / kernel_rpc.HISTORY_FILE
            return await asyncio.to_thread(_history_db_tail, db) if db.is_file() else None
        except Exception as e:  # the save point does not need it
            self.ops.log.debug("gpucr: the last cell of kernel %s is not known: %s", kernel_id, e)
            return None

    # -- go back -------------------------------------------------------------------------
    async def go_back(self, kernel_id: str, sp_id: str) -> tuple[Any, str]:
        """The kernel back at save point ``sp_id`` under its id, running; the state it left goes
        to the trash. Returns the kernel's state and the trash id."""
        km = self._kernel(kernel_id)
        sp = self.get(kernel_id, sp_id)
        if self.ops.remote:
            raise PreconditionError("Going back to a save point is not available with object storage yet.",
                                    "Fork from the save point instead (POST .../savepoints/{sp}/fork).")
        await asyncio.to_thread(self._check_files, kernel_id, sp)
        async with self.ops.operation(kernel_id):
            state = self.ops.lifecycle.state_of(kernel_id)
            if state == RUNNING:
                await self._check_running(km)
                await self.ops.suspend_now(kernel_id, GO_BACK, "criu")
            elif state != SUSPENDED:
                raise StateError(f"The kernel is {state}.", "Go back once it is running or suspended.")
            left = self._criu_checkpoint(kernel_id)
            path = await self.ops.notebook_path(kernel_id)
            trash_id = await asyncio.to_thread(self.store.trash_checkpoint, kernel_id, left.id, GO_BACK,
                                               {"notebook_path": path, "savepoint": sp.id}, (OFFLOAD_DIR,))
            try:
                copy = await asyncio.to_thread(self._prepare, kernel_id, sp, left)
            except BaseException:
                with contextlib.suppress(GPUCRError, OSError):
                    self.store.put_back_trashed_checkpoint(trash_id, (OFFLOAD_DIR,))
                raise
            self.ops.log.info("gpucr: kernel %s goes back to save point %s (as %s); the state it left is in the "
                                  "trash as %s", kernel_id, sp.id, copy.id, trash_id)
        try:
            st = await self.ops.resume(kernel_id)
        except GPUCRError as e:
            e.hint = (f"{e.hint} The kernel is suspended at the save point; the state it left is in the trash "
                      f"({trash_id}).").strip()
            raise
        return st, trash_id

    def _prepare(self, kernel_id: str, sp: Checkpoint, left: Checkpoint) -> Checkpoint:
        """The kernel's folder as at the save point (its written files, its GPU tensors), and the
        copy of the save point it is restored from (the newest checkpoint: the one it is in). The
        copy names the kernel (its sessions, saved replies) as ``left``, the suspend's checkpoint it
        replaces, does: a server that dies before the restore lists the kernel from it."""
        d = self.store.proc_dir(kernel_id)
        kept = d / KEPT_FILES / sp.id
        for path in written_files(self.ops.checkpointer.image_files(sp)):
            kept_copy = kept / _flat(path)
            if Path(path).parent == d and kept_copy.is_file():
                shutil.copy2(kept_copy, path)
        tensors = self._tensors(sp)
        if tensors.is_dir():
            link_all(tensors, d / OFFLOAD_DIR)
        kernel = {"kernel": left.manifest["kernel"]} if "kernel" in left.manifest else {}
        copy = self.ops.checkpointer.copy_checkpoint(sp.id, GO_BACK, {"from_savepoint": sp.id, **kernel},
                                                     drop=("savepoint",))
        rec = self.store.read_proc(kernel_id)
        self.store.write_proc(kernel_id, {**rec, "checkpoint": copy.id})
        return copy

    def _check_files(self, kernel_id: str, sp: Checkpoint) -> None:
        """The files the save point's image has open, as its restore will check them (their size),
        but before anything is touched; the kernel's own (history, logs) go back with it."""
        d = str(self.store.proc_dir(kernel_id))
        changed = []
        for f in self.ops.checkpointer.image_files(sp):
            path = f.path if f.path.startswith("/") else f"/{f.path}"
            if f.size is None or path.startswith(_NOT_CHECKED) or path.startswith(d + "/"):
                continue
            with contextlib.suppress(OSError):  # gone: CRIU brings its own copy back (a deleted file)
                now = os.stat(path).st_size
                if now != f.size:
                    changed.append(f"{path} ({f.size} bytes then, {now} now)")
        if changed:
            raise StateError(
                f"The kernel had {'these files' if len(changed) > 1 else 'this file'} open at the save point, "
                f"and {'they have' if len(changed) > 1 else 'it has'} changed since: {', '.join(changed)}. "
                "Nothing was done; the kernel is as it was.",
                "Put the file back as it was (or 'truncate -s SIZE FILE' to the size it had), or fork from the save "
                "point instead.")

    # -- fork, delete --------------------------------------------------------------------
    async def fork(self, kernel_id: str, sp_id: str, count: int = 1, gpu: str = "auto") -> list[str]:
        """``count`` new kernels from the save point; the kernel is not touched."""
        km = self._kernel(kernel_id)
        sp = self.get(kernel_id, sp_id)
        if not 1 <= count <= MAX_FORKS:
            raise StateError(f"Cannot make {count} forks.", f"Ask for 1 to {MAX_FORKS}.")
        ids = [str(uuid.uuid4()) for _ in range(count)]
        tensors = self._tensors(sp)
        async with self.ops.operation(kernel_id):
            await self.forker.make(km, kernel_id, ids, gpu, sp, tensors if tensors.is_dir() else None)
        return ids

    async def delete(self, kernel_id: str, sp_id: str) -> None:
        sp = self.get(kernel_id, sp_id)
        async with self.ops.operation(kernel_id):
            await asyncio.to_thread(self._remove, sp)

    def _remove(self, sp: Checkpoint) -> None:
        with contextlib.suppress(NotFoundError):
            self.store.delete(sp.id)
        d = self.store.proc_dir(sp.name)
        shutil.rmtree(d / SAVEPOINT_TENSORS / sp.id, ignore_errors=True)
        shutil.rmtree(d / KEPT_FILES / sp.id, ignore_errors=True)

    # -- helpers -------------------------------------------------------------------------
    def _kernel(self, kernel_id: str) -> Any:
        km = self.ops.kernel(kernel_id)
        why_not = self.ops.checkpointer.cannot_save_points()
        if why_not:
            raise PreconditionError(f"Save points cannot be made on this server: {why_not}.",
                                    "Suspend and restore work as before.")
        return km

    async def _check_running(self, km: Any) -> None:
        problem = self.criu.problem(km)
        if problem:
            raise PreconditionError(f"This kernel cannot have save points: {problem}.",
                                    "Save points are made by the whole-process engine.")
        if await self.ops.busy_after(km, 1.0):  # a cell's closing 'idle' may still be on its way
            raise StateError("The kernel is running a cell.", "Take the save point (or go back) when it has finished.")

    def _criu_checkpoint(self, kernel_id: str) -> Checkpoint:
        ckpt = self.store.latest(kernel_id)
        if ckpt is None or ckpt.manifest.get("engine") != "criu":
            raise PreconditionError("This kernel was suspended as saved variables, which have no save points.",
                                    "Resume it, then take the save point.")
        return ckpt

    def _tensors(self, ckpt: Checkpoint) -> Path:
        return self.store.proc_dir(ckpt.name) / SAVEPOINT_TENSORS / ckpt.id


def _checked_name(name: Any) -> str | None:
    if name is None or name == "":
        return None
    if not isinstance(name, str) or len(name) > MAX_NAME or not name.isprintable():
        raise web.HTTPError(400, f"'name' is a printable text of at most {MAX_NAME} characters.")
    return name


async def _history_tail(client: Any, timeout: float = 3.0) -> dict[str, Any] | None:
    """The kernel's last cell from its history (a ``history_request``, which IPython answers from memory)."""
    msg_id = client.history(raw=True, output=False, hist_access_type="tail", n=1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reply = await client.get_shell_msg(timeout=max(0.01, deadline - time.monotonic()))
        if reply.get("parent_header", {}).get("msg_id") == msg_id:
            history = reply.get("content", {}).get("history") or []
            if not history:
                return None
            _session, line, code = history[-1]
            return {"execution_count": line, "code": str(code)[:MAX_CODE]}
    return None


def _history_db_tail(db: Path) -> dict[str, Any] | None:
    """The last cell in an IPython history database (read only)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1.0)
    try:
        row = con.execute("SELECT line, source_raw FROM history ORDER BY session DESC, line DESC LIMIT 1").fetchone()
    finally:
        con.close()
    return {"execution_count": row[0], "code": str(row[1])[:MAX_CODE]} if row else None


# -- REST -----------------------------------------------------------------------------------

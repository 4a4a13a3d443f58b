"""The checkpoint store: one private directory per process and per checkpoint.

Layout (every directory 0700, every file 0600, since images hold the whole memory of a
process, tokens and data included)::

    ROOT/procs/NAME/            run.json (command, pids, state), stdout.log, stderr.log
    ROOT/checkpoints/ID/        manifest.json, intent.json, images/ (engine payload), dump.log
    ROOT/checkpoints/.tmp-ID/   a checkpoint being written; renamed to ID when complete
    ROOT/trash/ID/              trash.json, checkpoints/ID/..., proc/ (a name put aside, restorable)
    .del-ID                     something being deleted (renamed first, so it is never listed)

A checkpoint directory is renamed into place only once its images and manifest are on disk
(fsync), so a listed checkpoint is complete. Ids are ``NAME-YYYYmmdd-HHMMSS-HEX``: the name a
checkpoint, temporary or trash directory belongs to can be read from it even when its files
cannot.
"""
from __future__ import annotations

import calendar
import json
import os
import re
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypedDict, cast

from ..criu.commands import at_work_in, drop_network_lock, dump_finished
from ..criu.pagemaps import MAX_CHAIN
from ..errors import CheckpointDamagedError, NotFoundError, StateError
from ..files import dir_size, fsync_path, fsync_tree, make_private_dir, tighten_permissions
from ..gpu.gpus import GpuUse
from ..jsonfile import read_json, write_json_atomic
from ..process.procs import is_alive
from ..process.record import ProcRecord
from . import chain
from .checksums import FileDigest, find_mismatches
from .names import validate_name

PROC_RECORD = "run.json"
MANIFEST = "manifest.json"
INTENT = "intent.json"
TRASH_INFO = "trash.json"
FORMAT_VERSION = 1
REQUIRED_KEYS = ("name", "created", "engine", "files")
_ID_SUFFIX = re.compile(r"-(\d{8}-\d{6})-[0-9a-f]{6}$")


class GpuRecord(TypedDict, total=False):
    """The GPUs of a checkpointed process: those it used (with how much), the machine's, and the
    driver it was checkpointed under."""

    used: list[GpuUse]
    all: list[str]  # the machine's GPU UUIDs
    cuda_ns_pids: list[int]
    driver_version: str | None
    cuda_driver_version: str | None


class LostVariable(TypedDict, total=False):
    """A variable the kernel's own snapshot could not keep."""

    name: str
    type: str
    reason: str


class SnapshotRecord(TypedDict, total=False):
    """What a kernel's snapshot of its variables kept and lost (``gpucr_hooks.snapshot``)."""

    kept: list[str]
    lost: list[LostVariable]
    bytes: int | None
    devices: dict[str, Any]


class Manifest(TypedDict, total=False):
    """A checkpoint's manifest (``manifest.json``; before the dump, the same less files, size and
    timings is its intent). ``name``, ``created``, ``engine`` and ``files`` are required on disk
    (``read_manifest``); a front end adds keys of its own (``kernel``, ``offload``, ``owner``)."""

    id: str
    format_version: int
    name: str
    created: float
    engine: Literal["criu", "snapshot"]
    files: dict[str, FileDigest]  # relative path -> size and digest
    size: int
    timings: dict[str, float]
    started: float
    reason: str
    pid: int
    ns_pid: int
    command: list[str] | None
    cwd: str | None
    leave_running: bool
    recovered: bool  # committed by recovery after its writer died
    criu: dict[str, Any]
    gpu: GpuRecord
    host: dict[str, Any]  # the machine: hostname, kernel, Python, user, boot, and CPU features (nodecompat)
    gpucr_version: str
    snapshot: SnapshotRecord
    kernel: dict[str, Any]
    engine_reason: str
    offload: dict[str, Any]
    owner: dict[str, Any]
    daemon_images: str  # a mirror of a checkpoint whose images are in the gpucr daemon's store
    in_trash: float  # when a front end's trash took it, its images staying here (IN_TRASH)
    savepoint: dict[str, Any]  # a save point's name, last cell and state (server/savepoints.py)
    from_savepoint: str  # the save point a process went back to (this checkpoint is its copy)
    open_files: dict[str, Any]  # the files its process holds open, for a restore elsewhere (core/storage/openfiles.py)
    parent: str  # the checkpoint its images take unchanged pages from (core/storage/chain.py)
    memory: dict[str, Any]  # how the dump took the memory: incremental or full, and why full (core/steps/incremental.py)


def read_record(proc_dir: Path) -> ProcRecord:
    """The record in a process's folder; {} when it has none (or an unreadable one)."""
    return cast(ProcRecord, read_json(proc_dir / PROC_RECORD) or {})


#: A checkpoint's reason when it is a save point: taken to go back to, kept beside the process's
#: other checkpoints, never the one it is suspended in (``latest``), with a retention of its own.
SAVE_POINT = "savepoint"
#: The reason of the copy of a save point a process goes back to, and of the trash entry of the state it left.
GO_BACK = "goback"


def is_save_point(ckpt: Checkpoint) -> bool:
    return ckpt.manifest.get("reason") == SAVE_POINT


#: A manifest's mark on a checkpoint that a front end's trash holds while its images stay in this
#: store (the gpucr daemon's, whose client keeps only a manifest in its own trash): set aside as
#: the trash sets a checkpoint aside, never the latest and out of retention's reach, until it is
#: put back or deleted (:meth:`Store.set_in_trash`).
IN_TRASH: Final = "in_trash"


def in_trash(ckpt: Checkpoint) -> bool:
    return IN_TRASH in ckpt.manifest


def default_root() -> Path:
    env = os.environ.get("GPUCR_STORE")
    if env and "://" not in env:  # a URL is object storage; the local store is then the cache directory
        return Path(env)
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "jupyter-gpucr"


def new_id(name: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return f"{validate_name(name)}-{stamp}-{secrets.token_hex(3)}"


def name_of_id(cid: str) -> str | None:
    """The process name a checkpoint, temporary or trash id was made for."""
    m = _ID_SUFFIX.search(cid.removeprefix(".tmp-").removeprefix(".del-"))
    return cid.removeprefix(".tmp-").removeprefix(".del-")[: m.start()] if m else None


def time_of_id(cid: str) -> float:
    """When an id was made (to the second), 0 when it has no stamp."""
    m = _ID_SUFFIX.search(cid)
    return float(calendar.timegm(time.strptime(m.group(1), "%Y%m%d-%H%M%S"))) if m else 0.0


def _damaged(path: Path, problem: str) -> CheckpointDamagedError:
    return CheckpointDamagedError(
        f"Checkpoint {path.name} is damaged: {problem}.",
        f"Its images are kept in {path}; nothing was deleted. Restore an older checkpoint "
        f"('gpucr restore NAME --checkpoint ID'), or remove this one with 'gpucr rm {path.name}'.")


def read_manifest(path: Path) -> Manifest:
    """The manifest of the checkpoint directory ``path``; CheckpointDamagedError (naming the file)
    when it is missing, unparseable or incomplete. The images stay wherever that happens."""
    file = path / MANIFEST
    try:
        manifest = json.loads(file.read_text())
    except FileNotFoundError:
        raise _damaged(path, f"its manifest {file} is missing") from None
    except (OSError, ValueError) as e:
        raise _damaged(path, f"its manifest {file} cannot be read ({e})") from None
    if not isinstance(manifest, dict):
        raise _damaged(path, f"its manifest {file} is not a JSON object")
    missing = [k for k in REQUIRED_KEYS if k not in manifest]
    if missing or not isinstance(manifest.get("files"), dict):
        raise _damaged(path, f"its manifest {file} lacks {', '.join(missing) or 'a valid files list'}")
    return cast(Manifest, manifest)


class CheckpointSummary(TypedDict):
    """A checkpoint as the REST API and the CLI list it."""

    id: str
    name: str
    created: float
    size: int
    engine: Literal["criu", "snapshot"] | None
    reason: str | None
    gpu_model: str | None
    gpus: list[GpuUse]
    kernel_id: str | None
    notebook_path: str | None
    path: str


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk and its manifest."""

    id: str
    path: Path
    manifest: Manifest

    @property
    def name(self) -> str:
        return self.manifest["name"]

    @property
    def created(self) -> float:
        return float(self.manifest["created"])

    @property
    def size(self) -> int:
        return int(self.manifest.get("size", 0))

    @property
    def images(self) -> Path:
        return self.path / "images"

    @property
    def kind(self) -> Literal["cpu", "gpu"]:
        """"gpu" when the process used a GPU when it was checkpointed, else "cpu"."""
        return "gpu" if self.manifest.get("gpu", {}).get("used") else "cpu"

    def ancestors(self) -> list[Checkpoint]:
        """The checkpoints whose pages this one's images take (its parent, that one's...), nearest
        first; CheckpointDamagedError when one is gone (see ``chain.py``)."""
        found: list[Checkpoint] = []
        parent = self.manifest.get("parent")
        while parent:
            path = self.path.parent / parent
            if not path.is_dir() or len(found) >= MAX_CHAIN:
                raise _damaged(self.path, f"the checkpoint {parent} its images take pages from is "
                               + ("missing" if not path.is_dir() else f"past a chain of {MAX_CHAIN}"))
            found.append(Checkpoint(parent, path, read_manifest(path)))
            parent = found[-1].manifest.get("parent")
        return found

    def verify(self, payload: str, contents: bool = True) -> None:
        """Refuse a damaged checkpoint (it stays on disk), or one whose parents are (those it takes
        pages from); ``contents=False`` checks only that every file is there with its size, the
        part that takes no time."""
        problems = find_mismatches(self.path / payload, self.manifest["files"], contents)
        for ancestor in self.ancestors():
            problems += [f"{ancestor.id}/{p}" for p in find_mismatches(ancestor.path / payload, ancestor.manifest["files"],
                                                                       contents)]
        if problems:
            raise CheckpointDamagedError(
                f"Checkpoint {self.id} is damaged: {'; '.join(problems[:5])}.",
                f"It was kept at {self.path} for inspection. Restore an older checkpoint or start fresh.")

    def summary(self) -> CheckpointSummary:
        m = self.manifest
        gpus = m.get("gpu", {}).get("used", [])
        return {
            "id": self.id,
            "name": self.name,
            "created": self.created,
            "size": self.size,
            "engine": m.get("engine"),
            "reason": m.get("reason"),
            "gpu_model": gpus[0]["name"] if gpus else None,
            "gpus": gpus,
            "kernel_id": m.get("kernel", {}).get("kernel_id"),
            "notebook_path": m.get("kernel", {}).get("notebook_path"),
            "path": str(self.path),
        }


class Store:
    """Private on-disk home of processes started for checkpointing and of their checkpoints."""

    def __init__(self, root: Path | str | None = None) -> None:
        self.root = Path(root) if root else default_root()

    # -- layout -------------------------------------------------------------------------
    @property
    def procs_root(self) -> Path:
        return make_private_dir(self.root / "procs")

    @property
    def checkpoints_root(self) -> Path:
        return make_private_dir(self.root / "checkpoints")

    @property
    def trash_root(self) -> Path:
        return make_private_dir(self.root / "trash")

    def proc_dir(self, name: str) -> Path:
        return make_private_dir(self.procs_root / validate_name(name))

    def free_bytes(self) -> int:
        return shutil.disk_usage(make_private_dir(self.root)).free

    # -- processes ----------------------------------------------------------------------
    def read_proc(self, name: str) -> ProcRecord:
        path = self.procs_root / validate_name(name) / PROC_RECORD
        try:
            return cast(ProcRecord, json.loads(path.read_text()))
        except FileNotFoundError:
            raise NotFoundError(
                f"No process or checkpoint named {name!r} in {self.root}.",
                "Run 'gpucr ls' to see the names, or start one with 'gpucr run --name NAME -- CMD'.",
            ) from None

    def write_proc(self, name: str, record: ProcRecord) -> None:
        write_json_atomic(self.proc_dir(name) / PROC_RECORD, record)

    def has_proc(self, name: str) -> bool:
        """Whether ``name`` has a record (a bare checkpoint id has none)."""
        return (self.procs_root / name / PROC_RECORD).exists()

    def proc_names(self) -> list[str]:
        return sorted(p.name for p in self.procs_root.iterdir() if (p / PROC_RECORD).is_file())

    def remove_proc(self, name: str) -> None:
        shutil.rmtree(self.procs_root / validate_name(name), ignore_errors=True)

    # -- checkpoints being written ------------------------------------------------------
    def new_checkpoint_dir(self, name: str) -> tuple[str, Path]:
        """Reserve a checkpoint id and its temporary directory."""
        cid = new_id(name)
        tmp = self.checkpoints_root / f".tmp-{cid}"
        make_private_dir(tmp)
        make_private_dir(tmp / "images")
        return cid, tmp

    @staticmethod
    def write_intent(tmp: Path, intent: Manifest) -> None:
        """Record, before the process is touched, what the manifest needs that is known already,
        so that recovery can finish a checkpoint whose writer died after the dump.

        Not fsynced here: a writer that dies leaves it in the page cache, a power loss takes the
        process with it (its checkpoint could not be finished anyway), and the commit fsyncs it
        with the images. On ext4 an fsync here waited for the journal, i.e. for the disk to take
        the kernel's offloaded tensors already handed to it: 0.9 s before the GPU was touched
        (W2 on the H200)."""
        write_json_atomic(tmp / INTENT, intent, durable=False)

    def tmp_dirs(self, name: str | None = None) -> list[Path]:
        """Temporary checkpoint directories (of ``name``), oldest first."""
        found = [p for p in self.checkpoints_root.iterdir() if p.name.startswith(".tmp-") and p.is_dir()]
        return sorted((p for p in found if name is None or name_of_id(p.name) == name), key=lambda p: p.name)

    @staticmethod
    def completable(tmp: Path) -> bool:
        """Whether a temporary directory holds a finished dump (or a written manifest) that
        recovery can commit: an intent and CRIU's log saying the dump finished."""
        return read_json(tmp / MANIFEST) is not None or (read_json(tmp / INTENT) is not None and dump_finished(tmp))

    def commit_checkpoint(self, cid: str, tmp: Path, manifest: Manifest) -> Checkpoint:
        """Put the images on disk, write the manifest, make everything private, and rename into place."""
        t0 = time.perf_counter()
        tighten_permissions(tmp)
        fsync_tree(tmp)
        timings = {**manifest.get("timings", {}), "fsync": time.perf_counter() - t0}
        manifest = {**manifest, "format_version": FORMAT_VERSION, "id": cid, "timings": timings}
        self.write_manifest(tmp, manifest)
        fsync_path(tmp)
        final = self.checkpoints_root / cid
        os.rename(tmp, final)
        fsync_path(self.checkpoints_root)
        return Checkpoint(cid, final, manifest)

    @staticmethod
    def write_manifest(path: Path, manifest: Manifest) -> None:
        """The manifest of the checkpoint directory ``path``, on disk (not its directory's entry)."""
        write_json_atomic(path / MANIFEST, manifest)

    def discard(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    # -- complete checkpoints -----------------------------------------------------------
    def _checkpoint_dirs(self, name: str | None = None) -> list[Path]:
        return [p for p in self.checkpoints_root.iterdir()
                if not p.name.startswith(".") and p.is_dir() and (name is None or name_of_id(p.name) == name)]

    def checkpoint_ids(self, name: str | None = None) -> list[str]:
        """Ids of every complete checkpoint directory (of ``name``), damaged ones included."""
        return sorted(p.name for p in self._checkpoint_dirs(name))

    def list_checkpoints(self, name: str | None = None) -> list[Checkpoint]:
        """Readable checkpoints, oldest first (damaged ones: :meth:`damaged`)."""
        items = []
        for p in self._checkpoint_dirs(name):
            try:
                items.append(Checkpoint(p.name, p, read_manifest(p)))
            except CheckpointDamagedError:
                continue
        return sorted(items, key=lambda c: (c.created, c.id))

    def damaged(self, name: str | None = None) -> list[CheckpointDamagedError]:
        """Why each checkpoint (of ``name``) whose manifest cannot be used is damaged; its images are kept."""
        problems = []
        for p in self._checkpoint_dirs(name):
            try:
                read_manifest(p)
            except CheckpointDamagedError as e:
                problems.append(e)
        return problems

    def suspended_in(self, name: str) -> list[Checkpoint]:
        """The readable checkpoints of ``name`` a process may be suspended in, oldest first: neither
        save points (:func:`is_save_point`) nor held in a front end's trash (:func:`in_trash`).
        Retention keeps ``keep_last`` of them; the newest is the latest."""
        return [c for c in self.list_checkpoints(name) if not is_save_point(c) and not in_trash(c)]

    def latest(self, name: str) -> Checkpoint | None:
        """The newest checkpoint of ``name`` a process may be suspended in (:meth:`suspended_in`);
        CheckpointDamagedError when the newest one is damaged, rather than silently falling back to
        an older one or to none."""
        items = self.suspended_in(name)
        bad = [p for p in self._checkpoint_dirs(name) if p.name not in {c.id for c in items}]
        newest_bad = max(bad, key=lambda p: time_of_id(p.name), default=None)
        if newest_bad is not None and (not items or time_of_id(newest_bad.name) >= int(items[-1].created)):
            try:
                read_manifest(newest_bad)
            except CheckpointDamagedError as e:
                if items:
                    e.hint += f" The newest intact one is {items[-1].id}."
                raise
        return items[-1] if items else None

    def get(self, cid: str) -> Checkpoint:
        path = self.checkpoints_root / validate_name(cid, "checkpoint id")
        if not path.is_dir():
            raise NotFoundError(f"No checkpoint {cid!r} in {self.root}.", "Run 'gpucr ls' to list them.")
        return Checkpoint(cid, path, read_manifest(path))

    def delete(self, cid: str) -> None:
        """Remove a checkpoint for good (a damaged one too), with the network lock its dump left;
        the checkpoints that take pages from it copy them in first (``chain.release``)."""
        path = self.checkpoints_root / validate_name(cid, "checkpoint id")
        if not path.is_dir():
            raise NotFoundError(f"No checkpoint {cid!r} in {self.root}.", "Run 'gpucr ls' to list them.")
        try:
            read_manifest(path)
        except CheckpointDamagedError:
            pass  # a damaged one gives no pages (nothing could take pages from it)
        else:
            chain.release(self, cid)
        drop_network_lock(path / "images")
        self._remove_dir(path)

    @staticmethod
    def _remove_dir(path: Path) -> None:
        # Rename first so a half-deleted directory is never listed as complete.
        doomed = path.with_name(f".del-{path.name}")
        os.rename(path, doomed)
        shutil.rmtree(doomed, ignore_errors=True)

    def apply_retention(self, name: str, keep_last: int, max_bytes: int | None = None) -> list[str]:
        """Delete older checkpoints of ``name`` beyond ``keep_last``, then oldest ones store-wide
        while the store exceeds ``max_bytes``; the newest checkpoint of each name is always kept.
        Those a front end's trash holds are left to it, as if they were in this store's trash."""
        deleted = []
        # save points have a limit of their own (the server's max_save_points), and count in max_bytes only
        for ckpt in self.suspended_in(name)[: -max(keep_last, 1)]:
            self.delete(ckpt.id)
            deleted.append(ckpt.id)
        if max_bytes is not None:
            items = [c for c in self.list_checkpoints() if not in_trash(c)]
            newest = {c.name: c.id for c in items}
            total = sum(c.size for c in items)
            for ckpt in items:
                if total <= max_bytes:
                    break
                if newest[ckpt.name] == ckpt.id:
                    continue
                self.delete(ckpt.id)
                deleted.append(ckpt.id)
                total -= ckpt.size
        return deleted

    def copy_checkpoint(self, cid: str, reason: str, extra: dict[str, Any] | None = None,
                        drop: tuple[str, ...] = ()) -> Checkpoint:
        """A new checkpoint of the same process holding the same images, made of hard links to
        them (instant, no space): its manifest is the original's with a new id, ``created`` now,
        ``reason``, ``extra`` added and the keys in ``drop`` removed (and a trash's mark, :data:`IN_TRASH`:
        the copy is in no trash); it takes pages from the
        original's parent, if any, as the original does. A save point of a suspended process, and
        the copy of a save point a process goes back to, are made so; neither touches the
        original (a restore only reads its images)."""
        src = self.get(cid)
        new_cid, tmp = self.new_checkpoint_dir(src.name)
        try:
            for dirpath, dirnames, filenames in os.walk(src.path):
                rel = Path(dirpath).relative_to(src.path)
                for d in dirnames:
                    if (Path(dirpath) / d).is_symlink():  # CRIU's parent link, the same from the copy
                        os.symlink(os.readlink(Path(dirpath) / d), tmp / rel / d)
                        continue
                    make_private_dir(tmp / rel / d)
                for f in filenames:
                    if rel == Path(".") and f in (MANIFEST, INTENT):
                        continue
                    os.link(Path(dirpath) / f, tmp / rel / f)
            manifest = cast(Manifest, {k: v for k, v in src.manifest.items() if k not in (*drop, IN_TRASH)})
            manifest.update(cast(Manifest, {**(extra or {}), "reason": reason, "created": time.time()}))
            return self.commit_checkpoint(new_cid, tmp, manifest)
        except BaseException:
            self.discard(tmp)
            raise

    def set_in_trash(self, cid: str, held: bool) -> None:
        """Mark checkpoint ``cid`` as held in a front end's trash (:data:`IN_TRASH`), or no longer."""
        ckpt = self.get(cid)
        manifest = cast(Manifest, {k: v for k, v in ckpt.manifest.items() if k != IN_TRASH})
        if held:
            manifest[IN_TRASH] = time.time()
        self.write_manifest(ckpt.path, manifest)

    def trash_checkpoint(self, name: str, cid: str, reason: str, details: dict[str, Any] | None = None,
                         move: tuple[str, ...] = ()) -> str:
        """Put one checkpoint of ``name`` aside in the trash, with a copy of the files of its
        process folder as they are now (its record, logs, history: what the checkpoint's restore
        needs) and the folders in ``move`` moved there; return the trash id. Restoring it from
        the trash (:meth:`untrash`) brings it back under ``name`` once nothing else uses the name.
        The state a process leaves when it goes back to a save point goes there. Moved alone, it
        takes no pages from another checkpoint, and none takes pages from it (``chain.py``)."""
        src = self.checkpoints_root / validate_name(cid, "checkpoint id")
        if not src.is_dir():
            raise NotFoundError(f"No checkpoint {cid!r} in {self.root}.", "Run 'gpucr ls' to list them.")
        chain.release(self, cid)
        chain.standalone(self, cid)
        tid = new_id(name)
        entry = make_private_dir(self.trash_root / tid)
        write_json_atomic(entry / TRASH_INFO, {**(details or {}), "id": tid, "name": name, "trashed_at": time.time(),
                                               "reason": reason, "checkpoints": [cid]})
        proc, kept = self.proc_dir(name), make_private_dir(entry / "proc")
        copied = []
        for f in proc.iterdir():
            if f.is_file() and not f.is_symlink():
                shutil.copy2(f, kept / f.name)
                copied.append(str(f))
        rec = read_record(kept)
        if rec:  # the copies are new files: a process that had one open is told at its restore (SQLite checks)
            write_json_atomic(kept / PROC_RECORD, {**rec, "state": "checkpointed", "pid": None, "checkpoint": cid,
                                                   "copied_files": copied})
        for folder in move:
            if (proc / folder).exists():
                os.rename(proc / folder, kept / folder)
        make_private_dir(entry / "checkpoints")
        os.rename(src, entry / "checkpoints" / cid)
        tighten_permissions(entry / "checkpoints")
        fsync_path(entry)
        return tid

    def put_back_trashed_checkpoint(self, tid: str, move: tuple[str, ...] = ()) -> None:
        """Undo :meth:`trash_checkpoint`: the checkpoint, the folders in ``move``, and the process
        folder's files as they were then (a go-back cut short may have overwritten its history
        with the save point's, which the checkpoint's restore would find changed); its record and
        hidden files (locks, status) stay as they are now."""
        entry = self._trash_entry(tid)
        name = validate_name(self._trash_info(entry)["name"])
        for f in (entry / "proc").iterdir():
            if f.is_file() and not f.is_symlink() and f.name != PROC_RECORD and not f.name.startswith("."):
                shutil.copy2(f, self.proc_dir(name) / f.name)
        for p in (entry / "checkpoints").iterdir():
            os.rename(p, self.checkpoints_root / p.name)
        for folder in move:
            if (entry / "proc" / folder).exists():
                shutil.rmtree(self.proc_dir(name) / folder, ignore_errors=True)
                os.rename(entry / "proc" / folder, self.proc_dir(name) / folder)
        self._remove_dir(entry)

    # -- trash --------------------------------------------------------------------------
    def _running_pid(self, name: str) -> int | None:
        rec = read_record(self.procs_root / name)
        return rec["pid"] if rec.get("state") == "running" and is_alive(rec.get("pid")) else None

    def trash(self, name: str, reason: str, details: dict[str, Any] | None = None) -> str:
        """Put every checkpoint of ``name`` and its process directory aside under ``trash/ID``;
        return the trash id. Nothing is deleted: :meth:`untrash` brings it back to the same paths
        (CRIU reopens the process's files by path), :meth:`purge_trash` deletes it later."""
        validate_name(name)
        pid = self._running_pid(name)
        if pid:
            raise StateError(f"{name!r} is running as PID {pid}; only a stopped or suspended process goes to the trash.",
                             f"Checkpoint it ('gpucr checkpoint {name}') or stop it first.")
        ckpts, proc = self._checkpoint_dirs(name), self.procs_root / name
        if not ckpts and not proc.is_dir():
            raise NotFoundError(f"Nothing named {name!r} in {self.root}.", "Run 'gpucr ls' to see the names.")
        tid = new_id(name)
        entry = make_private_dir(self.trash_root / tid)
        write_json_atomic(entry / TRASH_INFO, {**(details or {}), "id": tid, "name": name, "trashed_at": time.time(),
                                               "reason": reason, "checkpoints": sorted(p.name for p in ckpts)})
        make_private_dir(entry / "checkpoints")
        for p in ckpts:  # each move is atomic; an interrupted trash leaves the rest where it was
            os.rename(p, entry / "checkpoints" / p.name)
        if proc.is_dir():
            os.rename(proc, entry / "proc")
        # Checkpoints are made private; the process's own files keep their modes (CRIU checks them
        # at restore) and stay private through their 0700 directories.
        tighten_permissions(entry / "checkpoints")
        fsync_path(entry)
        return tid

    def _trash_entry(self, tid: str) -> Path:
        entry = self.trash_root / validate_name(tid, "trash id")
        if not entry.is_dir():
            raise NotFoundError(f"No trash entry {tid!r} in {self.root}.", "Run 'gpucr trash ls' to list them.")
        return entry

    def _trash_info(self, entry: Path) -> dict[str, Any]:
        info = read_json(entry / TRASH_INFO) or {}
        return {"id": entry.name, "name": info.get("name") or name_of_id(entry.name),
                "trashed_at": info.get("trashed_at") or entry.stat().st_mtime, "reason": info.get("reason", "unknown"),
                "notebook_path": info.get("notebook_path")}

    def list_trash(self, max_age_s: float | None = None) -> list[dict[str, Any]]:
        """What is in the trash, oldest first, with the kernel it was (from its newest checkpoint)
        and when :meth:`purge_trash` with ``max_age_s`` will delete it."""
        items = []
        for entry in self.trash_root.iterdir():
            if entry.name.startswith(".") or not entry.is_dir():
                continue
            info = self._trash_info(entry)
            manifests = sorted((m for m in (read_json(p / MANIFEST) for p in (entry / "checkpoints").glob("*")) if m),
                               key=lambda m: m.get("created", 0))
            latest = manifests[-1] if manifests else {}
            kernel = latest.get("kernel") or {}
            items.append({
                **info, "size": dir_size(entry), "engine": latest.get("engine"),
                "checkpoints": [m.get("id") for m in manifests], "latest_created": latest.get("created"),
                "kernel_id": kernel.get("kernel_id"), "kernel_name": kernel.get("kernel_name"),
                "notebook_path": info["notebook_path"] or kernel.get("notebook_path"), "path": str(entry),
                "kind": "gpu" if latest.get("gpu", {}).get("used") else "cpu",
                "expires_at": info["trashed_at"] + max_age_s if max_age_s is not None else None,
            })
        return sorted(items, key=lambda it: it["trashed_at"])

    def untrash(self, tid: str) -> str:
        """Move a trash entry back where it came from; return its name. Refused while a process of
        that name exists, since both would need the same paths."""
        entry = self._trash_entry(tid)
        name = validate_name(self._trash_info(entry)["name"])
        proc = self.procs_root / name
        pid = self._running_pid(name)
        if pid:
            raise StateError(f"A process named {name!r} runs now (PID {pid}); the trashed one needs the same name and paths.",
                             "Shut that kernel down (or 'gpucr checkpoint' / 'gpucr rm' it) first, then restore from the trash again.")
        if proc.exists():
            raise StateError(f"{name!r} is in use: {proc} exists.",
                             f"Shut that kernel down or remove it ('gpucr rm {name}') first, then restore from the trash again.")
        back = [p for p in (entry / "checkpoints").glob("*") if p.is_dir()]
        clash = [p.name for p in back if (self.checkpoints_root / p.name).exists()]
        if clash:
            raise StateError(f"Checkpoint {clash[0]} exists in the store already.", f"Remove it ('gpucr rm {clash[0]}') first.")
        for p in back:
            os.rename(p, self.checkpoints_root / p.name)
        if (entry / "proc").is_dir():
            os.rename(entry / "proc", proc)
        else:
            self._write_record_for_checkpoints(name)
        self._remove_dir(entry)
        return name

    def _write_record_for_checkpoints(self, name: str) -> None:
        """A record for checkpoints that came back without one (so they are listed and restorable)."""
        latest = self.latest(name)
        m = latest.manifest if latest else {}
        self.write_proc(name, {"name": name, "state": "checkpointed", "pid": None, "checkpoint": latest.id if latest else None,
                               "command": m.get("command"), "cwd": m.get("cwd"), "engine": m.get("engine"),
                               "created": m.get("created"), "uid": os.getuid()})

    def delete_trash(self, tid: str) -> None:
        entry = self._trash_entry(tid)
        for images in (entry / "checkpoints").glob("*/images"):
            drop_network_lock(images)
        self._remove_dir(entry)

    def purge_trash(self, max_age_s: float) -> list[str]:
        """Delete trash entries older than ``max_age_s``; return their ids."""
        cutoff = time.time() - max_age_s
        doomed = [it["id"] for it in self.list_trash() if it["trashed_at"] < cutoff]
        for tid in doomed:
            self.delete_trash(tid)
        return doomed

    # -- garbage ------------------------------------------------------------------------
    def remove_leftover_deletions(self) -> list[str]:
        """Finish deletions that were interrupted (``.del-*``), and remove what interrupted
        rewrites of checkpoints left (``chain.py``)."""
        done = chain.remove_unfinished(self.checkpoints_root)
        for root in (self.checkpoints_root, self.trash_root):
            for p in root.glob(".del-*"):
                shutil.rmtree(p, ignore_errors=True)
                done.append(p.name)
        return done

    def collect_garbage(self, live_names: set[str] | None = None) -> list[str]:
        """Remove what nothing can use: interrupted deletions, temporary directories no recovery
        can complete (run recovery first), and move checkpoints without a process record (and
        not in ``live_names``) to the trash, where they stay restorable until purged.
        Only while nothing else works on the store. Returns what was removed or moved."""
        done = self.remove_leftover_deletions()
        for tmp in self.tmp_dirs():
            if not self.completable(tmp) and not at_work_in([tmp]):
                shutil.rmtree(tmp, ignore_errors=True)
                done.append(tmp.name)
        keep = set(self.proc_names()) | (live_names or set())
        orphans = {name_of_id(p.name) for p in self._checkpoint_dirs()} - keep - {None}
        for name in sorted(n for n in orphans if n):
            done.append(self.trash(name, "orphaned: its process record was gone"))
        return done

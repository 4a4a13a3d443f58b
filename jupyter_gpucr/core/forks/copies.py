"""Fork a process: copies that start from its memory, GPU memory and files included, and go their own way.

The source is checkpointed and left running (paused only while its dump takes: CRIU's
``--leave-running``), or, when it is on disk already, its latest checkpoint is used and it stays
there; a caller that took the checkpoint itself names it (the server moves a kernel's GPU
tensors out first: ``server/fork_source.py``). Each copy is restored from those images under a
name of its own, in namespaces of its own: PIDs (as every gpucr process), mount, and network.
What each copy gets:

- **Memory, GPU memory, threads, files opened for reading**: as the source had them (RNG states
  too: forks draw the same numbers until reseeded, ``gpucr_hooks.reseed``).
- **Files the source had open for writing**: a copy of its own, made when the fork is made
  (its logs beside its record, other files in ``files/`` of its folder; the record's ``files``
  lists them). Two processes appending to one file would interleave, and CRIU refuses to
  restore a file that changed size under it.
- **Listening TCP ports** (bound to every address or to loopback): the same ports, inside its own
  network namespace, reached from the host through new ports (``process/relay.py``; the record's
  ``netns.relay``). Ports bound to another address cannot be restored there: the fork fails.
- **Established TCP connections**: between processes of the source's tree they come back
  connected to each other; to anything outside the tree (no such peer exists in the fork's
  namespace) they are closed at the restore (``process/forknet.py``): the fork's next read or write on one
  fails at once, as after a crash of the peer. The peer never sees the fork; the source keeps its
  connection.
- **UNIX sockets** bound to a path are not restored in a copy (the source holds the name): the
  fork fails, saying so. Abstract names live in the network namespace: the fork has its own.

The copies are restored in parallel. Restored side by side they would each see the same free GPU
memory, so where each goes is planned first, each fork with the memory of the ones before it
taken (:func:`gpu_targets`): N forks share a GPU only when all of them fit, and when the GPUs
cannot hold them all the fork fails before any copy is made. A source on several GPUs cannot be
pinned to one: its copies are restored one after another, each placed beside the ones before it.
"""
from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import stat
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, cast

from ..criu.images import _FE_REG, _FE_TYPE, _REG_FLAGS, _REG_NAME, FD_REG, Image, RegFile, decode, entries, read_image
from ..errors import GPUCRError, PreconditionError, StateError
from ..files import make_private_dir, private_files
from ..gpu import gpus
from ..process.procs import is_alive
from ..process.record import ProcRecord
from ..process.running import Running
from ..storage.store import Checkpoint, Store, is_save_point
from . import netns


class Copier(Protocol):
    """What a fork needs of the checkpointer that makes it (:class:`~jupyter_gpucr.core.checkpointer.Checkpointer`,
    which calls this module: it is not imported here)."""

    @property
    def store(self) -> Store: ...

    def checkpoint(self, target: str, leave_running: bool = False, reason: str = "manual") -> Checkpoint: ...

    def restore(self, name: str, *, gpu: str | int | None = "auto", checkpoint_id: str | None = None,
                detach: bool = True, gpu_bytes_beside: Mapping[str, int] | None = None,
                files: Mapping[str, str] | None = None) -> Running: ...

    def remove(self, target: str, kill: bool = False) -> list[str]: ...


# Regular files there are the kernel's views, not data (/dev/shm holds data: a store or a log there is copied).
_NOT_FILES = ("/proc/", "/sys/")
#: Under a source's folder: the copies of its written files kept at a fork's checkpoint, by checkpoint id.
KEPT_FILES = "fork-files"
_REG_POS = 3  # regfile.proto: the file position
#: CRIU's log of a copy whose restore failed, beside the source (the copy's own folder is removed).
FAILED_LOG = "fork-failed.log"


def fork_names(source: str, count: int, names: Sequence[str] | None) -> list[str]:
    """The forks' names: ``names`` as given, else NAME-fork-1 ... NAME-fork-COUNT."""
    if names:
        return list(names)
    if count < 1:
        raise StateError(f"Cannot make {count} forks.", "Ask for one or more.")
    return [f"{source}-fork-{i}" for i in range(1, count + 1)]


def fork(cp: Copier, name: str, count: int = 1, names: Sequence[str] | None = None,
         gpu: str | int | None = "auto", detach: bool = True, beside: Mapping[str, int] | None = None,
         checkpoint_id: str | None = None) -> list[Running]:
    """See the module docstring. All forks are made or none: a failure stops those already made
    and removes their records; the source is as it was either way. ``beside``: GPU memory (by
    GPU UUID) each copy takes back itself after its restore (a kernel's offloaded tensors).
    ``checkpoint_id``: the source's checkpoint to fork from, instead of a new one or its latest."""
    beside = beside or {}
    wanted = fork_names(name, count, names)
    for new in wanted:
        if cp.store.has_proc(new):
            raise StateError(f"{new!r} exists already.", "Pick another name, or remove it ('gpucr rm').")
    if len(set(wanted)) != len(wanted) or name in wanted:
        raise StateError("Each fork needs a name of its own.", "Pick different names.")
    rec = cp.store.read_proc(name)
    ckpt = cp.store.get(checkpoint_id) if checkpoint_id else _source_checkpoint(cp, name, rec)
    image = read_image(ckpt.images)
    routes = netns.listening(image)
    used = [{**u, "memory_used": u["memory_used"] + beside.get(u["uuid"], 0)}
            for u in ckpt.manifest.get("gpu", {}).get("used", [])]
    targets = gpu_targets(used, ckpt.manifest.get("gpu", {}).get("all", []), gpu, gpus.list_gpus(), len(wanted)) \
        if len(used) == 1 else [gpu] * len(wanted)
    outcomes: list[Running | BaseException] = []
    try:
        with ThreadPoolExecutor(len(wanted) if len(used) <= 1 else 1, thread_name_prefix="gpucr-fork") as pool:
            futures = [pool.submit(_make, cp, name, rec, ckpt, image, routes, new, target, detach, beside)
                       for new, target in zip(wanted, targets)]
            for f in futures:
                try:
                    outcomes.append(f.result())
                except BaseException as e:  # noqa: BLE001 - every fork is waited for before any is undone
                    outcomes.append(e)
    finally:
        if not is_save_point(ckpt):  # a save point's copies stay, for the next fork or going back to it
            shutil.rmtree(_kept_dir(cp.store.proc_dir(name), ckpt.id), ignore_errors=True)
    failed = [(new, o) for new, o in zip(wanted, outcomes) if isinstance(o, BaseException)]
    if failed:
        error = _said_of_the_fork(cp, name, *failed[0])
        for new in wanted:
            _undo(cp, new)
        raise error
    return cast("list[Running]", outcomes)


def gpu_targets(used: list[dict], all_old: list[str], spec: str | int | None, available: list[gpus.Gpu],
                count: int) -> list[str | int | None]:
    """The GPU (its UUID) each of ``count`` copies of a process on one GPU (``used``) goes to:
    each placed as a restore would place it (``gpus.plan_placement``), on the GPUs as they will be
    once the copies before it are there. Raises, before anything is restored, when they do not all fit."""
    left = [gpus.Gpu(g.index, g.uuid, g.name, g.memory_total, g.memory_used, g.memory_free) for g in available]
    targets: list[str | int | None] = []
    for i in range(count):
        try:
            uuid = gpus.plan_placement(used, all_old, spec, left)[used[0]["uuid"]]
        except PreconditionError as e:
            if i:
                e.message = f"Only {i} of the {count} forks fit on the GPUs. The next: {e.message}"
            raise
        target = next(g for g in left if g.uuid == uuid)
        target.memory_free -= int(used[0]["memory_used"])
        targets.append(uuid)
    return targets


def _source_checkpoint(cp: Copier, name: str, rec: ProcRecord) -> Checkpoint:
    """A checkpoint of the running source that leaves it running, or the one it is suspended in."""
    if rec.get("state") == "running" and is_alive(rec.get("pid")):
        made = cp.checkpoint(name, leave_running=True, reason="fork")
        keep_written_files(made.id, cp.store.proc_dir(name), read_image(made.images).files)
        return made
    ckpt = cp.store.latest(name)
    if ckpt is None:
        raise StateError(f"{name!r} is neither running nor checkpointed: there is nothing to fork.",
                         f"Start it again ('gpucr run --name {name} -- CMD').")
    return ckpt


def _make(cp: Copier, source: str, rec: ProcRecord, ckpt: Checkpoint, image: Image,
          routes: list[netns.Route], new: str, gpu: str | int | None, detach: bool, beside: Mapping[str, int]) -> Running:
    d = cp.store.proc_dir(new)
    files = _copy_written_files(image, cp.store.proc_dir(source), d, _kept_dir(cp.store.proc_dir(source), ckpt.id))
    record: ProcRecord = {
        "name": new, "command": rec.get("command"), "cwd": rec.get("cwd"), "created": time.time(),
        "state": "checkpointed", "pid": None, "ns_pid": rec.get("ns_pid"), "checkpoint": None,
        "uid": os.getuid(), "user": getpass.getuser(), "forked_from": {"name": source, "checkpoint": ckpt.id},
        "netns": netns.record_of(netns.free_ports(routes)), "files": files,
    }
    cp.store.write_proc(new, record)
    return cp.restore(new, gpu=gpu, checkpoint_id=ckpt.id, detach=detach, files=files, gpu_bytes_beside=beside)


def keep_written_files(cid: str, source_dir: Path, files: Iterable[RegFile]) -> None:
    """Copies of the files a running source has open for writing (of ``files``, its image's), taken right after its checkpoint
    (the server takes them while it still holds the kernel's messages), for every fork to start
    from: a copy taken later holds what the source wrote since (IPython's history database then
    holds lines that the fork's own history repeats, and IPython says so in the fork's output)."""
    kept = _kept_dir(source_dir, cid)
    shutil.rmtree(kept, ignore_errors=True)
    make_private_dir(kept)
    for path in written_files(files):
        with contextlib.suppress(FileNotFoundError):  # deleted since: CRIU brings the image's own copy back
            private_files(kept, _flat(path))
            shutil.copyfile(path, kept / _flat(path))


def _kept_dir(source_dir: Path, cid: str) -> Path:
    return source_dir / KEPT_FILES / cid


def _flat(path: str) -> str:
    return path.lstrip("/").replace("/", "%")


def written_files(files: Iterable[RegFile]) -> list[str]:
    """The regular files of an image's ``files`` open (or mapped) for writing, each once."""
    paths: list[str] = []
    for f in files:
        path = f.path if f.path.startswith("/") else f"/{f.path}"
        if (f.access & os.W_OK) and stat.S_ISREG(f.mode) and not path.startswith(_NOT_FILES) and path not in paths:
            paths.append(path)
    return paths


def _copy_written_files(image: Image, source_dir: Path, fork_dir: Path, kept: Path) -> dict[str, str]:
    """A copy, for the fork, of each regular file the image has open (or mapped) for writing:
    the source's files in the store (its logs, a kernel's history) beside the fork's record,
    any other in the fork's ``files/``. From the copies kept at the checkpoint where there are
    some (a running source), else as the files are now (the source is not running)."""
    copies: dict[str, str] = {}
    for path in written_files(image.files):
        src = Path(path)
        origin = kept / _flat(path) if (kept / _flat(path)).exists() else src
        if src.parent == source_dir:
            dst = fork_dir / src.name
        else:
            make_private_dir(fork_dir / "files")
            dst = fork_dir / "files" / _flat(path)
        private_files(dst.parent, dst.name)
        try:
            shutil.copyfile(origin, dst)
            shutil.copymode(src if src.exists() else origin, dst)
        except FileNotFoundError:  # deleted since: CRIU brings the image's own copy back (a ghost file)
            dst.unlink(missing_ok=True)
            continue
        copies[path] = str(dst)
    return copies


def inherit_args(images: Path, files: dict[str, str], first_fd: int) -> tuple[list[str], list[str]]:
    """What hands a fork its copies of ``files`` (path in the image -> copy): CRIU's
    ``--inherit-fd`` options, and the holder's ``--inherit-file`` (the copy opened, on the
    descriptor CRIU is told, as the image had the original open: CRIU takes that descriptor as it
    is)."""
    opened: dict[str, tuple[int, int]] = {}
    for e in entries(images / "files.img") if files else ():
        if e.get(_FE_TYPE) == [FD_REG] and _FE_REG in e:
            r = decode(e[_FE_REG][0])
            path = bytes(r.get(_REG_NAME, [b""])[0]).decode(errors="surrogateescape")
            opened.setdefault(path, (int(r.get(_REG_FLAGS, [0])[0]), int(r.get(_REG_POS, [0])[0])))
    criu, holder = [], []
    for i, (orig, copy) in enumerate(files.items()):
        flags, pos = opened.get(orig, (os.O_RDWR, 0))
        fd = first_fd + i
        # CRIU's name for it drops the first character: a path's '/', an external file's 'f'
        # ("file[MNT:INODE]"), whose descriptor CRIU would otherwise reopen by its /proc link
        criu.append(f"--inherit-fd=fd[{fd}]:{orig[1:]}")
        holder.append(f"--inherit-file={fd}:{flags & (os.O_ACCMODE | os.O_APPEND)}:{pos}:{copy}")
    return criu, holder


def _said_of_the_fork(cp: Copier, source: str, new: str, error: BaseException) -> BaseException:
    """A copy's failed restore, said of the fork: the copy's folder goes, so CRIU's log of it is
    kept beside the source (``fork-failed.log``)."""
    if not isinstance(error, GPUCRError):
        return error
    log = cp.store.proc_dir(new) / "restore" / "restore.log"
    if log.is_file():
        kept = cp.store.proc_dir(source) / FAILED_LOG
        shutil.copyfile(log, kept)
        error.hint = error.hint.replace(str(log), str(kept))
    error.message = f"A copy of {source!r} could not be made: {error.message}"
    error.hint = error.hint.replace(" The checkpoint is kept; you can retry.", "") + \
        f" No copy was made; {source!r} is as it was."
    return error


def _undo(cp: Copier, new: str) -> None:
    """Stop and forget a fork this call made."""
    if not cp.store.has_proc(new):
        return
    try:
        cp.remove(new, kill=True)
    except GPUCRError:
        cp.store.remove_proc(new)

"""The regular files a process holds open, for a restore on another node.

CRIU reopens each of them by its path and refuses one whose size or mode changed. On another
node, files in scratch places (``/tmp``, ``/var/tmp``, ``/dev/shm``, the working directory when it
is not on shared storage) are not there: a checkpoint made for object storage keeps a copy of
each (``files/`` in its folder, by path), and a restore on another node puts them back before
CRIU runs. Every other file (the user's home, the software) must be there as it was: the restore
checks CRIU's conditions first and refuses naming what differs, the checkpoint kept.

Files below the process's own folder are not recorded: the restore hands their copies over at
the new folder (``objectstore.transfer.relocated_files``).
"""
from __future__ import annotations

import contextlib
import filecmp
import os
import shutil
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..criu.images import read_image
from ..criu.nodecompat import boot_id
from ..errors import IncompatibleCheckpointError, PreconditionError
from ..files import make_private_dir
from ..sizes import human
from .store import Checkpoint

#: The checkpoint's folder of scratch files' copies, each at its path below it.
FILES = "files"
#: Places no other node has: what a process holds open there travels with its checkpoint.
SCRATCH_ROOTS = ("/tmp", "/var/tmp", "/dev/shm")
DEFAULT_MAX_BYTES = 2 << 30
_KERNEL_VIEWS = ("/proc/", "/sys/")  # regular files there are the kernel's views, not data


def _below(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


@dataclass(frozen=True)
class OpenFiles:
    """What travels: ``shared`` are the folders that are the same on every node (the user's
    home); ``max_bytes`` the most a checkpoint copies of scratch files."""

    shared: tuple[str, ...] = field(default_factory=lambda: (str(Path.home()),))
    max_bytes: int = DEFAULT_MAX_BYTES

    def is_scratch(self, path: str, cwd: str | None) -> bool:
        """A file no other node has: in a scratch place, or in a working directory (other than
        ``/``) that is not on shared storage; never one on shared storage."""
        if _below(path, self.shared):
            return False
        if _below(path, SCRATCH_ROOTS):
            return True
        return bool(cwd) and cwd != "/" and not _below(str(cwd), self.shared) and _below(path, (str(cwd),))

    def check_size(self, pids: Iterable[int], cwd: str | None) -> None:
        """Before the dump (nothing touched yet): refuse when the scratch files the running tree
        holds open or maps add up to more than ``max_bytes``."""
        sizes = {p: n for p, n in _open_now(pids).items() if self.is_scratch(p, cwd)}
        total = sum(sizes.values())
        if total <= self.max_bytes:
            return
        biggest = sorted(sizes, key=lambda p: -sizes[p])
        named = ", ".join(f"{p} ({_amount(sizes[p])})" for p in biggest[:5])
        raise PreconditionError(
            f"The process holds {_amount(total)} of files open in scratch places ({named}), more than a checkpoint "
            f"copies for another node ({_amount(self.max_bytes)}). The process was left running.",
            "Close those files or keep them on shared storage (c.GPUCR.shared_paths), or raise "
            "c.GPUCR.max_scratch_bytes.")


def _amount(n: int) -> str:
    return human(n) if n >= 1 << 20 else f"{n} bytes"


def _open_now(pids: Iterable[int]) -> dict[str, int]:
    """The regular files the running processes hold open or map, with their sizes."""
    paths: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):  # gone meanwhile
            fds = f"/proc/{pid}/fd"
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    paths.add(os.readlink(f"{fds}/{fd}"))
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                fields = line.split(None, 5)
                if len(fields) == 6:
                    paths.add(fields[5])
    paths = {p for p in paths if p.startswith("/")}  # not "socket:[...]", "[heap]"
    sizes = {}
    for path in paths:
        with contextlib.suppress(OSError):  # deleted ("... (deleted)") meanwhile or since
            st = os.stat(path)
            if stat.S_ISREG(st.st_mode):
                sizes[path] = st.st_size
    return sizes


def record(images: Path, folder: Path, policy: OpenFiles, cwd: str | None, own_dir: Path, node: str) -> dict[str, Any]:
    """After the dump, the tree still stopped: each regular file the image reopens by path
    (outside ``own_dir``) with what CRIU will require of it, and whether it is scratch; a copy of
    each scratch file goes to ``folder/files/PATH``. The manifest's ``open_files`` (``node``: who made it)."""
    image = read_image(images)
    remapped = {r.file.id for r in image.remaps if r.file is not None}  # CRIU carries deleted files itself
    found: dict[str, dict[str, Any]] = {}
    for f in image.files:
        path = f.path if f.path.startswith("/") else f"/{f.path}"
        if f.id in remapped or not stat.S_ISREG(f.mode) or path.startswith(_KERNEL_VIEWS) or _below(path, (str(own_dir),)):
            continue
        if path in found:
            if f.size is not None:
                found[path].update(size=f.size, size_checked=True)
            continue
        try:
            st = os.stat(path)
        except FileNotFoundError:  # deleted after the dump: CRIU says so at any restore
            continue
        entry = {"path": path, "mode": f.mode, "size": st.st_size if f.size is None else f.size,
                 "size_checked": f.size is not None, "mtime_ns": st.st_mtime_ns, "scratch": policy.is_scratch(path, cwd)}
        if entry["scratch"]:
            entry["owner"] = [st.st_uid, st.st_gid]
            copy = folder / FILES / path.lstrip("/")
            make_private_dir(copy.parent)
            shutil.copyfile(path, copy)
            os.chmod(copy, 0o600)
        found[path] = entry
    return {"node": node, "files": list(found.values())}


def prepare(ckpt: Checkpoint, node: str) -> None:
    """Before CRIU restores ``ckpt`` on a node other than the one that made it (or after its
    reboot): refuse, naming each, when a file it reopens is missing or not as CRIU requires, or
    when a scratch file's path holds another file; otherwise put the scratch files back. Nothing
    is written when it refuses. A restore where the checkpoint was made does nothing here."""
    made = ckpt.manifest.get("open_files")
    if not made or (made.get("node") == node and (ckpt.manifest.get("host") or {}).get("boot_id") == boot_id()):
        return
    missing: list[dict[str, Any]] = []
    problems: list[str] = []
    for entry in made["files"]:
        try:
            st: os.stat_result | None = os.stat(entry["path"])
        except FileNotFoundError:
            st = None
        if entry["scratch"]:
            if st is None:
                missing.append(entry)
            elif not _same(st, entry) and not _same_content(st, entry, ckpt.path / FILES / entry["path"].lstrip("/")):
                problems.append(f"{entry['path']} on this node is another file than the process's ({_said(st, entry)})")
        elif st is None:
            problems.append(f"{entry['path']} is missing on this node")
        elif entry["size_checked"] and st.st_size != entry["size"]:
            problems.append(f"{entry['path']} changed: {entry['size']} bytes at checkpoint, {st.st_size} now")
        elif st.st_mode != entry["mode"]:
            problems.append(f"{entry['path']} changed: mode {stat.filemode(entry['mode'])} at checkpoint, "
                            f"{stat.filemode(st.st_mode)} now")
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise IncompatibleCheckpointError(
            f"Checkpoint {ckpt.id} cannot be restored on this node: the process holds files open that are not as it "
            f"left them: {shown}.",
            "CRIU reopens them by path. Put them back as they were (the user's home must be on storage every node "
            "mounts at the same path, listed in c.GPUCR.shared_paths), or move away a file that is not the process's, "
            "then restore again. The checkpoint is kept; the kernel stays suspended.")
    for entry in missing:
        try:
            _put_back(ckpt.path / FILES / entry["path"].lstrip("/"), entry)
        except OSError as e:
            raise IncompatibleCheckpointError(
                f"The process's file {entry['path']} could not be put back on this node: {e.strerror}.",
                "Make its folder writable for the user, or move away a file that appeared at that path, then restore "
                "again. The checkpoint is kept; the kernel stays suspended.") from e


def _same(st: os.stat_result, entry: dict[str, Any]) -> bool:
    """The file put back before (by an earlier try of this restore), or never gone."""
    return (st.st_size, st.st_mtime_ns, st.st_mode) == (entry["size"], entry["mtime_ns"], entry["mode"])


def _same_content(st: os.stat_result, entry: dict[str, Any], copy: Path) -> bool:
    """The same bytes at the path, written at another time: the same software or data installed
    on this node too (a virtualenv in the working directory), which CRIU takes as it is."""
    return (st.st_size, st.st_mode) == (entry["size"], entry["mode"]) and copy.is_file() and \
        filecmp.cmp(copy, entry["path"], shallow=False)


def _said(st: os.stat_result, entry: dict[str, Any]) -> str:
    return (f"{entry['size']} bytes, {stat.filemode(entry['mode'])} at checkpoint; {st.st_size} bytes, "
            f"{stat.filemode(st.st_mode)} here{', modified at another time' if st.st_mtime_ns != entry['mtime_ns'] else ''}")


def _put_back(copy: Path, entry: dict[str, Any]) -> None:
    """The file at its path as it was at the checkpoint (mode, owner, modification time), made
    beside it and linked into place: never over a file that appeared meanwhile. Missing folders
    are made private to the file's owner."""
    target = Path(entry["path"])
    uid, gid = entry.get("owner", (os.getuid(), os.getgid()))
    made = [p for p in reversed(target.parents) if not p.exists()]
    for d in made:
        d.mkdir(mode=0o700, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(d, uid, gid)
    tmp = target.with_name(f".{target.name}.gpucr-{os.getpid()}")
    shutil.copyfile(copy, tmp)
    try:
        if os.geteuid() == 0:
            os.chown(tmp, uid, gid)
        os.chmod(tmp, stat.S_IMODE(entry["mode"]))
        os.utime(tmp, ns=(entry["mtime_ns"], entry["mtime_ns"]))
        os.link(tmp, target)
    finally:
        tmp.unlink()

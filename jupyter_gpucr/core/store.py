"""The checkpoint store: one private directory per process and per checkpoint.

Layout (every directory 0700, every file 0600, since images hold the whole memory of a
process, tokens and data included)::

    ROOT/procs/NAME/            run.json (command, pids, state), stdout.log, stderr.log
    ROOT/checkpoints/ID/        manifest.json, images/ (engine payload), dump.log
    ROOT/checkpoints/.tmp-ID/   a checkpoint being written; renamed to ID when complete

A checkpoint directory without ``manifest.json`` is never listed: the rename after the
manifest is written is what makes a checkpoint exist.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .checksums import find_mismatches
from .errors import CheckpointDamagedError, NotFoundError
from .names import validate_name

MANIFEST = "manifest.json"
FORMAT_VERSION = 1


def default_root() -> Path:
    env = os.environ.get("GPUCR_STORE")
    if env:
        return Path(env)
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(data) / "jupyter-gpucr"


def make_private_dir(path: Path) -> Path:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old or the new file, never half of one."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def tighten_permissions(root: Path) -> None:
    """Make everything below ``root`` private (CRIU and loggers create files with their own modes)."""
    os.chmod(root, 0o700)
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            os.chmod(os.path.join(dirpath, d), 0o700)
        for f in filenames:
            p = os.path.join(dirpath, f)
            if not os.path.islink(p):
                os.chmod(p, 0o600)


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint on disk and its manifest."""

    id: str
    path: Path
    manifest: dict[str, Any]

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

    def verify(self, payload: str) -> None:
        """Refuse a damaged checkpoint before anything is restored from it; it stays on disk."""
        problems = find_mismatches(self.path / payload, self.manifest["files"])
        if problems:
            raise CheckpointDamagedError(
                f"Checkpoint {self.id} is damaged: {'; '.join(problems[:5])}.",
                f"It was kept at {self.path} for inspection. Restore an older checkpoint or start fresh.")

    def summary(self) -> dict[str, Any]:
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

    def proc_dir(self, name: str) -> Path:
        return make_private_dir(self.procs_root / validate_name(name))

    def free_bytes(self) -> int:
        return shutil.disk_usage(make_private_dir(self.root)).free

    # -- processes ----------------------------------------------------------------------
    def read_proc(self, name: str) -> dict[str, Any]:
        path = self.procs_root / validate_name(name) / "run.json"
        try:
            return json.loads(path.read_text())
        except FileNotFoundError:
            raise NotFoundError(
                f"No process or checkpoint named {name!r} in {self.root}.",
                "Run 'gpucr ls' to see the names, or start one with 'gpucr run --name NAME -- CMD'.",
            ) from None

    def write_proc(self, name: str, record: dict[str, Any]) -> None:
        write_json_atomic(self.proc_dir(name) / "run.json", record)

    def proc_names(self) -> list[str]:
        return sorted(p.name for p in self.procs_root.iterdir() if (p / "run.json").is_file())

    def remove_proc(self, name: str) -> None:
        shutil.rmtree(self.procs_root / validate_name(name), ignore_errors=True)

    # -- checkpoints --------------------------------------------------------------------
    def new_checkpoint_dir(self, name: str) -> tuple[str, Path]:
        """Reserve a checkpoint id and its temporary directory."""
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        cid = f"{validate_name(name)}-{stamp}-{secrets.token_hex(3)}"
        tmp = self.checkpoints_root / f".tmp-{cid}"
        make_private_dir(tmp)
        make_private_dir(tmp / "images")
        return cid, tmp

    def commit_checkpoint(self, cid: str, tmp: Path, manifest: dict[str, Any]) -> Checkpoint:
        """Write the manifest, make everything private, and rename into place."""
        manifest = {**manifest, "format_version": FORMAT_VERSION, "id": cid}
        write_json_atomic(tmp / MANIFEST, manifest)
        tighten_permissions(tmp)
        final = self.checkpoints_root / cid
        os.rename(tmp, final)
        fd = os.open(self.checkpoints_root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return Checkpoint(cid, final, manifest)

    def discard(self, path: Path) -> None:
        shutil.rmtree(path, ignore_errors=True)

    def _iter_checkpoints(self) -> Iterator[Checkpoint]:
        for p in self.checkpoints_root.iterdir():
            if p.name.startswith(".") or not (p / MANIFEST).is_file():
                continue
            try:
                manifest = json.loads((p / MANIFEST).read_text())
            except (OSError, ValueError):
                continue
            yield Checkpoint(p.name, p, manifest)

    def list_checkpoints(self, name: str | None = None) -> list[Checkpoint]:
        """Complete checkpoints, oldest first."""
        items = [c for c in self._iter_checkpoints() if name is None or c.name == name]
        return sorted(items, key=lambda c: (c.created, c.id))

    def latest(self, name: str) -> Checkpoint | None:
        items = self.list_checkpoints(name)
        return items[-1] if items else None

    def get(self, cid: str) -> Checkpoint:
        path = self.checkpoints_root / validate_name(cid, "checkpoint id")
        try:
            manifest = json.loads((path / MANIFEST).read_text())
        except FileNotFoundError:
            raise NotFoundError(f"No checkpoint {cid!r} in {self.root}.", "Run 'gpucr ls' to list them.") from None
        return Checkpoint(cid, path, manifest)

    def delete(self, cid: str) -> None:
        ckpt = self.get(cid)
        # Rename first so a half-deleted checkpoint is never listed as complete.
        trash = ckpt.path.with_name(f".del-{cid}")
        os.rename(ckpt.path, trash)
        shutil.rmtree(trash, ignore_errors=True)

    def apply_retention(self, name: str, keep_last: int, max_bytes: int | None = None) -> list[str]:
        """Delete older checkpoints of ``name`` beyond ``keep_last``, then oldest ones store-wide
        while the store exceeds ``max_bytes``; the newest checkpoint of each name is always kept."""
        deleted = []
        for ckpt in self.list_checkpoints(name)[: -max(keep_last, 1)]:
            self.delete(ckpt.id)
            deleted.append(ckpt.id)
        if max_bytes is not None:
            items = self.list_checkpoints()
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

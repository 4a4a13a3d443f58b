"""Checkpoints whose images take pages from another checkpoint's (its ``parent``): a save point
dumped incrementally (CRIU's memory tracking), or one rewritten to take its unchanged pages from
a newer one (:func:`share_pages`, where the kernel tracks no dirty pages). The manifest names the
parent and the images hold CRIU's ``parent`` link (``../../PARENT/images``, the same from any
folder of checkpoints); the checksums of a checkpoint cover its own files, its verification its
parents' too (``Checkpoint.verify``).

A parent never goes while a checkpoint takes pages from it: before it is deleted, or put in the
trash alone, the checkpoints taking its pages copy them in (:func:`release`, :func:`standalone`).
Every rewrite builds the new version of the checkpoint beside it (``.new-ID``: hard links to
its unchanged files, the rewritten page images, the manifest) and exchanges the two directories
in one step, so a listed checkpoint is complete at every moment, a crash included; what is left
of an interrupted rewrite is removed with the store's other leftovers.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..criu import pagemaps
from ..errors import CheckpointDamagedError
from ..files import exchange, fsync_path, fsync_tree, make_private_dir
from .checksums import digest_files


class Checkpoint(Protocol):
    """What this module reads of a checkpoint (``store.Checkpoint``, which imports this module)."""

    @property
    def id(self) -> str: ...

    @property
    def path(self) -> Path: ...

    @property
    def images(self) -> Path: ...

    @property
    def size(self) -> int: ...

    @property
    def manifest(self) -> Mapping[str, Any]: ...

    def ancestors(self) -> Sequence[Checkpoint]: ...


class Store(Protocol):
    """What this module uses of the store (``store.Store``)."""

    def get(self, cid: str) -> Checkpoint: ...

    def list_checkpoints(self, name: str | None = None) -> Sequence[Checkpoint]: ...

    def write_manifest(self, path: Path, manifest: Any) -> None: ...

#: Beside a checkpoint, the new version being built (see the module docstring).
REWRITE_PREFIX = ".new-"

#: Builds rewritten page images: (the checkpoint's images, the folder to write into) -> the names written.
Build = Callable[[Path, Path], list[str]]


def parent_link(parent_id: str) -> str:
    """CRIU's ``parent`` link of a checkpoint's images to those of ``parent_id`` in the same folder."""
    return f"../../{parent_id}/images"


def children(store: Store, cid: str) -> list[Checkpoint]:
    """The checkpoints of the store whose images take pages from checkpoint ``cid``."""
    return [c for c in store.list_checkpoints() if c.manifest.get("parent") == cid]


def share_pages(store: Store, cid: str, base_id: str) -> Checkpoint:
    """Rewrite checkpoint ``cid`` (which takes nothing from a parent) to take every lazy page
    equal to ``base_id``'s at its address from ``base_id``, which becomes its parent."""
    ckpt = store.get(cid)
    base = store.get(base_id)
    if ckpt.manifest.get("parent"):
        raise ValueError(f"checkpoint {cid} takes pages from {ckpt.manifest['parent']} already")
    if cid in {base.id, *(a.id for a in base.ancestors())}:
        raise ValueError(f"checkpoint {base_id} takes pages from {cid}: sharing them back would make a loop")
    return _rewrite(store, ckpt, lambda images, out: pagemaps.share(images, base.images, out), base.id)


def release(store: Store, cid: str) -> list[str]:
    """Before checkpoint ``cid`` goes: each checkpoint taking pages from it copies in the pages it
    holds itself and takes the rest from its parent instead. The ids rewritten."""
    done = []
    parent = store.get(cid).manifest.get("parent")
    for child in children(store, cid):
        _rewrite(store, child, lambda images, out: pagemaps.take_in(images, out), parent)
        done.append(child.id)
    return done


def standalone(store: Store, cid: str) -> Checkpoint:
    """Checkpoint ``cid`` rewritten to hold every page it takes from its parents (before it is
    moved where they are not)."""
    ckpt = store.get(cid)
    if not ckpt.manifest.get("parent"):
        return ckpt
    return _rewrite(store, ckpt, lambda images, out: pagemaps.take_in(images, out, all_levels=True), None)


def takers_first(store: Store, ids: list[str]) -> list[str]:
    """``ids`` in an order to delete them in: a checkpoint before those it takes pages from, so
    that none copies in the pages of one that goes too."""
    depth = {c.id: _depth(c) for c in store.list_checkpoints() if c.id in ids}
    return sorted(ids, key=lambda cid: -depth.get(cid, 0))


def _depth(ckpt: Checkpoint) -> int:
    """How many checkpoints ``ckpt`` takes pages from, directly or not (0 where one is gone)."""
    try:
        return len(ckpt.ancestors())
    except CheckpointDamagedError:
        return 0


def _rewrite(store: Store, ckpt: Checkpoint, build: Build, parent: str | None) -> Checkpoint:
    """``ckpt`` with the page images ``build`` writes, taking pages from ``parent`` (see the
    module docstring)."""
    new = ckpt.path.with_name(REWRITE_PREFIX + ckpt.id)
    shutil.rmtree(new, ignore_errors=True)
    try:
        try:
            written = build(ckpt.images, make_private_dir(new / "images"))
        except pagemaps.PagemapError as e:
            raise CheckpointDamagedError(f"Checkpoint {ckpt.id} cannot take in the pages of its parent: {e}.",
                                         f"Nothing was changed; it is kept at {ckpt.path}.") from e
        for dirpath, dirnames, filenames in os.walk(ckpt.path):
            rel = Path(dirpath).relative_to(ckpt.path)
            for d in dirnames:
                if (Path(dirpath) / d).is_symlink():  # CRIU's parent link: made anew below
                    continue
                make_private_dir(new / rel / d)
            for f in filenames:  # the manifest too: replaced below, which leaves the original's file as it is
                if not (rel == Path("images") and f in written):
                    os.link(Path(dirpath) / f, new / rel / f)
        if parent:
            os.symlink(parent_link(parent), new / "images" / pagemaps.PARENT_LINK)
        files = {**ckpt.manifest["files"], **digest_files(new / "images", written)}
        manifest: dict[str, Any] = {k: v for k, v in ckpt.manifest.items() if k != "parent"}
        manifest.update({"files": files, "size": sum(int(f["size"]) for f in files.values())})
        if parent:
            manifest["parent"] = parent
        store.write_manifest(new, manifest)
        fsync_tree(new)
        exchange(ckpt.path, new)
        fsync_path(ckpt.path.parent)
    finally:
        shutil.rmtree(new, ignore_errors=True)  # the old version once exchanged, else the unfinished new one
    return store.get(ckpt.id)


def remove_unfinished(folder: Path) -> list[str]:
    """Remove what interrupted rewrites left in a folder of checkpoints."""
    done = []
    for p in folder.glob(REWRITE_PREFIX + "*"):
        shutil.rmtree(p, ignore_errors=True)
        done.append(p.name)
    return done

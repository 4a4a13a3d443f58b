"""What of a user's prefix in object storage is deleted after an upload: the rules of the local
store (:meth:`.storage.store.Store.apply_retention`) applied to the bucket.

First the kernel's durable checkpoints beyond ``keep_last``; then, while the prefix holds more
than ``max_bytes``, the oldest durable checkpoints of any kernel. Bytes are counted as the store
lists them (sealed sizes with a key; the leases and uploads under way included): what the bucket
holds. Never deleted by the limit: the newest durable checkpoint of each kernel (a suspended
kernel's only way back, and the one a node taking the kernel's lease restores) and a checkpoint
still being uploaded (no ``complete.json`` yet, or an ``uploading.json`` beside it).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from .bucket import ObjectStore
from .transfer import COMPLETE, UPLOADING, completed


@dataclass(frozen=True)
class Deleted:
    """One checkpoint deleted from the store, its stored bytes and why."""

    name: str
    id: str
    bytes: int
    why: str


@dataclass
class Retention:
    """What one pass deleted, and the bytes the prefix holds afterwards (``None``: not counted,
    there being no limit)."""

    deleted: list[Deleted] = field(default_factory=list)
    left: int | None = None


def apply_retention(remote: ObjectStore, name: str, keep_last: int, max_bytes: int | None = None) -> Retention:
    """Delete what the rules above say of ``remote``'s prefix after an upload of ``name``."""
    done = Retention()
    keep = max(keep_last, 1)
    for old in completed(remote, name)[:-keep]:
        done.deleted.append(_delete(remote, name, old["id"], _stored(remote, f"{name}/{old['id']}"),
                                    f"older than the kernel's {keep} newest (keep_last)"))
    if max_bytes is None:
        return done
    sizes: dict[tuple[str, str], int] = defaultdict(int)
    uploading: set[tuple[str, str]] = set()
    durable: set[tuple[str, str]] = set()
    objects = remote.sizes("")
    for key, size in objects.items():
        parts = key.split("/", 2)
        if len(parts) < 3:  # NAME/lease.json
            continue
        sizes[parts[0], parts[1]] += size
        if parts[2] == UPLOADING:
            uploading.add((parts[0], parts[1]))
        elif parts[2] == COMPLETE:
            durable.add((parts[0], parts[1]))
    total = sum(objects.values())
    newest: dict[str, tuple[float, str]] = {}
    candidates = []
    for kernel, cid in durable:
        complete = remote.read_json(f"{kernel}/{cid}/{COMPLETE}")
        if complete is None:  # deleted meanwhile (the kernel was shut down)
            continue
        when = (float(complete.get("created") or 0), cid)
        newest[kernel] = max(newest.get(kernel, when), when)
        candidates.append((when, kernel))
    for when, kernel in sorted(candidates):
        if total <= max_bytes:
            break
        if newest[kernel] == when or (kernel, when[1]) in uploading:
            continue
        stored = sizes[kernel, when[1]]
        done.deleted.append(_delete(remote, kernel, when[1], stored, f"the oldest while the user's prefix held {total} "
                                    f"bytes, over max_bucket_bytes ({max_bytes})"))
        total -= stored
    done.left = total
    return done


def _stored(remote: ObjectStore, prefix: str) -> int:
    return sum(remote.sizes(prefix).values())


def _delete(remote: ObjectStore, name: str, cid: str, stored: int, why: str) -> Deleted:
    remote.delete(f"{name}/{cid}", recursive=True)
    return Deleted(name, cid, stored, why)

"""Which node runs a kernel of the object store: ``NAME/lease.json``.

The lease names the node that restored NAME and runs it, and its last heartbeat. It is created
only if absent (the store decides, so of two nodes racing, one wins) and taken over with a write
conditional on its tag (If-Match) once its heartbeat is too old. It names nodes and times only,
and stays plaintext.
"""
from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from typing import Any

from ..errors import StateError
from ..storage.store import Store
from .bucket import ObjectStore, ObjectStoreError

LEASE = "lease.json"


def node_id(store: Store) -> str:
    """This node as a lease names it: the host and its cache directory (two servers of one host
    with their own caches are two nodes)."""
    return f"{platform.node()}:{store.root}"


class LeaseHeldError(StateError):
    """Another node restored the kernel and may be running it."""


@dataclass
class Lease:
    """A kernel this node holds: the tag of the lease object as this node last wrote it, and
    the lease it took over from a node that stopped renewing its own (None: none was there)."""

    name: str
    node: str
    etag: str
    since: float
    taken_over: dict[str, Any] | None = None


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def take_lease(remote: ObjectStore, name: str, node: str, timeout_s: float | None = None) -> Lease:
    """Claim ``name`` for ``node`` before restoring it: created only if no lease exists (the store
    decides, so of two nodes racing, one wins); this node's own lease is taken again; a lease
    whose heartbeat is older than ``timeout_s`` (its node was lost) is taken over with a write
    conditional on the tag it was read with, so of two nodes taking it over, one wins."""
    key = f"{name}/{LEASE}"
    for _ in range(5):  # a lease released or renewed between the read and the write: look again
        now = time.time()
        mine = {"node": node, "since": now, "heartbeat": now, "pid": os.getpid()}
        tag = remote.put_json_if(key, mine, None)
        if tag is not None:
            return Lease(name, node, tag, now)
        held, held_tag = remote.read_json_tagged(key)
        if held is None:
            continue
        heard = float(held.get("heartbeat") or held.get("since") or 0)
        if held.get("node") == node:
            tag = remote.put_json_if(key, {**mine, "since": held.get("since", now)}, held_tag)
            if tag is not None:
                return Lease(name, node, tag, float(held.get("since", now)))
            continue
        if timeout_s is not None and now - heard > timeout_s:
            tag = remote.put_json_if(key, mine, held_tag)
            if tag is not None:
                return Lease(name, node, tag, now, taken_over=held)
            continue
        expires = (f" If that node is lost, its lease expires {max(timeout_s - (now - heard), 0):.0f} s from now "
                   f"(c.GPUCR.lease_timeout_s) and the kernel can then be restored here from its last checkpoint in the "
                   f"store." if timeout_s is not None else
                   f" If that node is gone for good, delete {remote!r}/{key} and try again.")
        raise LeaseHeldError(
            f"{name} is running on {held.get('node', 'another node')} (restored there at "
            f"{_when(float(held.get('since') or 0))}, last heard of {max(now - heard, 0):.0f} s ago); it is not "
            f"restored here as well.",
            f"Suspend or shut it down there; it can then be restored here.{expires}")
    raise ObjectStoreError(f"The lease of {name} in {remote!r} kept changing while this node tried to take it.",
                           "Try again.")


def renew_lease(remote: ObjectStore, lease: Lease) -> bool:
    """Say this node still runs the kernel (the heartbeat); False when another node took the
    lease over meanwhile (this node was taken for lost)."""
    now = time.time()
    tag = remote.put_json_if(f"{lease.name}/{LEASE}", {"node": lease.node, "since": lease.since, "heartbeat": now,
                                                       "pid": os.getpid()}, lease.etag)
    if tag is None:
        return False
    lease.etag = tag
    return True


def taken_over_note(lease: Lease) -> str | None:
    """What the user is told after a restore that took a lost node's lease over."""
    old = lease.taken_over
    if old is None:
        return None
    heard = float(old.get("heartbeat") or old.get("since") or 0)
    return (f"Taken over from {old.get('node')}, which stopped renewing its lease at {_when(heard)}: restored from the "
            f"last checkpoint in the store; what the kernel did on that node after it is lost.")


def release_lease(remote: ObjectStore, name: str, node: str) -> None:
    """Give ``name`` back (it is durable in the store again, or gone); never another node's lease."""
    held = remote.read_json(f"{name}/{LEASE}")
    if held is not None and held.get("node") == node:
        remote.delete(f"{name}/{LEASE}")


def forget(remote: ObjectStore, name: str, node: str) -> None:
    """Delete everything of ``name`` in the store (the kernel was shut down here); not while
    another node holds its lease (it runs there: this node's listing of it was stale)."""
    held = remote.read_json(f"{name}/{LEASE}")
    if held is not None and held.get("node") != node:
        raise LeaseHeldError(f"{name} runs on {held.get('node')}; its objects are kept.", "")
    remote.delete(name, recursive=True)

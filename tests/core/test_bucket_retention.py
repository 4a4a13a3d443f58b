"""Retention in one user's prefix of moto's S3 server: what each rule deletes, counted in the
bytes the store lists, and what it never deletes (a kernel's newest durable checkpoint, an upload
under way, another user's objects)."""
from __future__ import annotations

import pytest

from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from jupyter_gpucr.core.objectstore.retention import apply_retention
from tests.s3 import BUCKET, aws_env, environ, moto_server

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint, environ(aws_env(endpoint)):
        yield endpoint


def put(remote: ObjectStore, name: str, cid: str, created: float, durable: bool = True, uploading: bool = False) -> None:
    """A checkpoint's folder as an upload leaves it: 1000 bytes of image, complete.json once durable,
    uploading.json while an upload (or its redo) is under way."""
    remote.fs.pipe_file(remote.path(f"{name}/{cid}/checkpoint/images/pages-1.img"), bytes(1000))
    if durable:
        remote.write_json(f"{name}/{cid}/complete.json", {"id": cid, "name": name, "created": created})
    if uploading:
        remote.write_json(f"{name}/{cid}/uploading.json", {"node": "n", "since": created})


def folders(remote: ObjectStore) -> dict[str, list[str]]:
    found: dict[str, set[str]] = {}
    for key in remote.sizes(""):
        if key.count("/") > 1:  # not a lease
            name, cid, _ = key.split("/", 2)
            found.setdefault(name, set()).add(cid)
    return {name: sorted(ids) for name, ids in found.items()}


def filled(user: str) -> ObjectStore:
    """Kernel a with three durable checkpoints; b with one being uploaded again (a redo) and a newer
    one; c only under way; a lease of a."""
    remote = ObjectStore(f"s3://{BUCKET}/retention", user=user)
    remote.delete("", recursive=True)
    put(remote, "a", "a1", 1)
    put(remote, "a", "a2", 2)
    put(remote, "b", "b1", 3, uploading=True)
    put(remote, "b", "b2", 4)
    put(remote, "a", "a3", 5)
    put(remote, "c", "c1", 6, durable=False, uploading=True)
    remote.write_json("a/lease.json", {"node": "n"})
    return remote


def test_the_limit_deletes_the_oldest_first_and_never_what_a_kernel_needs(s3):
    remote, other = filled("alice"), filled("bob")
    total = sum(remote.sizes("").values())
    a1 = sum(remote.sizes("a/a1").values())

    done = apply_retention(remote, "a", keep_last=3, max_bytes=total - a1)
    assert [d.id for d in done.deleted] == ["a1"] and done.deleted[0].bytes == a1
    assert "the oldest while the user's prefix held" in done.deleted[0].why
    assert done.left == total - a1 == sum(remote.sizes("").values())

    done = apply_retention(remote, "a", keep_last=3, max_bytes=1)
    assert [d.id for d in done.deleted] == ["a2"]  # b1 is being uploaded; a3, b2 are their kernels' newest
    assert folders(remote) == {"a": ["a3"], "b": ["b1", "b2"], "c": ["c1"]}
    assert remote.read_json("a/lease.json") == {"node": "n"}
    assert done.left == sum(remote.sizes("").values()) > 1
    assert folders(other) == {"a": ["a1", "a2", "a3"], "b": ["b1", "b2"], "c": ["c1"]}, "another user's prefix"


def test_keep_last_deletes_a_kernels_older_checkpoints_without_a_limit(s3):
    remote = filled("carol")
    done = apply_retention(remote, "a", keep_last=2)
    assert [(d.id, d.why) for d in done.deleted] == [("a1", "older than the kernel's 2 newest (keep_last)")]
    assert done.left is None
    assert folders(remote) == {"a": ["a2", "a3"], "b": ["b1", "b2"], "c": ["c1"]}

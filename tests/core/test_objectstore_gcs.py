"""gs:// stores against a real GCS server (fake-gcs-server on localhost, :mod:`tests.gcs`): the
lease written with GCS's generation preconditions, so of nodes racing for it one wins; objects
sealed as they stream in and opened as their ranges come back."""
from __future__ import annotations

import os
import secrets
import threading
import time

import pytest

from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from jupyter_gpucr.core.objectstore.leases import LeaseHeldError, take_lease
from jupyter_gpucr.core.objectstore.sealing import load_key, sealed_size
from tests.core.test_objectstore import make_key, raw_objects
from tests.gcs import BUCKET, OPTIONS, gcs_env, gcs_server
from tests.s3 import environ

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    with gcs_server(tmp_path_factory.mktemp("gcs")) as endpoint, environ(gcs_env(endpoint)):
        fs = ObjectStore(f"gs://{BUCKET}/x", OPTIONS).fs
        assert type(fs).__name__ == "GCSFileSystem", f"gcsfs was imported before gcs_env() was set: {type(fs)}"
        yield endpoint


def race(remote: ObjectStore, name: str, nodes: int, timeout_s: float | None = None) -> tuple[list, list[str]]:
    """``nodes`` nodes taking ``name``'s lease at once: the leases won, and what the others were told."""
    won, refused = [], []
    start = threading.Barrier(nodes)

    def claim(node: str) -> None:
        start.wait()
        try:
            won.append(take_lease(remote, name, node, timeout_s))
        except LeaseHeldError as e:
            refused.append(e.message)

    threads = [threading.Thread(target=claim, args=(f"node-{i}",)) for i in range(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return won, refused


def test_of_nodes_racing_for_a_lease_or_taking_a_lost_ones_over_one_wins(gcs):
    alice = ObjectStore(f"gs://{BUCKET}/leases", OPTIONS, user="alice")
    won, refused = race(alice, "k1", 6)
    assert len(won) == 1 and len(refused) == 5
    assert all(f"k1 is running on {won[0].node}" in said for said in refused)
    assert won[0].etag == str(alice.fs.info(alice.path("k1/lease.json"))["generation"]), "the tag is the generation"

    # a node lost long ago: every node sees its lease expired, and only one takes it over
    lost = {"node": "lost-node", "since": time.time() - 3600, "heartbeat": time.time() - 3600}
    assert alice.put_json_if("k2/lease.json", lost, None) is not None
    assert alice.put_json_if("k2/lease.json", lost, None) is None, "created only if absent"
    won, refused = race(alice, "k2", 6, timeout_s=60)
    assert len(won) == 1 and won[0].taken_over == lost
    assert len(refused) == 5 and all(f"k2 is running on {won[0].node}" in said for said in refused)
    assert alice.read_json("k2/lease.json")["node"] == won[0].node


def test_sealed_objects_stream_in_and_open_in_ranges(gcs, tmp_path):
    alice = ObjectStore(f"gs://{BUCKET}/sealed", OPTIONS, user="alice", key=load_key(make_key(tmp_path / "gpucr.key")))
    marker = secrets.token_bytes(32)
    content = (marker + os.urandom((9 << 20) - len(marker))) * 2  # a few sealed chunks, each with the marker
    (tmp_path / "pages.img").write_bytes(content)
    (tmp_path / "empty.img").write_bytes(b"")
    alice.put_files([(str(tmp_path / "pages.img"), "k/c1/pages.img"), (str(tmp_path / "empty.img"), "k/c1/empty.img")])
    assert alice.sizes("k/c1") == {"pages.img": sealed_size(len(content)), "empty.img": sealed_size(0)}
    assert [p for p, data in raw_objects(alice).items() if marker in data] == []
    alice.get_files([("k/c1/pages.img", str(tmp_path / "back.img"), len(content)),
                     ("k/c1/empty.img", str(tmp_path / "back-empty.img"), 0)])
    assert (tmp_path / "back.img").read_bytes() == content and (tmp_path / "back-empty.img").read_bytes() == b""

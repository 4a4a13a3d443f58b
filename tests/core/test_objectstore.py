"""Checkpoints in object storage against a real S3 server (moto's server mode): a process
checkpointed by one node, its local store deleted, restored by another node with another store
directory; a damaged object named; one lease per kernel; one prefix per user; a store that is
down said so."""
from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from jupyter_gpucr.core.checkpointer import Checkpointer
from jupyter_gpucr.core.errors import CheckpointDamagedError
from jupyter_gpucr.core.objectstore import ObjectStore, ObjectStoreError
from jupyter_gpucr.core.store import Store
from jupyter_gpucr.core.streamup import PART, StreamingUpload
from jupyter_gpucr.core.upload import LeaseHeldError, download, kernels, latest, take_lease, upload
from tests.conftest import agent_command, ask, wait_for_line
from tests.s3 import BUCKET, aws_env, environ, free_port, moto_server

pytestmark = pytest.mark.timeout(180)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint, environ(aws_env(endpoint)):
        yield endpoint


def test_checkpoint_made_on_one_node_restores_on_another(criu_path, s3, tmp_path):
    node_a, node_b = Store(tmp_path / "cache-a"), Store(tmp_path / "cache-b")
    remote = ObjectStore(f"s3://{BUCKET}/ckpt", user="alice")
    counts = tmp_path / "counts"
    os.environ["AGENT_FILE"] = str(counts)
    a = Checkpointer(node_a)
    a.run("agent", agent_command("cpu_agent.py", "24"))
    hello = wait_for_line(node_a.proc_dir("agent") / "stdout.log")
    ckpt = a.checkpoint("agent")
    moved = upload(remote, node_a, ckpt)
    assert moved["bytes"] > 24 << 20
    at_checkpoint = int(counts.read_text().split()[-1])
    shutil.rmtree(tmp_path / "cache-a")  # node A is gone

    newest = kernels(remote)["agent"]
    assert newest["id"] == ckpt.id and newest["node"].endswith(str(tmp_path / "cache-a"))
    # an image object damaged in the store (same size, other bytes): the restore names it and keeps the checkpoint
    pages = max(newest["objects"], key=lambda k: newest["objects"][k])
    good = remote.fs.cat_file(remote.path(f"agent/{ckpt.id}/{pages}"))
    remote.fs.pipe_file(remote.path(f"agent/{ckpt.id}/{pages}"), bytes(len(good)))
    b = Checkpointer(node_b)
    download(remote, node_b, newest)
    with pytest.raises(CheckpointDamagedError, match=Path(pages).name):
        b.restore("agent")
    assert (node_b.checkpoints_root / ckpt.id).is_dir(), "a damaged checkpoint is kept"

    remote.fs.pipe_file(remote.path(f"agent/{ckpt.id}/{pages}"), good)
    shutil.rmtree(node_b.checkpoints_root / ckpt.id)
    download(remote, node_b, newest)
    running = b.restore("agent")
    try:
        assert ask(hello["port"])["checksum"] == hello["checksum"]
        time.sleep(0.3)
        seen = [int(x) for x in counts.read_text().split()]
        assert seen == list(range(1, len(seen) + 1)) and seen[-1] > at_checkpoint, "the process went on where it was"
        # its output goes to node B's copy of its log, which CRIU handed it in place of node A's path
        assert os.readlink(f"/proc/{running.pid}/fd/1") == str(node_b.proc_dir("agent") / "stdout.log")
    finally:
        b.remove("agent", kill=True)


def test_one_lease_per_kernel_and_one_prefix_per_user(s3, tmp_path):
    alice, bob = ObjectStore(f"s3://{BUCKET}/leases", user="alice"), ObjectStore(f"s3://{BUCKET}/leases", user="bob")
    winners, refusals = [], []

    def claim(node: str) -> None:
        try:
            take_lease(alice, "k1", node)
            winners.append(node)
        except LeaseHeldError as e:
            refusals.append(e)

    threads = [threading.Thread(target=claim, args=(f"node-{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1 and len(refusals) == 3
    assert all(f"running on {winners[0]}" in e.message for e in refusals)
    take_lease(alice, "k1", winners[0])  # its own lease is taken again
    alice.write_json("k1/x/complete.json", {"id": "x", "name": "k1", "created": 1.0})
    assert latest(alice, "k1") is not None
    assert bob.names() == [] and kernels(bob) == {}, "bob's server sees nothing of alice's prefix"


def test_a_store_that_is_down_says_so(tmp_path):
    with environ(aws_env(f"http://127.0.0.1:{free_port()}")):
        t0 = time.monotonic()
        with pytest.raises(ObjectStoreError) as e:
            ObjectStore(f"s3://{BUCKET}/x", user="alice").probe()
    assert time.monotonic() - t0 < 30
    assert f"s3://{BUCKET}/x/alice could not be used" in e.value.message and "Could not connect" in e.value.message
    assert "AWS_ENDPOINT_URL" in e.value.hint


def test_images_upload_while_criu_writes_them(criu_path, s3, tmp_path):
    """The process's pages go to the store in parts while CRIU still writes them; the upload after
    the commit sends only the rest, and another node restores what arrived."""
    node_a, node_b = Store(tmp_path / "cache-a"), Store(tmp_path / "cache-b")
    remote = ObjectStore(f"s3://{BUCKET}/stream", user="alice")
    os.environ["AGENT_FILE"] = str(tmp_path / "counts")
    a = Checkpointer(node_a)
    streams: dict[str, StreamingUpload] = {}

    def follow(name: str, cid: str, images: Path) -> StreamingUpload:
        streams[cid] = StreamingUpload(remote, f"{name}/{cid}", images, "node-a")
        return streams[cid]

    a.beside_dump = follow
    a.run("agent", agent_command("cpu_agent.py", "160"))
    hello = wait_for_line(node_a.proc_dir("agent") / "stdout.log")
    a.checkpoint("agent", leave_running=True, reason="fork")
    assert not streams  # a fork's checkpoint is never uploaded: nothing goes out while it is written
    ckpt = a.checkpoint("agent")
    moved = upload(remote, node_a, ckpt, streamed=streams[ckpt.id])
    images = sum(int(f["size"]) for f in ckpt.manifest["files"].values())
    assert moved["streamed"] >= images, moved  # every image file was complete in the store before the upload began
    assert moved["during_dump"] >= PART, moved  # whole parts went out while CRIU wrote
    shutil.rmtree(tmp_path / "cache-a")

    b = Checkpointer(node_b)
    download(remote, node_b, kernels(remote)["agent"])
    b.restore("agent")
    try:
        assert ask(hello["port"])["checksum"] == hello["checksum"]
    finally:
        b.remove("agent", kill=True)

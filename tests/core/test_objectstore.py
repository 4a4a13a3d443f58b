"""Checkpoints in object storage against a real S3 server (moto's server mode): a process
checkpointed by one node, its local store deleted, restored by another node with another store
directory; a damaged object named; one lease per kernel; one prefix per user; a store that is
down said so; with an encryption key, nothing of the process in the store's bytes, and a restore
only with that key."""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from jupyter_gpucr.core.checkpointer import Checkpointer
from jupyter_gpucr.core.errors import CheckpointDamagedError
from jupyter_gpucr.core.objectstore.bucket import ObjectStore, ObjectStoreError
from jupyter_gpucr.core.objectstore.leases import LeaseHeldError, take_lease
from jupyter_gpucr.core.objectstore.sealing import KeyMismatchError, load_key, sealed_size
from jupyter_gpucr.core.objectstore.streamup import PART, StreamingUpload
from jupyter_gpucr.core.objectstore.transfer import download, kernels, latest, manifest_of, proc_pairs, upload
from jupyter_gpucr.core.storage.store import Store
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

    a.stream_dumps_to(follow)
    a.run("agent", agent_command("cpu_agent.py", "160"))
    hello = wait_for_line(node_a.proc_dir("agent") / "stdout.log")
    a.checkpoint("agent", leave_running=True, reason="fork")
    assert not streams  # a fork's checkpoint is never uploaded: nothing goes out while it is written
    ckpt = a.checkpoint("agent")
    moved = upload(remote, node_a, ckpt, streamed=streams[ckpt.id])
    images = sum(int(f["size"]) for f in ckpt.manifest["files"].values())
    assert moved["streamed"] >= images, moved  # every image file was complete in the store before the upload began
    # whole parts went out while CRIU wrote, where it wrote long enough for the watcher (every 0.05 s)
    # to see them: a fast machine writes these 160 MiB from memory in a few hundredths of a second
    wrote_for = ckpt.manifest["timings"]["criu_memwrite"]
    assert moved["during_dump"] >= PART or wrote_for < 0.25, (wrote_for, moved)
    shutil.rmtree(tmp_path / "cache-a")

    b = Checkpointer(node_b)
    download(remote, node_b, kernels(remote)["agent"])
    b.restore("agent")
    try:
        assert ask(hello["port"])["checksum"] == hello["checksum"]
    finally:
        b.remove("agent", kill=True)


def test_files_final_before_the_dump_go_out_beside_it_and_a_failed_one_after_the_commit(criu_path, s3, tmp_path):
    """Offloaded tensor files, written before the dump, are in the store in parts before the dump
    is over (sealed); one whose upload the store lost meanwhile is sent by the upload after the
    commit; another node downloads both as they were."""
    node_a, node_b = Store(tmp_path / "cache-a"), Store(tmp_path / "cache-b")
    remote = ObjectStore(f"s3://{BUCKET}/final", user="alice", key=load_key(make_key(tmp_path / "gpucr.key")))
    os.environ["AGENT_FILE"] = str(tmp_path / "counts")
    a = Checkpointer(node_a)
    a.run("agent", agent_command("cpu_agent.py", "32"))
    wait_for_line(node_a.proc_dir("agent") / "stdout.log")
    tensors = node_a.proc_dir("agent") / "gpu-tensors"
    tensors.mkdir()
    content = {"0.bin": os.urandom(2 * PART + 1000), "1.bin": os.urandom(PART + 5)}
    for name, data in content.items():
        (tensors / name).write_bytes(data)
    seen: dict[str, int] = {}

    def uploads() -> dict[str, str]:  # what the store holds unfinished below alice/, by file name
        listed = remote.fs.call_s3("list_multipart_uploads", Bucket=BUCKET, Prefix="final/alice/")
        return {u["Key"].rsplit("/", 1)[1]: u["UploadId"] for u in listed.get("Uploads", [])}

    @contextlib.contextmanager
    def follow(name: str, cid: str, images: Path) -> Iterator[StreamingUpload]:
        with StreamingUpload(remote, f"{name}/{cid}", images, "node-a", proc_pairs(node_a.proc_dir(name), ["gpu-tensors"])) as stream:
            streams[cid] = stream
            yield stream
            # CRIU has returned; the stream does not know yet: the tensors' parts are in the store already
            deadline = time.monotonic() + 60
            while not seen.get("0.bin") and time.monotonic() < deadline:
                if "0.bin" in (held := uploads()):
                    seen["0.bin"] = len(remote.call_s3("list_parts", f"agent/{cid}/proc/gpu-tensors/0.bin",
                                                       UploadId=held["0.bin"]).get("Parts", []))
                time.sleep(0.05)
            if "1.bin" in (held := uploads()):
                remote.call_s3("abort_multipart_upload", f"agent/{cid}/proc/gpu-tensors/1.bin", UploadId=held["1.bin"])

    streams: dict[str, StreamingUpload] = {}
    a.stream_dumps_to(follow)
    ckpt = a.checkpoint("agent")
    assert seen.get("0.bin", 0) >= 1, "no part of the tensors was in the store before the dump was over"
    moved = upload(remote, node_a, ckpt, streamed=streams[ckpt.id])
    images = sum(int(f["size"]) for f in ckpt.manifest["files"].values())
    assert moved["streamed"] == images + len(content["0.bin"]), moved  # 1.bin: sent after the commit
    shutil.rmtree(tmp_path / "cache-a")

    download(remote, node_b, kernels(remote)["agent"])
    assert {n: (node_b.proc_dir("agent") / "gpu-tensors" / n).read_bytes() for n in content} == content


def make_key(path: Path) -> Path:
    """A key as the docs say to make one: 32 random bytes in a file only its owner reads."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    return path


def raw_objects(remote: ObjectStore) -> dict[str, bytes]:
    """Every object below the user's prefix, as the store holds it."""
    return {path: remote.fs.cat_file(path) for path in remote.fs.find(remote.root)}


def test_sealed_checkpoint_keeps_the_process_out_of_the_store_and_restores_only_with_its_key(criu_path, s3, tmp_path):
    node_a, node_b = Store(tmp_path / "cache-a"), Store(tmp_path / "cache-b")
    key = load_key(make_key(tmp_path / "gpucr.key"))
    other = load_key(make_key(tmp_path / "other.key"))
    sealed = ObjectStore(f"s3://{BUCKET}/sealed", user="alice", key=key)
    token = secrets.token_hex(16)  # in the process's environment and memory, and in its open file's path
    os.environ["AGENT_FILE"] = str(tmp_path / f"counts-{token}")
    in_memory = np.random.default_rng(7).random(24 << 17)[1 << 20:(1 << 20) + 8].tobytes()  # cpu_agent.py's array
    a = Checkpointer(node_a)
    a.run("agent", agent_command("cpu_agent.py", "24"))
    hello = wait_for_line(node_a.proc_dir("agent") / "stdout.log")
    ckpt = a.checkpoint("agent")
    upload(sealed, node_a, ckpt)
    plain = ObjectStore(f"s3://{BUCKET}/plain", user="alice")
    upload(plain, node_a, ckpt)  # the same checkpoint unencrypted: the markers are where a reader would find them
    shutil.rmtree(tmp_path / "cache-a")

    assert any(token.encode() in data for data in raw_objects(plain).values())
    assert any(in_memory in data for data in raw_objects(plain).values())
    stored = raw_objects(sealed)
    assert [p for p, data in stored.items() if token.encode() in data or in_memory in data] == []
    newest = kernels(sealed)["agent"]
    assert newest["encryption"]["key_id"] == key.id and "manifest" not in newest
    assert manifest_of(sealed, newest)["id"] == ckpt.id

    # another key, no key, a key for an unencrypted checkpoint: said before anything is downloaded
    for remote, said in [(ObjectStore(sealed.url, user="alice", key=other), f"encrypted with another key (id {key.id})"),
                         (ObjectStore(sealed.url, user="alice"), f"is encrypted (key id {key.id})"),
                         (ObjectStore(plain.url, user="alice", key=key), "is not encrypted")]:
        with pytest.raises(KeyMismatchError) as refused:
            download(remote, node_b, kernels(remote)["agent"])
        assert said in refused.value.message and "c.GPUCR.encryption_key_file" in refused.value.hint
        assert not (node_b.checkpoints_root / ckpt.id).exists()
    assert raw_objects(sealed) == stored, "the checkpoint in the store is as it was"
    # `gpucr restore` with another key (and a previous key that is not it either): refused before it claims
    # the kernel, so no node's lease is left behind; the error names every key it tried
    other_file, older_file = tmp_path / "other.key", make_key(tmp_path / "older.key")
    refused_cli = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", sealed.url,
                                  "--encryption-key-file", str(other_file), "--previous-encryption-key-file",
                                  str(older_file), "restore", "agent"], capture_output=True,
                                 text=True, timeout=120, env={**os.environ, "JUPYTERHUB_USER": "alice",
                                                               "XDG_DATA_HOME": str(tmp_path / "cache-c")})
    assert refused_cli.returncode == 1 and f"encrypted with another key (id {key.id})" in refused_cli.stderr
    assert f"its previous keys: {load_key(older_file).id} ({older_file})" in refused_cli.stderr
    assert sealed.read_json("agent/lease.json") is None, "a refused restore holds no lease"

    # one byte flipped in the store: the download names the object and keeps nothing of it
    pages = max(newest["objects"], key=lambda k: newest["objects"][k])
    path = sealed.path(f"agent/{ckpt.id}/{pages}")
    damaged = bytearray(stored[path])
    damaged[len(damaged) // 2] ^= 1
    sealed.fs.pipe_file(path, bytes(damaged))
    with pytest.raises(CheckpointDamagedError, match=f"agent/{ckpt.id}/{pages} is damaged or was altered"):
        download(sealed, node_b, newest)
    assert not (node_b.checkpoints_root / ckpt.id).exists()
    sealed.fs.pipe_file(path, stored[path])

    download(sealed, node_b, newest)
    b = Checkpointer(node_b)
    b.restore("agent")
    try:
        assert ask(hello["port"])["checksum"] == hello["checksum"], "the process has its memory back"
    finally:
        b.remove("agent", kill=True)


def test_sealed_objects_stream_while_written_open_in_ranges_and_only_where_they_were_put(s3, tmp_path):
    """Parts sealed while a file grows (one ending on a part's boundary, one small, one empty), a
    file put in sealed parts afterwards, both read back in parallel ranges; a sealed object
    copied to another name, or into another user's prefix, does not open there."""
    key = load_key(make_key(tmp_path / "gpucr.key"))
    alice = ObjectStore(f"s3://{BUCKET}/sealed-files", user="alice", key=key)
    images = tmp_path / "images"
    images.mkdir()
    marker = secrets.token_bytes(32)
    content = {"pages.img": (marker + os.urandom(PART - len(marker))) * 2, "core.img": marker * 30, "empty.img": b""}
    with StreamingUpload(alice, "k/c1", images, "node-a") as stream:
        for name in ("core.img", "empty.img"):
            (images / name).write_bytes(content[name])
        with open(images / "pages.img", "wb") as f:
            for at in range(0, 2 * PART, 4 << 20):
                f.write(content["pages.img"][at:at + (4 << 20)])
                f.flush()
                time.sleep(0.02)
        time.sleep(0.3)  # both whole parts go out while the file is open: its last part holds only the final chunk
    assert stream.result(60) == {f"checkpoint/images/{n}": len(data) for n, data in content.items()}
    assert stream.during_dump == 2 * PART
    (tmp_path / "later.img").write_bytes(content["pages.img"] + marker)
    alice.put_files([(str(tmp_path / "later.img"), "k/c2/later.img")])  # three sealed parts, the last one short

    listed = {k: size for k, size in alice.sizes("k").items() if k.endswith(".img")}
    assert listed == {**{f"c1/checkpoint/images/{n}": sealed_size(len(d)) for n, d in content.items()},
                      "c2/later.img": sealed_size(2 * PART + len(marker))}
    assert [p for p, data in raw_objects(alice).items() if marker in data] == []
    back = tmp_path / "back"
    back.mkdir()
    alice.get_files([(f"k/c1/checkpoint/images/{n}", str(back / n), len(d)) for n, d in content.items()]
                    + [("k/c2/later.img", str(back / "later.img"), 2 * PART + len(marker))])
    assert {n: (back / n).read_bytes() for n in content} == content
    assert (back / "later.img").read_bytes() == content["pages.img"] + marker

    core = alice.fs.cat_file(alice.path("k/c1/checkpoint/images/core.img"))
    alice.fs.pipe_file(alice.path("k/c1/checkpoint/images/renamed.img"), core)
    with pytest.raises(CheckpointDamagedError, match="alice/k/c1/checkpoint/images/renamed.img is damaged"):
        alice.get_files([("k/c1/checkpoint/images/renamed.img", str(back / "x"), len(content["core.img"]))])
    bob = ObjectStore(alice.url, user="bob", key=key)
    bob.fs.pipe_file(bob.path("k/c1/checkpoint/images/core.img"), core)
    with pytest.raises(CheckpointDamagedError, match="bob/k/c1/checkpoint/images/core.img is damaged"):
        bob.get_files([("k/c1/checkpoint/images/core.img", str(back / "x"), len(content["core.img"]))])

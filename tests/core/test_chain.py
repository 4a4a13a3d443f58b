"""Checkpoints that take their unchanged pages from another (core/storage/chain.py), with a real
CRIU and a real process: what a user checks is that each still restores the state it was taken
at, whatever happens to the other (copied, deleted, trashed, damaged by hand, a rewrite killed)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.criu import pagemaps
from jupyter_gpucr.core.errors import CheckpointDamagedError, PreconditionError
from jupyter_gpucr.core.objectstore import transfer
from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from jupyter_gpucr.core.steps.incremental import NO_TRACKING
from jupyter_gpucr.core.storage import chain
from jupyter_gpucr.core.storage.store import Checkpoint
from tests.conftest import wait_for_line

pytestmark = pytest.mark.timeout(300)

#: 64 MiB of random bytes; ``set N`` writes N into its first page; every request answers with N and a digest.
AGENT = """
import hashlib, json, os, socket, sys
data = bytearray(os.urandom(64 << 20))
n = 0
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", 0))
server.listen()
print(json.dumps({"port": server.getsockname()[1]}), flush=True)
while True:
    conn, _ = server.accept()
    words = conn.recv(100).decode().split()
    if words and words[0] == "set":
        n = int(words[1])
        data[:4096] = n.to_bytes(8, "little") * 512
    conn.sendall(json.dumps({"n": n, "digest": hashlib.sha256(data).hexdigest()}).encode() + b"\\n")
    conn.close()
"""


def _ask(port: int, words: str = "get") -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(words.encode())
        return json.loads(s.makefile().readline())


@pytest.fixture
def two_points(criu_path, store_dir, tmp_path):
    """A running agent with two checkpoints left running (as save points): ``n`` 1 in the older,
    2 in the newer; the older rewritten to take its unchanged pages from the newer."""
    cr = Checkpointer(store_dir, keep_last=10)  # the suspends below delete no copy
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    cr.run("agent", [sys.executable, str(script)])
    port = wait_for_line(store_dir / "procs" / "agent" / "stdout.log")["port"]
    states = [_ask(port, "set 1")]
    older = cr.checkpoint("agent", leave_running=True, reason="savepoint", incremental=True)
    states.append(_ask(port, "set 2"))
    newer = cr.checkpoint("agent", leave_running=True, reason="savepoint", incremental=True)
    if cr.criu.dirty_tracking:  # the newer one is incremental already: nothing to share
        pytest.skip("this kernel tracks written pages; test_a_tracked_dump_holds_only_the_pages_written_since covers it")
    assert older.manifest["memory"] == newer.manifest["memory"] == {"dump": "full", "tracked": False,
                                                                    "why_full": NO_TRACKING}
    older = chain.share_pages(cr.store, older.id, newer.id)
    yield cr, port, older, newer, states
    cr.remove("agent", kill=True)


def _restored(cr: Checkpointer, port: int, ckpt: Checkpoint) -> dict:
    """The agent suspended, then restored from ``ckpt``; what it answers."""
    if cr.status("agent")["state"] == "running":
        cr.checkpoint("agent")
    cr.restore("agent", checkpoint_id=ckpt.id)
    return _ask(port)


def test_a_checkpoint_takes_the_pages_it_shares_from_another(two_points):
    cr, port, older, newer, states = two_points
    assert older.manifest["parent"] == newer.id and (older.images / "parent").resolve() == newer.images.resolve()
    whole = pagemaps.own_page_bytes(newer.images)
    assert whole > 64 << 20 and pagemaps.own_page_bytes(older.images) < whole // 16
    assert older.size < newer.size // 8
    older.verify("images")  # its own files and its parent's

    copy = cr.store.copy_checkpoint(older.id, "goback")  # as going back to it copies it
    assert copy.manifest["parent"] == newer.id and (copy.images / "parent").resolve() == newer.images.resolve()
    assert _restored(cr, port, copy) == states[0]
    assert _restored(cr, port, newer) == states[1]

    # the newer goes: the older (and its copy) take in what they took from it, and restore as before
    cr.store.delete(newer.id)
    for ckpt in (cr.store.get(older.id), cr.store.get(copy.id)):
        assert "parent" not in ckpt.manifest and not (ckpt.images / "parent").exists()
        assert pagemaps.own_page_bytes(ckpt.images) >= whole - (1 << 20)
        ckpt.verify("images")
    assert _restored(cr, port, cr.store.get(older.id)) == states[0]


def test_alone_in_the_trash_it_holds_all_its_pages(two_points):
    cr, port, older, newer, states = two_points
    cr.checkpoint("agent")  # suspended: the state it leaves is the latest checkpoint
    tid = cr.store.trash_checkpoint("agent", older.id, "test")
    trashed = cr.store.trash_root / tid / "checkpoints" / older.id
    assert not (trashed / "images" / "parent").exists() and "parent" not in json.loads((trashed / "manifest.json").read_text())
    cr.store.put_back_trashed_checkpoint(tid)
    assert _restored(cr, port, cr.store.get(older.id)) == states[0]


def test_a_missing_parent_is_named_and_nothing_restored(two_points):
    cr, port, older, newer, states = two_points
    cr.checkpoint("agent")
    os.rename(newer.path, newer.path.with_name("moved-away"))  # by hand, outside gpucr
    with pytest.raises(CheckpointDamagedError) as damaged:
        cr.restore("agent", checkpoint_id=older.id)
    assert newer.id in damaged.value.message and "missing" in damaged.value.message
    assert cr.status("agent")["state"] == "checkpointed"


def test_object_storage_refuses_it_clearly(two_points, tmp_path):
    cr, _port, older, _newer, _states = two_points
    with pytest.raises(PreconditionError) as refused:
        transfer.upload(ObjectStore(f"file://{tmp_path}/bucket", user="alice"), cr.store, older)
    assert older.manifest["parent"] in refused.value.message


@pytest.mark.parametrize("delay", [0.0, 0.05, 0.1, 0.15, 0.3])
def test_a_rewrite_killed_midway_leaves_a_whole_checkpoint(two_points, delay):
    """``release`` (the newer one about to go) killed at some point of its rewrite of the older
    one (64 MiB here: done in about 0.1 s): the older is, as it was or as rewritten, complete and
    restores; what the rewrite left is removed."""
    cr, port, older, newer, states = two_points
    worker = subprocess.Popen([sys.executable, "-c", "import sys; from jupyter_gpucr.core.storage import chain; "
                               "from jupyter_gpucr.core.storage.store import Store; "
                               "chain.release(Store(sys.argv[1]), sys.argv[2])", str(cr.store.root), newer.id])
    building = older.path.with_name(chain.REWRITE_PREFIX + older.id)
    deadline = time.monotonic() + 60
    while not building.exists() and worker.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    time.sleep(delay)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    now = cr.store.get(older.id)
    now.verify("images")
    cr.store.remove_leftover_deletions()
    assert not building.exists()
    assert _restored(cr, port, now) == states[0]


def test_a_tracked_dump_holds_only_the_pages_written_since(criu_path, store_dir, tmp_path):
    """Where the kernel tracks written pages: the second checkpoint's dump is incremental (CRIU's
    parent link to the first), and it restores its state; elsewhere this is skipped, and the
    dumps say why they are full."""
    cr = Checkpointer(store_dir)
    if not cr.criu.dirty_tracking:
        pytest.skip(f"no incremental dumps here: {NO_TRACKING}")
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    cr.run("agent", [sys.executable, str(script)])
    try:
        port = wait_for_line(store_dir / "procs" / "agent" / "stdout.log")["port"]
        _ask(port, "set 1")
        first = cr.checkpoint("agent", leave_running=True, reason="savepoint", incremental=True)
        assert first.manifest["memory"]["dump"] == "full" and "parent" not in first.manifest
        state = _ask(port, "set 2")
        second = cr.checkpoint("agent", leave_running=True, reason="savepoint", incremental=True)
        assert second.manifest["memory"]["dump"] == "incremental" and second.manifest["parent"] == first.id
        assert (second.images / "parent").resolve() == first.images.resolve()
        assert pagemaps.own_page_bytes(second.images) < pagemaps.own_page_bytes(first.images) // 16
        assert _restored(cr, port, second) == state
    finally:
        cr.remove("agent", kill=True)

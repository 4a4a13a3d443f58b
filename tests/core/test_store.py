"""The store's safety nets: the trash (nothing of a suspended process is deleted silently),
garbage collection, damaged manifests that are reported instead of hidden, names."""
from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.criu.commands import DUMP_DONE
from jupyter_gpucr.core.errors import CheckpointDamagedError, StateError
from jupyter_gpucr.core.storage.checksums import digest_tree
from jupyter_gpucr.core.storage.store import INTENT, MANIFEST, Store
from tests.conftest import ask
from tests.core.test_core import gpucr, start_agent


def make_checkpoint(store: Store, name: str, kernel: dict | None = None) -> str:
    """A complete checkpoint of random bytes, committed the way the engines commit theirs."""
    cid, tmp = store.new_checkpoint_dir(name)
    (tmp / "images" / "pages-1.img").write_bytes(os.urandom(4096))
    files = digest_tree(tmp / "images")
    manifest = {"name": name, "created": time.time(), "engine": "criu", "files": files, "size": 4096,
                "kernel": kernel or {}}
    store.commit_checkpoint(cid, tmp, manifest)
    store.write_proc(name, {"name": name, "state": "checkpointed", "pid": None, "checkpoint": cid})
    (store.proc_dir(name) / "stdout.log").write_text("output of the process\n")
    return cid


def assert_private(root: Path) -> None:
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), f"{p} has mode {oct(mode)}"


def test_trashed_process_comes_back_and_restores(criu_path, store_dir, tmp_path):
    hello, _ = start_agent(store_dir, "kept", tmp_path, mb=20)
    cr = Checkpointer(store_dir)
    ckpt = cr.checkpoint("kept")
    tid = cr.store.trash("kept", "kernel shut down while suspended")
    assert json.loads(gpucr(store_dir, "--json", "ls").stdout) == []
    assert not (store_dir / "procs" / "kept").exists() and not ckpt.path.exists()
    [item] = json.loads(gpucr(store_dir, "--json", "trash", "ls").stdout)
    assert (item["id"], item["name"], item["reason"], item["engine"]) == (tid, "kept", "kernel shut down while suspended", "criu")
    assert item["size"] >= ckpt.size and item["checkpoints"] == [ckpt.id]
    assert tid in gpucr(store_dir, "trash", "ls").stdout
    assert_private(store_dir / "trash")

    out = gpucr(store_dir, "trash", "restore", tid).stdout
    assert "Restored 'kept'" in out and json.loads(gpucr(store_dir, "--json", "trash", "ls").stdout) == []
    running = cr.restore("kept")
    assert ask(hello["port"])["checksum"] == hello["checksum"], "the process came back from the trash with its state"
    assert running.record["restored_from"] == ckpt.id
    cr.remove("kept", kill=True)


def test_untrash_is_refused_while_that_name_runs(criu_path, store_dir):
    store = Store(store_dir)
    make_checkpoint(store, "k1")
    tid = store.trash("k1", "shutdown")
    cr = Checkpointer(store_dir)
    cr.run("k1", ["sleep", "60"])
    res = gpucr(store_dir, "trash", "restore", tid, check=False)
    assert res.returncode == 1 and "runs now" in res.stderr and "Shut that kernel down" in res.stderr
    cr.remove("k1", kill=True)
    assert store.untrash(tid) == "k1"
    assert (store.proc_dir("k1") / "stdout.log").read_text() == "output of the process\n"
    assert store.latest("k1") is not None


def test_a_running_process_is_not_trashed(criu_path, store_dir):
    cr = Checkpointer(store_dir)
    cr.run("busy", ["sleep", "60"])
    with pytest.raises(StateError, match="is running"):
        cr.store.trash("busy", "shutdown")
    cr.remove("busy", kill=True)


def test_trash_listing_expiry_purge_and_delete(store_dir):
    store = Store(store_dir)
    make_checkpoint(store, "nb", kernel={"kernel_id": "nb", "notebook_path": "work/analysis.ipynb", "kernel_name": "python3"})
    make_checkpoint(store, "other")
    t_nb = store.trash("nb", "restart")
    t_other = store.trash("other", "shutdown")
    items = {it["id"]: it for it in store.list_trash(max_age_s=3600)}
    assert items[t_nb]["notebook_path"] == "work/analysis.ipynb" and items[t_nb]["kernel_id"] == "nb"
    assert items[t_nb]["expires_at"] == pytest.approx(items[t_nb]["trashed_at"] + 3600)
    assert "work/analysis.ipynb" in gpucr(store_dir, "trash", "ls").stdout
    assert store.purge_trash(3600) == []
    gpucr(store_dir, "trash", "rm", t_other)
    assert [it["id"] for it in store.list_trash()] == [t_nb]
    assert store.purge_trash(0) == [t_nb]
    assert store.list_trash() == [] and not any((store_dir / "trash").iterdir())


def test_a_checkpoint_held_in_a_front_ends_trash_is_set_aside(store_dir):
    """The gpucr daemon's store, whose client's trash holds a manifest only: a checkpoint marked as held
    there is never the latest, retention leaves it (by count and by bytes), a copy of it is in no trash,
    and once put back it is one of the process's checkpoints again."""
    store = Store(store_dir)
    left = make_checkpoint(store, "k")
    store.set_in_trash(left, True)
    assert store.latest("k") is None
    now = make_checkpoint(store, "k")
    assert store.latest("k").id == now
    assert store.apply_retention("k", keep_last=1, max_bytes=0) == []
    copy = store.copy_checkpoint(left, "goback")
    assert "in_trash" not in copy.manifest
    store.delete(copy.id)
    store.set_in_trash(left, False)
    assert store.apply_retention("k", keep_last=1) == [left]


def test_broken_manifest_is_reported_and_its_images_kept(store_dir):
    store = Store(store_dir)
    good = make_checkpoint(store, "nb")
    time.sleep(1.1)  # ids carry the second they were made
    bad = make_checkpoint(store, "nb")
    manifest = store_dir / "checkpoints" / bad / "manifest.json"
    manifest.write_text('{"name": "nb", "created": ')
    with pytest.raises(CheckpointDamagedError) as err:
        store.latest("nb")
    assert str(manifest) in err.value.message and "kept" in err.value.hint and good in err.value.hint
    res = gpucr(store_dir, "restore", "nb", check=False)
    assert res.returncode == 1 and "is damaged" in res.stderr and "Traceback" not in res.stderr
    assert (store_dir / "checkpoints" / bad / "images" / "pages-1.img").exists()
    assert "damaged" in gpucr(store_dir, "ls").stdout

    manifest.write_text(json.dumps({"name": "nb", "created": time.time()}))
    with pytest.raises(CheckpointDamagedError, match="lacks engine, files"):
        store.get(bad)
    assert [c.id for c in store.list_checkpoints("nb")] == [good]
    store.delete(bad)
    assert store.latest("nb").id == good


def test_garbage_collection(store_dir):
    store = Store(store_dir)
    kept = make_checkpoint(store, "alive")
    orphan = make_checkpoint(store, "orphan")
    known = make_checkpoint(store, "known")
    store.remove_proc("orphan")
    store.remove_proc("known")
    _, unfinished = store.new_checkpoint_dir("alive")
    _, finished = store.new_checkpoint_dir("alive")
    (finished / INTENT).write_text(json.dumps({"name": "alive"}))
    (finished / "dump.log").write_text(f"(00.1) {DUMP_DONE}\n")
    leftover = store_dir / "checkpoints" / ".del-something"
    leftover.mkdir()

    done = store.collect_garbage(live_names={"known"})
    assert unfinished.name in done and not unfinished.exists() and not leftover.exists()
    assert finished.exists(), "a temporary directory recovery can complete is left to recovery"
    assert [c.id for c in store.list_checkpoints()] == sorted([kept, known])
    [trashed] = store.list_trash()
    assert trashed["name"] == "orphan" and trashed["checkpoints"] == [orphan] and "orphaned" in trashed["reason"]
    assert store.untrash(trashed["id"]) == "orphan"
    assert store.read_proc("orphan")["state"] == "checkpointed", "a record is written for checkpoints that had none"


@pytest.mark.parametrize("bad", ["name\n", "²", "١٢٣", "héllo", "a b"])
def test_names_outside_the_rule_are_refused_clearly(store_dir, bad):
    res = gpucr(store_dir, "checkpoint", bad, check=False)
    assert res.returncode == 1 and "Invalid name" in res.stderr and "Traceback" not in res.stderr


def test_the_intent_waits_for_no_disk_and_the_commit_makes_everything_durable(store_dir, monkeypatch):
    """The intent is written before the GPU is touched; an fsync there waited for the journal, i.e.
    for the disk to take the offloaded tensors (0.9 s in W2's disk suspend on the H200). The commit
    fsyncs every file and folder of the checkpoint, the intent with them."""
    store = Store(store_dir)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    cid, tmp = store.new_checkpoint_dir("durable")
    store.write_intent(tmp, {"name": "durable"})
    assert synced == []
    (tmp / "images" / "pages-1.img").write_bytes(os.urandom(4096))
    store.commit_checkpoint(cid, tmp, {"name": "durable", "created": time.time(), "engine": "criu",
                                       "files": digest_tree(tmp / "images"), "size": 4096})
    for path in [tmp / INTENT, tmp / "images" / "pages-1.img", tmp / "images", tmp, store.checkpoints_root]:
        assert str(path) in synced, f"{path} was not fsynced"
    assert any(Path(p).name.startswith(f".{MANIFEST}.") for p in synced)  # written aside, then renamed

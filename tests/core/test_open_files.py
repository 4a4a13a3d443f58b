"""The files a process holds open, restored on another node through object storage (moto's S3
server): its scratch files travel in the checkpoint and are back at their paths; a file on the
shared home that is missing or changed there refuses the restore, naming it, and the checkpoint
restores once the file is back."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from jupyter_gpucr.core.checkpointer import Checkpointer
from jupyter_gpucr.core.errors import IncompatibleCheckpointError, PreconditionError
from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from jupyter_gpucr.core.objectstore.transfer import download, kernels, upload
from jupyter_gpucr.core.storage.openfiles import OpenFiles
from jupyter_gpucr.core.storage.store import Store
from tests.conftest import agent_command, ask, wait_for_line
from tests.s3 import BUCKET, aws_env, environ, moto_server

pytestmark = pytest.mark.timeout(180)

SCRATCH_TEXT = "written in scratch before the checkpoint\n"
HOME_DATA = b"the user's data on the shared home\n" * 8


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as endpoint, environ(aws_env(endpoint)):
        yield endpoint


class Nodes:
    """A process on node A holding a scratch file (read-write) and a file on the shared home
    (mapped), suspended into the store; node A's disk and the scratch folder then gone."""

    def __init__(self, tmp_path: Path, prefix: str) -> None:
        self.home = tmp_path / "home"
        self.scratch = tmp_path / "scratch"  # below /tmp: no other node has it
        self.home.mkdir()
        self.scratch.mkdir()
        self.scratch_file, self.home_file = self.scratch / "scratch.txt", self.home / "data.bin"
        self.scratch_file.write_text(SCRATCH_TEXT)
        os.chmod(self.scratch_file, 0o640)
        self.home_file.write_bytes(HOME_DATA)
        self.policy = OpenFiles((str(self.home),))
        self.remote = ObjectStore(f"s3://{BUCKET}/{prefix}", user="alice")
        self.node_b = Store(tmp_path / "cache-b")
        node_a = Store(tmp_path / "cache-a")
        a = Checkpointer(node_a, open_files=self.policy)
        a.run("agent", agent_command("file_agent.py", "--hold", str(self.scratch_file), "--map", str(self.home_file)),
              cwd=str(self.home))
        self.port = wait_for_line(node_a.proc_dir("agent") / "stdout.log")["port"]
        self.stat = os.stat(self.scratch_file)
        self.ckpt = a.checkpoint("agent")
        upload(self.remote, node_a, self.ckpt)
        shutil.rmtree(tmp_path / "cache-a")
        shutil.rmtree(self.scratch)  # as on another node

    def restore_on_b(self) -> Checkpointer:
        b = Checkpointer(self.node_b, open_files=self.policy)
        if not (self.node_b.checkpoints_root / self.ckpt.id).is_dir():
            download(self.remote, self.node_b, kernels(self.remote)["agent"])
        b.restore("agent")
        return b


def test_scratch_files_travel_with_the_checkpoint(criu_path, s3, tmp_path):
    nodes = Nodes(tmp_path, "scratch")
    recorded = {f["path"]: f for f in nodes.ckpt.manifest["open_files"]["files"]}
    assert recorded[str(nodes.scratch_file)]["scratch"] and not recorded[str(nodes.home_file)]["scratch"]
    assert not any(p.startswith(str(tmp_path / "cache-a")) for p in recorded), "the process's own folder moves by itself"

    b = nodes.restore_on_b()
    try:
        seen = ask(nodes.port)
        assert seen["held"] == SCRATCH_TEXT, "through the descriptor it held"
        assert seen["held_by_path"] == SCRATCH_TEXT, "by its path"
        assert seen["mapped"] == HOME_DATA[:64].decode()
        back = os.stat(nodes.scratch_file)
        assert (back.st_mode, back.st_uid, back.st_mtime_ns) == (nodes.stat.st_mode, nodes.stat.st_uid,
                                                                   nodes.stat.st_mtime_ns)
    finally:
        b.remove("agent", kill=True)


def test_home_file_missing_or_changed_refuses_the_restore_until_it_is_back(criu_path, s3, tmp_path):
    nodes = Nodes(tmp_path, "home")
    nodes.home_file.write_bytes(HOME_DATA[:100])
    with pytest.raises(IncompatibleCheckpointError) as changed:
        nodes.restore_on_b()
    assert f"{nodes.home_file} changed: {len(HOME_DATA)} bytes at checkpoint, 100 now" in changed.value.message
    assert "c.GPUCR.shared_paths" in changed.value.hint and "The checkpoint is kept" in changed.value.hint
    assert not nodes.scratch_file.exists(), "a refused restore writes nothing"

    nodes.home_file.unlink()
    with pytest.raises(IncompatibleCheckpointError, match=f"{nodes.home_file} is missing on this node"):
        nodes.restore_on_b()

    nodes.home_file.write_bytes(HOME_DATA)
    nodes.scratch.mkdir()
    nodes.scratch_file.write_text("another file where the scratch file was\n")
    with pytest.raises(IncompatibleCheckpointError, match=f"{nodes.scratch_file} on this node is another file"):
        nodes.restore_on_b()
    assert nodes.scratch_file.read_text() == "another file where the scratch file was\n", "never overwritten"
    assert nodes.node_b.read_proc("agent")["state"] == "checkpointed"

    # the same bytes written at another time (the same software installed on this node) are taken as they are
    nodes.scratch_file.write_text(SCRATCH_TEXT)
    os.chmod(nodes.scratch_file, 0o640)
    b = nodes.restore_on_b()
    try:
        assert ask(nodes.port)["held"] == SCRATCH_TEXT
    finally:
        b.remove("agent", kill=True)


def test_too_many_scratch_bytes_leave_the_process_running(criu_path, tmp_path):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "big.bin").write_bytes(os.urandom(64 << 10))
    cp = Checkpointer(Store(tmp_path / "store"), open_files=OpenFiles((str(tmp_path / "home"),), max_bytes=16 << 10))
    cp.run("agent", agent_command("file_agent.py", "--hold", str(scratch / "big.bin")))
    port = wait_for_line(cp.store.proc_dir("agent") / "stdout.log")["port"]
    try:
        with pytest.raises(PreconditionError, match=f"{scratch / 'big.bin'}.*The process was left running"):
            cp.checkpoint("agent")
        assert ask(port)["held"] is not None
        assert cp.store.checkpoint_ids("agent") == []
    finally:
        cp.remove("agent", kill=True)

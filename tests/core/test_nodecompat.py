"""A whole-process checkpoint restored on a node whose CPU lacks features the checkpoint's node had
is refused before anything starts, naming the features (CRIU's cpuinfo check decides).

There is no second machine here: the other node is the one fake, a checkpoint whose kept cpuinfo
image says its CPU had one more instruction feature than this one, and whose manifest says it
was made in another boot under another kernel release."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from jupyter_gpucr.core.checkpointer import Checkpointer
from jupyter_gpucr.core.criu import nodecompat
from jupyter_gpucr.core.errors import IncompatibleCheckpointError
from jupyter_gpucr.core.storage.store import Store
from tests.conftest import agent_command, ask, wait_for_line
from tests.cpuinfo import missing_here, node_image, with_feature

pytestmark = pytest.mark.timeout(120)


def test_feature_names_are_the_kernels(criu_path, tmp_path):
    """The names given to CRIU's bits are the ones /proc/cpuinfo shows for this CPU (osxsave, a
    state bit, is not listed by the kernel)."""
    here = nodecompat.read_cpuinfo(node_image(criu_path, tmp_path))
    assert here is not None and here.model
    flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")).split(":", 1)[1].split())
    known = {name for bits in nodecompat.INSTRUCTION_FEATURES.values() for name in bits.values()}
    assert here.features() - {"osxsave"} == flags & known


def test_checkpoint_from_a_richer_cpu_is_refused_naming_what_differs(criu_path, tmp_path, monkeypatch):
    monkeypatch.setenv("AGENT_FILE", str(tmp_path / "counts"))
    store = Store(tmp_path / "store")
    cr = Checkpointer(store)
    cr.run("agent", agent_command("cpu_agent.py", "4"))
    hello = wait_for_line(store.proc_dir("agent") / "stdout.log")
    try:
        ckpt = cr.checkpoint("agent")
        assert ckpt.manifest["host"]["cpu"] and (ckpt.path / nodecompat.CPUINFO).is_file()
        word, bit, name = missing_here(criu_path, tmp_path)
        image = ckpt.path / nodecompat.CPUINFO
        real = image.read_bytes()
        image.write_bytes(with_feature(real, word, bit))
        manifest = json.loads((ckpt.path / "manifest.json").read_text())
        manifest["host"].update(boot_id="another-node", kernel="5.4.0-other")
        (ckpt.path / "manifest.json").write_text(json.dumps(manifest))

        with pytest.raises(IncompatibleCheckpointError) as refused:
            cr.restore("agent")
        message = refused.value.message
        assert f"this node's CPU ({nodecompat.read_cpuinfo(image).model}) lacks {name}, which the checkpoint's node" \
               in message, message
        assert "ran Linux 5.4.0-other" in message and "portable_fallback" in refused.value.hint
        assert cr.status("agent")["state"] == "checkpointed" and ckpt.path.is_dir(), "nothing started, the checkpoint is kept"

        image.write_bytes(real)  # the node it was made on (its CPU) takes it back
        cr.restore("agent")
        assert ask(hello["port"])["checksum"] == hello["checksum"]
    finally:
        cr.remove("agent", kill=True)

"""Both checkpoint backends call ``before_dump`` at the same point: once the GPU is free (the
driver's checkpoint, announced by the "gpu-checkpoint" phase) and before CRIU freezes the process
(the "dumping" phase); the Jupyter server closes its connections to the kernel there. A failing
``before_dump`` leaves the process running, with no checkpoint. The local ``Checkpointer`` runs as
root here; the ``DaemonCheckpointer`` as an ordinary user against a real daemon.
"""
from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from jupyter_gpucr.core.checkpointer import Checkpointer
from tests import hub as H
from tests.conftest import criu_or_skip

pytestmark = pytest.mark.timeout(180)
USER = "gpucrbd"
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]

# Run by the backend under test: the phases and before_dump in the order they came, the process's
# state when before_dump ran, the manifest's timings; then two checkpoints whose before_dump fails.
SCENARIO = """
import json, sys, psutil
from jupyter_gpucr.core.errors import GPUCRError, StateError

def scenario(cr, command):
    events = []
    def progress(phase, done, total):
        if not events or events[-1] != phase:
            events.append(phase)
    running = cr.run("sleeper", command)
    def before_dump():
        events.append("before_dump")
        events.append("process " + psutil.Process(running.pid).status())
    ckpt = cr.checkpoint("sleeper", progress=progress, before_dump=before_dump)
    out = {"events": events, "timings": ckpt.manifest["timings"], "failures": []}
    cr.restore("sleeper")
    for fail in (StateError("The server still talks to the kernel."), RuntimeError("connections stuck")):
        def refuse(fail=fail):
            raise fail
        try:
            cr.checkpoint("sleeper", before_dump=refuse)
            out["failures"].append({"raised": None})
        except (GPUCRError, RuntimeError) as e:
            rec = cr.store.read_proc("sleeper")
            out["failures"].append({"raised": type(e).__name__, "message": getattr(e, "message", str(e)),
                                    "state": rec["state"], "alive": psutil.pid_exists(rec["pid"]),
                                    "status": psutil.Process(rec["pid"]).status(),
                                    "checkpoints": len(cr.store.checkpoint_ids("sleeper"))})
    cr.remove("sleeper", kill=True)
    return out
"""


def check(out: dict[str, Any]) -> None:
    events = out["events"]
    assert events[:4] == ["gpu-checkpoint", "before_dump", "process sleeping", "dumping"], events
    assert "before_dump" in out["timings"]
    stated, plain = out["failures"]
    assert stated["raised"] == "StateError"
    assert stated["message"] == "The server still talks to the kernel. The process was left running."
    assert plain["raised"] == "RuntimeError" and plain["message"] == "connections stuck"
    for failure in (stated, plain):  # running on, not left frozen, and no checkpoint was kept
        assert failure["state"] == "running" and failure["alive"] and failure["status"] != psutil.STATUS_STOPPED
        assert failure["checkpoints"] == 1  # the first, good one only


def test_the_local_checkpointer_frees_the_gpu_before_before_dump_and_dumps_after_it(store_dir: Path) -> None:
    criu_or_skip()
    scope: dict[str, Any] = {}
    exec(SCENARIO, scope)
    check(scope["scenario"](Checkpointer(store_dir), SLEEPER))


@pytest.fixture(scope="module")
def daemon() -> Iterator[H.Daemon]:
    if os.geteuid() != 0 or not all(shutil.which(tool) for tool in ("useradd", "runuser", "unshare")):
        pytest.skip("the daemon runs as root and the test creates a Unix user (useradd, runuser, unshare)")
    criu_or_skip()
    with H.daemon_for([USER], 'gpucr-before-dump-') as d:
        yield d


def test_the_daemon_asks_for_before_dump_once_the_gpu_is_free_and_dumps_after_it(daemon: H.Daemon) -> None:
    code = SCENARIO + f"""
from jupyter_gpucr.daemon.client import DaemonCheckpointer
import os, tempfile
store = tempfile.mkdtemp(prefix="store-", dir=os.path.expanduser("~"))
print(json.dumps(scenario(DaemonCheckpointer(store, {str(daemon.socket)!r}), {SLEEPER!r})))
"""
    check(H.as_user(USER, code, timeout=150))

"""`gpucr rm --kill NAME` while a checkpoint of that process is under way (as a waker's idle checkpoint
is) waits for it, then removes everything, instead of failing "busy"; a wait that runs out says so.
A real process and real CRIU: the checkpoint is held at its before-dump step while the remove starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.errors import BusyError
from jupyter_gpucr.core.storage.locks import exclusive
from tests.conftest import gone
from tests.core.test_core import start_agent

pytestmark = pytest.mark.timeout(120)


def test_rm_kill_waits_for_the_checkpoint_under_way(criu_path, store_dir, tmp_path):
    start_agent(store_dir, "napping", tmp_path, mb=10)
    cr = Checkpointer(store_dir)
    pid = cr.store.read_proc("napping")["pid"]
    dumping, go_on = threading.Event(), threading.Event()

    def held() -> None:
        dumping.set()
        assert go_on.wait(30)

    with ThreadPoolExecutor(1) as pool:
        ckpt = pool.submit(cr.checkpoint, "napping", reason="idle", before_dump=held)
        assert dumping.wait(30), ckpt.exception(0) if ckpt.done() else "the checkpoint never reached its dump"
        rm = subprocess.Popen([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store_dir), "--json", "rm",
                               "--kill", "napping"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.0)
        assert rm.poll() is None, f"rm did not wait for the checkpoint: {rm.communicate()}"
        go_on.set()
        made = ckpt.result(60)
        out, err = rm.communicate(timeout=60)
    assert rm.returncode == 0, out + err
    assert json.loads(out)["removed"] == [made.id]
    assert gone(pid)
    assert not cr.store.has_proc("napping") and not (store_dir / "checkpoints" / made.id).exists()


def test_a_remove_that_waited_too_long_says_so(criu_path, store_dir, tmp_path):
    start_agent(store_dir, "stuck", tmp_path, mb=10)
    cr = Checkpointer(store_dir)
    t0 = time.monotonic()
    with exclusive(cr.store.proc_dir("stuck"), "stuck", "checkpoint"), pytest.raises(BusyError) as e:
        cr.remove("stuck", kill=True, wait_s=0.5)
    assert time.monotonic() - t0 >= 0.5
    assert e.value.message == f"'stuck' is busy: checkpoint (pid {os.getpid()}) is in progress (waited 0.5 s).", e.value
    assert "logs" in e.value.hint
    cr.remove("stuck", kill=True)
    assert not cr.store.has_proc("stuck")

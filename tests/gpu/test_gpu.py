"""GPU round trips with the real driver checkpoint API. No GPU in CI: these run on the H200
machine (see docs/dev/gpu-tests.md for the recorded runs) and skip elsewhere."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from jupyter_gpucr import Checkpointer
from jupyter_gpucr.core.gpu import cuda, gpus
from tests.conftest import agent_command, ask, criu_or_skip, wait_for_line

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]


@pytest.fixture(scope="module", autouse=True)
def need_gpu():
    if not gpus.list_gpus() or cuda.unavailable_reason():
        pytest.skip(f"needs an NVIDIA GPU with the CUDA checkpoint API: {cuda.unavailable_reason() or 'no GPU'}")
    criu_or_skip()


def gpu_pids(index: int) -> dict[int, int]:
    return [g for g in gpus.list_gpus() if g.index == index][0].processes


def start(cr: Checkpointer, name: str, gib: float = 2.0, env: dict | None = None) -> dict:
    import os

    cr.run(name, agent_command("gpu_agent.py", str(gib)), env={**os.environ, **(env or {})})
    return wait_for_line(cr.store.proc_dir(name) / "stdout.log", timeout=180)


def test_gpu_checkpoint_frees_gpu_and_restores(store_dir):
    cr = Checkpointer(store_dir)
    hello = start(cr, "gpu0", env={"CUDA_VISIBLE_DEVICES": "0"})
    before = ask(hello["port"])
    pid = cr.status("gpu0")["pid"]
    assert pid in gpu_pids(0), "the agent must hold memory on GPU 0"
    used_before = gpu_pids(0)[pid]

    ckpt = cr.checkpoint("gpu0")
    assert pid not in gpu_pids(0), "after the checkpoint NVML must show no memory for the process"
    assert ckpt.manifest["gpu"]["used"][0]["memory_used"] == used_before
    assert ckpt.manifest["timings"]["gpu_free"] < ckpt.manifest["timings"]["total"]

    running = cr.restore("gpu0", gpu="0")
    assert "page_fill_behind" in running.timings, "the driver's restore must overlap the page fill"
    after = ask(hello["port"])
    assert after["checksum"] == before["checksum"]
    time.sleep(1)
    later = ask(hello["port"])
    assert later["counter"] > after["counter"] and later["work"] > after["work"], "it keeps computing on the GPU"
    assert running.pid in gpu_pids(0)
    cr.remove("gpu0", kill=True)


def test_gpu_process_that_forks_while_its_memory_is_filled_is_restored_again(store_dir):
    """A GPU process runs while its memory is filled (the driver's restore needs it running); one
    that forks meanwhile is restored a second time, stopped until its memory is in, and then runs
    and forks on as before."""
    cr = Checkpointer(store_dir)
    hello = start(cr, "gpufork", gib=1.0, env={"CUDA_VISIBLE_DEVICES": "0", "GPU_AGENT_FORKS": "1"})
    before = ask(hello["port"])
    ckpt = cr.checkpoint("gpufork")
    running = cr.restore("gpufork", gpu="0")
    log = (ckpt.path / "lazy-pages.log").read_text()
    assert running.timings.get("first_attempt", 0) > 0 and "a fork or mremap" in log, log
    after = ask(hello["port"])
    assert after["checksum"] == before["checksum"]
    time.sleep(1)
    assert ask(hello["port"])["counter"] > after["counter"], "it keeps computing on the GPU"
    assert running.pid in gpu_pids(0)
    cr.remove("gpufork", kill=True)


def test_gpu_restore_onto_other_gpu(store_dir):
    if len(gpus.list_gpus()) < 2:
        pytest.skip("needs two GPUs")
    cr = Checkpointer(store_dir)
    hello = start(cr, "gpumove", env={"CUDA_VISIBLE_DEVICES": "0"})
    before = ask(hello["port"])
    cr.checkpoint("gpumove")
    running = cr.restore("gpumove", gpu="1")
    assert running.pid in gpu_pids(1) and running.pid not in gpu_pids(0)
    after = ask(hello["port"])
    assert after["checksum"] == before["checksum"]
    time.sleep(1)
    assert ask(hello["port"])["counter"] > after["counter"]
    cr.remove("gpumove", kill=True)


def test_gpu_cli_json(store_dir):
    cr = Checkpointer(store_dir)
    hello = start(cr, "gpucli", gib=0.5)
    out = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store_dir), "--json",
                          "checkpoint", "gpucli"], capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    assert data["gpus"] and data["gpu_model"].startswith("NVIDIA")
    out = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store_dir), "--json",
                          "restore", "gpucli", "--gpu", "auto"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out)["gpu_map"]
    assert ask(hello["port"])["checksum"] == hello["checksum"]
    cr.remove("gpucli", kill=True)

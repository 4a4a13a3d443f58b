"""A GPU kernel the snapshot engine suspended, opened again: the process started ahead of its restore
creates its CUDA context before the restore and holds no other GPU memory (counted as that kernel's
on the GPU), and the restore reads the tensors ahead into it, bit for bit. Runs on the H200 machine
(docs/dev/gpu-tests.md); skips without a GPU."""
from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from jupyter_gpucr.core.gpu import gpus
from jupyter_gpucr.server.provisioner import GPUCRProvisioner
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, new_session, open_ws
from tests.server.test_server_lifecycle import wait_state
from tests.server.test_snapshot_warm_start import until_warm

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

GiB = 1 << 30
STATE = ("import torch\ntorch.manual_seed(0)\n"
         "x = torch.randn(1 << 28, device='cuda:0')\n"  # 1 GiB
         "y = torch.arange(1000, device='cuda:0')[::3]")
CHECK = """(lambda hashlib, json: print(json.dumps({"device": str(x.device), "y_device": str(y.device),
    "x": hashlib.sha256(x.view(torch.uint8).cpu().numpy().tobytes()).hexdigest(), "y": y.tolist()})))(
    __import__("hashlib"), __import__("json"))"""


@pytest.fixture
def jp_server_config(tmp_path):
    try:
        import torch
        usable = bool(gpus.list_gpus()) and torch.cuda.is_available()
    except ImportError:
        usable = False
    if not usable:
        pytest.skip("needs an NVIDIA GPU and PyTorch with CUDA")
    return {"ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
            "GPUCR": {"store": str(tmp_path / "gpucr-store"), "engine": "snapshot"}}


#: What the process started ahead does on the GPU before the restore: a context and cuBLAS ready.
CONTEXT_ONLY = ("import sys, torch\ntorch.empty(1, device='cuda:0').zero_()\n"
                "for t in (torch.bfloat16, torch.float32):\n    a = torch.ones(64, 64, device='cuda:0', dtype=t); a @ a\n"
                "torch.cuda.synchronize(); torch.cuda.empty_cache(); print('ready', flush=True); sys.stdin.read()\n")


async def context_bytes() -> int:
    """What NVML lists for a bare PyTorch process holding a context and cuBLAS on GPU 0 (this
    driver's and this PyTorch's size of "a context only")."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", CONTEXT_ONLY, stdin=asyncio.subprocess.PIPE,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        assert proc.stdout is not None and (await proc.stdout.readline()).strip() == b"ready"
        return await until_on_gpu(proc.pid)
    finally:
        proc.kill()
        await proc.wait()


async def until_on_gpu(pid: int, timeout: float = 120) -> int:
    """Bytes NVML lists for ``pid`` on GPU 0, once it is there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = gpus.list_gpus()[0].processes.get(pid)
        if held:
            return held
        await asyncio.sleep(0.2)
    raise AssertionError(f"process {pid} has no CUDA context on GPU 0 after {timeout:.0f} s")


async def test_the_process_started_ahead_holds_a_context_only_and_loads_the_tensors_bit_for_bit(
        jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "gpu-warm.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, STATE)
    _, before, _ = await execute(ws, CHECK)
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert st["engine"] == "snapshot"
    ws.close()

    ws = await open_ws(jp_ws_fetch, kid, "opened")
    warm = await until_warm(kid, imported=False)
    held = await until_on_gpu(warm.pid)
    await asyncio.sleep(2)  # the staging buffers are host memory: nothing more on the GPU
    held = gpus.list_gpus()[0].processes.get(warm.pid, 0)
    bare = await context_bytes()
    assert 0 < held <= bare + (64 << 20), f"the warm process holds {held >> 20} MiB on GPU 0, a bare context {bare >> 20} MiB"
    if isinstance(jp_serverapp.kernel_manager.get_kernel(kid).provisioner, GPUCRProvisioner):
        room = {r["where"]: r for r in await fetch_json(jp_fetch, "api", "gpucr", "room")}["GPU 0"]
        assert {k["kernel_id"]: k["bytes"] for k in room["kernels"]}.get(kid) == held, room

    _, after, _ = await execute(ws, CHECK)
    assert json.loads(after) == json.loads(before) and json.loads(after)["device"] == "cuda:0"
    timings = (await wait_state(jp_fetch, kid, "running"))["timings"]
    assert timings["warm_start"] is True and timings["in_kernel_storage_bytes"] >= GiB, timings
    ws.close()

"""Forking a kernel that holds a model on the GPU, through the real server: each copy holds the
model on cuda:0 and generates the same tokens as its source, NVML lists three processes, and the
source runs on, its tensors back on the GPU. Runs on the H200 machine (docs/dev/gpu-tests.md); skips without a GPU."""
from __future__ import annotations

import time
from functools import partial

import pytest

from jupyter_gpucr.core.gpu import gpus
from tests.server.test_server import fetch_json, jp_server_config, kernel_pid, new_session, open_ws, run_cell  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("need_gpu")]

# A tiny GPT-like model (embedding, two attention-free blocks, a head) with fixed weights; greedy
# decoding of 24 tokens: the argmax of each step feeds the next.
MODEL = """
import torch
torch.manual_seed(0)
V, D = 512, 256
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(V, D)
        self.blocks = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.LayerNorm(D), torch.nn.Linear(D, 4 * D),
                                                              torch.nn.GELU(), torch.nn.Linear(4 * D, D)) for _ in range(2))
        self.head = torch.nn.Linear(D, V)
    def forward(self, ids):
        h = self.emb(ids).cumsum(1) / torch.arange(1, ids.shape[1] + 1, device=ids.device)[:, None]
        for b in self.blocks:
            h = h + b(h)
        return self.head(h)
model = Tiny().to("cuda:0").eval()
ballast = torch.ones(1 << 28, device="cuda:0")  # 1 GiB beside the model, so the copies are seen
@torch.no_grad()
def generate(n=24):
    ids = torch.tensor([[1, 2, 3]], device="cuda:0")
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids[0, 3:].tolist()
print(generate())
"""
SHOW = "print(generate(), next(model.parameters()).device, float(ballast.sum()))"
# nothing left off the GPU (gpucr_hooks.offload's own record of what it moved out), the ballast on it
ON_GPU = "import gpucr_hooks.offload as o; print(len(o._offloaded), o._folder, torch.cuda.memory_allocated(0) >= 1 << 30)"


_run = partial(run_cell, timeout=300)


@pytest.mark.parametrize("jp_server_config", [{}, {"offload_gpu_tensors": False}], indirect=True,
                         ids=["tensors-moved-out", "driver-checkpoint"])
async def test_fork_a_gpu_kernel_into_two(jp_fetch, jp_ws_fetch, jp_serverapp):
    """By default the source's tensors leave the GPU for its checkpoint and come back, as in a
    suspend; with ``offload_gpu_tensors`` off the driver's checkpoint copies them."""
    kid = (await new_session(jp_fetch, "gpu-src.ipynb"))["kernel"]["id"]
    tokens = await _run(jp_ws_fetch, kid, MODEL)
    shown = await _run(jp_ws_fetch, kid, SHOW)
    assert shown.startswith(tokens) and "cuda:0" in shown, shown

    t0 = time.perf_counter()
    made = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "fork", method="POST", body={"count": 2, "gpu": "auto"})
    forked_in = time.perf_counter() - t0
    paused = made["source"]
    if jp_serverapp.kernel_manager.runtime.options.offload_gpu_tensors:
        assert paused["offload"]["bytes"] >= 1 << 30 and paused["reload"]["bytes"] == paused["offload"]["bytes"], paused
    else:
        assert "offload" not in paused and paused["reload"] is None, paused
    forks = [k["id"] for k in made["kernels"]]
    pids = [kernel_pid(jp_serverapp, k) for k in (kid, *forks)]
    assert len(set(pids)) == 3
    on_gpu = {p for g in gpus.list_gpus() for p in g.processes}
    assert set(pids) <= on_gpu, f"NVML lists {sorted(on_gpu)}; the source and its forks are {pids}"

    for k in (*forks, kid):  # each copy generates what its source generates; the source runs on
        assert await _run(jp_ws_fetch, k, SHOW) == shown
        assert await _run(jp_ws_fetch, k, ON_GPU) == "0 None True"  # every tensor back on the GPU
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"
    print(f"\nforked a GPU kernel into 2 in {forked_in:.2f} s, the source paused {paused['paused_s']:.2f} s")


async def test_fork_a_suspended_gpu_kernel(jp_fetch, jp_ws_fetch, jp_serverapp):
    """A suspended GPU kernel moved its tensors out beside its image; a fork of it takes them back
    from links of its own, so the source's resume still finds them."""
    kid = (await new_session(jp_fetch, "gpu-on-disk.ipynb"))["kernel"]["id"]
    await _run(jp_ws_fetch, kid, MODEL)
    shown = await _run(jp_ws_fetch, kid, SHOW)
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert st["trim"]["offload"]["bytes"] >= 1 << 30, st["trim"]
    made = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "fork", method="POST", body={})
    (fork,) = [k["id"] for k in made["kernels"]]
    assert await _run(jp_ws_fetch, fork, SHOW) == shown
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"
    assert await _run(jp_ws_fetch, kid, SHOW) == shown  # resumed, with its own tensors

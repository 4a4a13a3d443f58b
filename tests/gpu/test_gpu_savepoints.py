"""Save points of a kernel with tensors on the GPU, through the real server: a tensor unchanged
since the last save point is not written again (its file is linked: the same inode in both save
points' folders; a suspend links it too), a changed one is; going back to either save point brings every tensor's values
back on cuda:0 under the same kernel id. Runs on the GPU machine (docs/dev/gpu-tests.md); skips
without a GPU."""
from __future__ import annotations

import os
from functools import partial

import pytest

from jupyter_gpucr.server.preparation import SAVEPOINT_TENSORS
from tests.server.test_server import fetch_json, jp_server_config, new_session, open_ws, run_cell  # noqa: F401

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600), pytest.mark.usefixtures("need_gpu")]

SETUP = """
import torch
weights = torch.arange(1 << 28, dtype=torch.float32, device="cuda:0")  # 1 GiB, never changed
cache = torch.zeros(1 << 26, dtype=torch.float32, device="cuda:0")    # 256 MiB, changed between save points
"""
SHOW = "print(int(weights[-1].item()), float(cache.sum()), cache.device, weights.device)"


_run = partial(run_cell, timeout=300)


def _api(kid, *rest):
    return ("api", "gpucr", "kernels", kid, "savepoints", *rest)


def _inodes(jp_serverapp, kid, sp_id):
    folder = jp_serverapp.kernel_manager.runtime.store.proc_dir(kid) / SAVEPOINT_TENSORS / sp_id
    return {os.stat(folder / n).st_ino: os.path.getsize(folder / n) for n in os.listdir(folder)}


async def test_unchanged_gpu_tensors_are_linked_not_written_again(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "gpu-savepoints.ipynb"))["kernel"]["id"]
    await _run(jp_ws_fetch, kid, SETUP)
    at_first = await _run(jp_ws_fetch, kid, SHOW)
    first = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "before"})
    moved = first["pause"]["offload"]
    assert moved["bytes"] >= (1 << 30) + (1 << 28) and moved["linked"] == 0, moved

    await _run(jp_ws_fetch, kid, "cache += 1")
    at_second = await _run(jp_ws_fetch, kid, SHOW)
    assert at_second != at_first
    second = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "after"})
    moved = second["pause"]["offload"]
    assert moved["linked"] == 1 << 30, moved  # the weights by reference, the cache written
    shared = _inodes(jp_serverapp, kid, first["id"]).keys() & _inodes(jp_serverapp, kid, second["id"]).keys()
    assert sum(_inodes(jp_serverapp, kid, first["id"])[i] for i in shared) >= 1 << 30
    listed = {s["id"]: s["size"] for s in await fetch_json(jp_fetch, *_api(kid))}
    assert listed[first["id"]] < 1 << 30 <= listed[second["id"]], listed  # shared bytes count with the newest

    await _run(jp_ws_fetch, kid, "cache += 1; weights[-1] = 7")
    await fetch_json(jp_fetch, *_api(kid, first["id"], "restore"), method="POST", body={})
    assert await _run(jp_ws_fetch, kid, SHOW) == at_first
    await fetch_json(jp_fetch, *_api(kid, second["id"], "restore"), method="POST", body={})
    assert await _run(jp_ws_fetch, kid, SHOW) == at_second
    # a save point after going back links from the save point the kernel came back from
    third = await fetch_json(jp_fetch, *_api(kid), method="POST", body={})
    assert third["pause"]["offload"]["linked"] >= (1 << 30) + (1 << 28), third["pause"]["offload"]
    assert await _run(jp_ws_fetch, kid, SHOW) == at_second
    # a suspend links them too, and the resume brings them back
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert st["trim"]["offload"]["linked"] >= (1 << 30) + (1 << 28), st["trim"]
    assert await _run(jp_ws_fetch, kid, SHOW) == at_second

"""Forking a kernel through the server: a real jupyter server, real ipykernels, real CRIU.
What a user checks: each copy holds the source's variables, goes its own way, and the source
runs on unchanged."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import time

import psutil
import pytest
from tornado.httpclient import HTTPClientError

from tests.kernel_ws import collect, request, saved_history, send
from tests.server.test_server import fetch_json, jp_server_config, kernel_pid, new_session, open_ws, run_cell  # noqa: F401

pytestmark = pytest.mark.timeout(240)

STATE = """
x = 42
import numpy as np, os, torch
a = np.arange(2_000_000, dtype=np.int64)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
inp = torch.randn(8, 64)
rng = np.random.default_rng(7)
log = open('written.txt', 'a')
log.write('source\\n'); log.flush()
"""
SHOW = "print(x, int(a.sum()), round(model(inp).sum().item(), 6), rng.random(), torch.rand(1).item())"


def _pid_ns(pid):
    return os.readlink(f"/proc/{pid}/ns/pid")


async def test_fork_a_running_kernel_into_two(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "src.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, STATE)
    source_pid = kernel_pid(jp_serverapp, kid)

    # The source is paused as a suspend pauses it: a cell sent meanwhile waits in the server, and
    # the source answers it once it runs on, before its copies are restored
    ws = await open_ws(jp_ws_fetch, kid, "during-fork")
    forking = asyncio.ensure_future(fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "fork", method="POST",
                                               body={"count": 2, "gpu": "auto"}))
    await asyncio.sleep(0.3)
    cell = request("print(x * 2)")
    await send(ws, cell)
    reply, out, _ = await collect(ws, cell["header"]["msg_id"])
    assert not forking.done(), "the source answered only once its copies were made"
    made = await forking
    ws.close()
    assert reply["content"]["status"] == "ok" and out.strip() == "84", out
    paused = made["source"]
    assert 0 < paused["paused_s"] < 60 and paused["offload"]["bytes"] == 0, paused  # nothing on a GPU to move
    forks = [k["id"] for k in made["kernels"]]
    assert len(set(forks)) == 2 and kid not in forks
    # nothing of the fork is left beside the source: its checkpoint is useless without the
    # tensors a GPU kernel moved out for it, so both are gone (deleted behind the reply)
    store = jp_serverapp.kernel_manager.runtime.store

    def leftovers() -> list[str]:
        return [c.id for c in store.list_checkpoints(kid) if c.manifest.get("reason") == "fork"] + \
            sorted({"gpu-tensors", "fork-tensors"} & {p.name for p in store.proc_dir(kid).iterdir()})
    deadline = time.monotonic() + 10
    while leftovers() and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert not leftovers()
    listed = [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    assert set(forks) <= set(listed) and kid in listed
    km = jp_serverapp.kernel_manager
    ports = [tuple(km.get_kernel(k).ports) for k in (kid, *forks)]
    assert len({p for ps in ports for p in ps}) == 15, ports  # every kernel its own five ports
    files = [km.get_kernel(k).connection_file for k in (kid, *forks)]
    assert len(set(files)) == 3 and all(json.load(open(f))["shell_port"] == km.get_kernel(k).ports[0]
                                        for f, k in zip(files, (kid, *forks)))
    pids = [kernel_pid(jp_serverapp, k) for k in (kid, *forks)]
    assert pids[0] == source_pid and len(set(pids)) == 3
    assert len({_pid_ns(p) for p in pids}) == 3  # each its own PID namespace

    await run_cell(jp_ws_fetch, forks[0], "x = 0\nlog.write('fork one\\n'); log.flush()")
    shown = [await run_cell(jp_ws_fetch, k, SHOW) for k in (kid, forks[1])]
    # the same x, array, model output and next random number (RNG state copied), in copy 2 and the source
    assert shown[0] == shown[1] and shown[0].startswith("42 1999999000000 "), shown
    assert (await run_cell(jp_ws_fetch, forks[0], "print(x)")) == "0"
    # a fork that reseeds draws its own numbers (the hook frameworks call for diverging forks)
    draw = "print(torch.rand(1).item())"
    reseeded = await run_cell(jp_ws_fetch, forks[0], f"import gpucr_hooks; gpucr_hooks.reseed(); {draw}")
    assert reseeded != await run_cell(jp_ws_fetch, kid, draw)
    # the file the source had open for writing: the fork writes to a copy of its own
    source_file = await run_cell(jp_ws_fetch, kid, "print(os.path.realpath(log.name))")
    fork_file = await run_cell(jp_ws_fetch, forks[0], "print(os.path.realpath('/proc/self/fd/%d' % log.fileno()))")
    assert fork_file != source_file
    assert "fork one" not in open(source_file).read() and "fork one" in open(fork_file).read()
    # each keeps its own history: the fork's cells in its database, not in the source's, and
    # through its own path (SQLite puts its journal beside the path it opened)
    own = await run_cell(jp_ws_fetch, forks[0], "print(get_ipython().history_manager.hist_file)")
    assert own == str(store.proc_dir(forks[0]) / "history.sqlite")
    fork_cell = "print(x)"
    assert fork_cell in await saved_history(store.proc_dir(forks[0]) / "history.sqlite", fork_cell)
    assert draw in await saved_history(store.proc_dir(kid) / "history.sqlite", draw)
    assert fork_cell not in await saved_history(store.proc_dir(kid) / "history.sqlite", fork_cell, timeout=0)
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"


async def test_fork_a_suspended_kernel(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "on-disk.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, "x = 'kept'")
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    made = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "fork", method="POST", body={})
    (fork,) = [k["id"] for k in made["kernels"]]
    assert await run_cell(jp_ws_fetch, fork, "print(x)") == "kept"
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"


async def test_a_fork_that_fails_leaves_the_source_running(jp_fetch, jp_ws_fetch, jp_serverapp):
    """A port bound to a host address (not loopback) cannot be restored in a copy's namespace."""
    host = next((a.address for name, addrs in psutil.net_if_addrs().items() if name != "lo"
                 for a in addrs if a.family == socket.AF_INET), None)
    if host is None:
        pytest.skip("needs an IPv4 address besides loopback")
    kid = (await new_session(jp_fetch, "bound.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, f"x = 'kept'\nimport socket\nsrv = socket.socket()\nsrv.bind(({host!r}, 0))\nsrv.listen()")
    before = {k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")}
    with pytest.raises(HTTPClientError) as failed:
        await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "fork", method="POST", body={"count": 2})
    error = json.loads(failed.value.response.body)
    assert "could not be made" in error["message"] and "Cannot assign requested address" in error["message"], error
    assert "No copy was made" in error["hint"], error
    store = jp_serverapp.kernel_manager.runtime.store
    log = store.proc_dir(kid) / "fork-failed.log"  # the copy's folder is gone; CRIU's log of it is kept
    assert str(log) in error["hint"] and "Cannot assign requested address" in log.read_text(), error
    assert await run_cell(jp_ws_fetch, kid, "print(x)") == "kept"
    assert {k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")} == before
    assert not store.list_checkpoints(kid)
    assert "fork-tensors" not in {p.name for p in store.proc_dir(kid).iterdir()}

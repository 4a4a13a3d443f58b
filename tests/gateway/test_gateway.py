"""Kernel Gateway with gpucr (``--KernelGatewayApp.api=jupyter_gpucr.gateway``), a real
``jupyter kernelgateway`` process: what the server extension gives a jupyter server."""
from __future__ import annotations

import asyncio
import json
import re
import time

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.server.routes import routes
from tests.agent_servers import Served, kernel_processes, kill_leftovers
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute

SLOW_RELIST = """
import asyncio
from jupyter_gpucr.server.service import KernelSuspender
_relist = KernelSuspender.relist_at_start
async def _slow_relist(self):
    await asyncio.sleep(3)
    await _relist(self)
KernelSuspender.relist_at_start = _slow_relist
"""


@pytest.fixture
def root(tmp_path):
    criu_or_skip()
    yield tmp_path / "root"
    kill_leftovers(tmp_path)


async def test_rest_suspend_restore_and_idle_suspend_with_a_client_connected(root, tmp_path):
    gw = Served("gateway", root, tmp_path / "store", "--JupyterWebsocketPersonality.list_kernels=True",
                "--GPUCR.idle_timeout=2", "--GPUCR.idle_check_interval=1", "--GPUCR.suspend_connected=True")
    try:
        await gw.wait_ready()
        kid = await gw.start_kernel()
        ws = await gw.ws(kid)
        _, out, _ = await execute(ws, "import os; x = 41; print(os.environ.get('KERNEL_GATEWAY'))")
        assert out.strip() == "1"  # launched the way Kernel Gateway launches kernels

        await gw.suspend(kid)
        assert kernel_processes(kid) == []
        listed = await gw.request("api/kernels")  # Kernel Gateway's own listing, with gpucr's state
        assert [(k["id"], k["gpucr"]["state"]) for k in listed] == [(kid, "suspended")]
        reply, out, _ = await execute(ws, "x += 1; print(x)")
        assert (reply["content"]["status"], out.strip()) == ("ok", "42")
        assert await gw.state(kid) == "running" and kernel_processes(kid)

        await gw.wait_state(kid, "suspended", timeout=30)  # idle, the websocket still open
        assert kernel_processes(kid) == []
        reply, out, _ = await execute(ws, "x += 1; print(x)")
        assert (reply["content"]["status"], out.strip()) == ("ok", "43")
        assert [k["kernel_id"] for k in await gw.request("api/gpucr/kernels")] == [kid]
        ws.close()
    finally:
        gw.stop()


async def test_stop_suspends_every_kernel_and_the_next_gateway_lists_it_again(root, tmp_path):
    seed = root / "seed.ipynb"
    root.mkdir(parents=True)
    seed.write_text(json.dumps({"nbformat": 4, "nbformat_minor": 5, "metadata": {"kernelspec": {"name": "python3"}},
                                "cells": [{"cell_type": "code", "id": "a", "metadata": {}, "outputs": [],
                                           "execution_count": None, "source": "seeded = 7"}]}))
    store = tmp_path / "store"
    first = Served("gateway", root, store, f"--KernelGatewayApp.seed_uri={seed}")
    try:
        await first.wait_ready()
        kid = await first.start_kernel()
        ws = await first.ws(kid)
        await execute(ws, "y = seeded * 6")  # Kernel Gateway's seed notebook ran
        ws.close()
        with pytest.raises(HTTPClientError) as listing:  # its list_kernels option still applies
            await first.request("api/kernels")
        assert listing.value.code == 403
    finally:
        assert first.stop() == 0
    assert "1 kernel(s) are on disk for the next start" in first.log.read_text()
    # a gateway's throwaway kernels do not pile up: its default expiry for suspended kernels
    assert "kernels suspended for more than 24 h go to the trash" in first.log.read_text()
    assert kernel_processes(kid) == []

    slow_relist = tmp_path / "slow_relist.py"  # this test only: the listing takes 3 s
    slow_relist.write_text(SLOW_RELIST)
    second = Served("gateway", root, store, f"--config={slow_relist}")
    try:
        await second.wait_ready()
        # asked before the gateway has listed it again: answered once listed, not 404
        asked = time.monotonic()
        assert (await second.request(f"api/kernels/{kid}"))["gpucr"]["state"] == "suspended"
        assert time.monotonic() - asked > 1
        ws = await second.ws(kid)
        reply, out, _ = await execute(ws, "print(y)")
        assert (reply["content"]["status"], out.strip()) == ("ok", "42")
        ws.close()
    finally:
        second.stop()


async def test_the_gateways_culler_suspends_idle_kernels_and_leaves_suspended_ones_alone(root, tmp_path):
    gw = Served("gateway", root, tmp_path / "store", "--JupyterWebsocketPersonality.list_kernels=True",
                "--MappingKernelManager.cull_idle_timeout=2", "--MappingKernelManager.cull_interval=1")
    try:
        await gw.wait_ready()
        kid = await gw.start_kernel()
        ws = await gw.ws(kid)
        await execute(ws, "x = 41")
        ws.close()  # Kernel Gateway's culler leaves kernels with a client alone (cull_connected)

        await gw.wait_state(kid, "suspended", timeout=30)
        assert kernel_processes(kid) == []
        culled = await gw.request(f"api/gpucr/kernels/{kid}")
        assert (culled["engine"], culled["checkpoint"]["reason"]) == ("criu", "idle")
        assert "suspending idle kernel" in gw.log.read_text()

        await asyncio.sleep(4)  # two idle timeouts, four culler rounds: a suspended kernel stays as it is
        assert [(k["id"], k["gpucr"]["state"]) for k in await gw.request("api/kernels")] == [(kid, "suspended")]
        assert (await gw.request(f"api/gpucr/kernels/{kid}"))["checkpoint"]["id"] == culled["checkpoint"]["id"]
        assert kernel_processes(kid) == []
        assert "Culling '" not in gw.log.read_text()  # Kernel Gateway's own culling (a shutdown) never ran

        ws = await gw.ws(kid)
        reply, out, _ = await execute(ws, "x += 1; print(x)")
        assert (reply["content"]["status"], out.strip()) == ("ok", "42")
        ws.close()
    finally:
        gw.stop()


async def test_a_gateway_serves_the_same_routes_as_a_server_fork_and_room(root, tmp_path):
    """The gateway mounts gpucr's one route table, the one the server extension mounts: every route
    answers there (CORS preflight), a kernel forks through it (the copy has the source's variables,
    the source runs on). Kernel Gateway's own rule holds for gpucr's listings: with its default
    ``list_kernels=False`` every GET that lists kernels answers 403 as ``/api/kernels`` does, while a
    kernel's own routes answer whoever knows its id."""
    gw = Served("gateway", root, tmp_path / "store")
    try:
        await gw.wait_ready()
        for pattern, _handler in routes():
            path = re.sub(r"\(\?P<\w+>[^)]*\)", "x", pattern).lstrip("/")
            assert await gw.request(path, "OPTIONS") is None, path  # mounted: not tornado's 404
        kid = await gw.start_kernel()
        for listing in ("api/kernels", "api/gpucr/kernels", "api/gpucr/kernels?label=x", "api/gpucr/checkpoints",
                        "api/gpucr/trash", "api/gpucr/gpus", "api/gpucr/room"):
            with pytest.raises(HTTPClientError) as refused:
                await gw.request(listing)
            assert refused.value.code == 403, listing
        assert (await gw.request(f"api/gpucr/kernels/{kid}"))["state"] == "running"
        ws = await gw.ws(kid)
        await execute(ws, "x = 42")
        [copy] = (await gw.request(f"api/gpucr/kernels/{kid}/fork", "POST", {"count": 1}))["kernels"]
        copy_ws = await gw.ws(copy["id"])
        _, out, _ = await execute(copy_ws, "print(x + 1)")
        assert out.strip() == "43"
        _, out, _ = await execute(ws, "print(x)")
        assert out.strip() == "42"
        copy_ws.close()
        ws.close()
    finally:
        gw.stop()


async def test_a_gateway_that_lists_kernels_lists_them_through_gpucr_too(root, tmp_path):
    gw = Served("gateway", root, tmp_path / "store", "--JupyterWebsocketPersonality.list_kernels=True")
    try:
        await gw.wait_ready()
        kid = await gw.start_kernel()
        assert [k["kernel_id"] for k in await gw.request("api/gpucr/kernels")] == [kid]
        assert isinstance(await gw.request("api/gpucr/room"), list)
    finally:
        gw.stop()

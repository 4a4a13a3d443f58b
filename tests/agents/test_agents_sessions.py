"""Keyed sessions: a framework labels its kernel with its run or thread id at start and finds it
again by that label (REST, ``gpucr kernel ls``, :mod:`jupyter_gpucr.agents`), also from a gateway
started after the one that made it."""
from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.agents import kernel_for
from tests.agent_servers import TOKEN, Served, kill_leftovers
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute


@pytest.fixture
def root(tmp_path):
    criu_or_skip()
    yield tmp_path / "root"
    kill_leftovers(tmp_path)


async def test_a_labelled_kernel_is_found_again_after_the_gateway_restarted(root, tmp_path):
    store = tmp_path / "store"
    listing = "--JupyterWebsocketPersonality.list_kernels=True"  # finding kernels by label lists them
    first = Served("gateway", root, store, listing)
    try:
        await first.wait_ready()
        kid = await first.start_kernel(env={"KERNEL_GPUCR_LABEL": "thread-42"})
        other = await first.start_kernel()
        ws = await first.ws(kid)
        await execute(ws, "memo = 'kept'")
        ws.close()
        assert [s["kernel_id"] for s in await first.request("api/gpucr/kernels?label=thread-42")] == [kid]
        assert (await first.request(f"api/gpucr/kernels/{other}"))["label"] is None
        ls = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "jupyter_gpucr.cli.main", "kernel", "ls",
                                                      "--label", "thread-42", "--server", first.url, "--token", TOKEN],
                                     capture_output=True, text=True)
        assert ls.returncode == 0 and ls.stdout.split()[0] == kid and ls.stdout.split()[-1] == "thread-42", ls
    finally:
        assert first.stop() == 0

    second = Served("gateway", root, store, listing)
    try:
        await second.wait_ready()  # answers at once; the kernel list waits until the earlier kernels are listed
        found = await asyncio.to_thread(kernel_for, "thread-42", second.url, TOKEN)
        assert (found["kernel_id"], found["state"], found["label"]) == (kid, "suspended", "thread-42")
        ws = await second.ws(kid)
        _, out, _ = await execute(ws, "print(memo)")
        assert out.strip() == "kept"
        ws.close()
    finally:
        second.stop()


async def test_a_server_kernel_is_labelled_after_its_start(root, tmp_path):
    server = Served("server", root, tmp_path / "store")
    try:
        await server.wait_ready()
        kid = await server.start_kernel()
        labelled = await server.request(f"api/gpucr/kernels/{kid}/label", "PUT", {"label": "run-7"})
        assert labelled["label"] == "run-7"
        assert await asyncio.to_thread(kernel_for, "run-7", server.url, TOKEN) is not None
        assert await asyncio.to_thread(kernel_for, "run-8", server.url, TOKEN) is None
        for body, path, code in (({"label": ""}, kid, 400), ({"label": "x"}, "no-such-kernel", 404)):
            with pytest.raises(HTTPClientError) as refused:
                await server.request(f"api/gpucr/kernels/{path}/label", "PUT", body)
            assert refused.value.code == code
    finally:
        server.stop()

"""Client timeouts never fire because a kernel is on disk: a restore made slower than autogen-ext's
60 s per message (a delay put in front of the engine by the gateway's config file, in this test
only) ends with the right answer; meanwhile ``kernel_info`` is answered at once and a waiting
request's client hears ``busy`` at least every 20 s; an interrupt (OpenHands' after 120 s)
cancels what waits for the restore, not the restore."""
from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors.docker_jupyter import DockerJupyterCodeExecutor
from autogen_ext.code_executors.docker_jupyter._jupyter_server import JupyterConnectionInfo  # not exported in 0.7.5

from tests.agent_servers import TOKEN, Served, kill_leftovers
from tests.agents.test_agents import _only_kernel, openhands_action, openhands_client
from tests.conftest import criu_or_skip
from tests.kernel_ws import collect, request, send

SLOW_RESTORE = """
import asyncio, pathlib
from jupyter_gpucr.server.engines import CriuEngine
_resume = CriuEngine.resume
async def _slow_resume(self, *args, **kwargs):
    await asyncio.sleep(float(pathlib.Path({delay!r}).read_text()))
    return await _resume(self, *args, **kwargs)
CriuEngine.resume = _slow_resume
"""


@pytest.fixture
def gateway(request, tmp_path):
    """A gateway whose restores first sleep as many seconds as ``gw.delay`` (a file) says; without
    a token for OpenHands' client, which sends none."""
    criu_or_skip()
    delay = tmp_path / "delay"
    config = tmp_path / "slow_restore.py"
    config.write_text(SLOW_RESTORE.format(delay=str(delay)))
    token = "" if "openhands" in request.function.__name__ else TOKEN
    gw = Served("gateway", tmp_path / "root", tmp_path / "store", f"--config={config}",
                "--JupyterWebsocketPersonality.list_kernels=True", token=token)  # the tests list the kernels
    gw.delay = delay
    try:
        yield gw
    finally:
        gw.stop()
        kill_leftovers(tmp_path)


async def _until_restoring(gw: Served, kid: str) -> None:
    while await gw.state(kid) != "restoring":
        await asyncio.sleep(0.1)


async def test_a_restore_longer_than_the_clients_timeouts(gateway: Served) -> None:
    gw, delay = gateway, Path(gateway.delay)
    delay.write_text("65")  # autogen-ext gives each message 60 s
    await gw.wait_ready()
    info = JupyterConnectionInfo(host="127.0.0.1", use_https=False, port=gw.port, token=TOKEN)
    executor = DockerJupyterCodeExecutor(info, timeout=60)

    async def run(code: str):
        return await executor.execute_code_blocks([CodeBlock(code=code, language="python")], CancellationToken())

    try:
        assert (await run("x = 41")).exit_code == 0
        kid = await _only_kernel(gw)
        await gw.suspend(kid)
        agent = asyncio.ensure_future(run("x += 1\nprint(x)"))
        await _until_restoring(gw, kid)

        # another client waits for the same restore on its own websocket
        ws = await gw.ws(kid)
        waiting = request("print('other')")
        await send(ws, waiting)
        heard = [time.monotonic()]
        info_req = request("", "kernel_info_request")
        await send(ws, info_req)
        asked = time.monotonic()
        reply, idle = None, False
        # every message for the waiting request, and the kernel_info reply at once; the kernel's
        # idle may come before its execute_reply (ipykernel 7: 1 in 40 without gpucr, measured)
        while not (reply and idle):
            msg = json.loads(await asyncio.wait_for(ws.read_message(), 90))
            parent = msg["parent_header"].get("msg_id")
            if parent == info_req["header"]["msg_id"] and msg["msg_type"] == "kernel_info_reply":
                assert time.monotonic() - asked < 2
                assert msg["content"]["status"] == "ok" and msg["content"]["language_info"]["name"] == "python"
            elif parent == waiting["header"]["msg_id"]:
                heard.append(time.monotonic())
                if msg["msg_type"] == "execute_reply":
                    reply = msg
                idle = idle or (msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle")
        assert reply["content"]["status"] == "ok"
        assert max(b - a for a, b in zip(heard, heard[1:])) < 20, heard
        result = await agent
        assert (result.exit_code, result.output.strip()) == (0, "42"), result.output
        assert await gw.state(kid) == "running"

        # an interrupt while restoring: the waiting request is cancelled, said so, the restore goes on
        delay.write_text("5")
        await gw.suspend(kid)
        cancelled = request("x = 0")
        await send(ws, cancelled)
        await _until_restoring(gw, kid)
        await gw.request(f"api/kernels/{kid}/interrupt", "POST", {})
        reply, out, _ = await collect(ws, cancelled["header"]["msg_id"], timeout=3)
        assert reply["content"]["ename"] == "KeyboardInterrupt" and "did not run" in out
        await gw.wait_state(kid, "running", timeout=60)
        result = await run("print(x)")
        assert (result.exit_code, result.output.strip()) == (0, "42"), result.output
        assert "1 waiting request(s) cancelled" in gw.log.read_text()
        ws.close()
    finally:
        await executor.stop()


async def test_openhands_times_out_during_a_restore_and_its_next_action_finds_the_kernel(gateway: Served) -> None:
    """OpenHands' client gives an action ``timeout`` seconds (120 by default; 1 here), then sends
    ``POST /interrupt`` and reports the timeout: the action waiting for the restore is cancelled
    and never runs, the restore goes on, the agent's next action gets the kernel's state."""
    gw, delay = gateway, Path(gateway.delay)
    delay.write_text("4")
    await gw.wait_ready()
    kernel = openhands_client().JupyterKernel(f"127.0.0.1:{gw.port}", "conversation-1")
    try:
        await kernel.initialize()  # as its plugin does before the first action
        assert (await kernel.execute(openhands_action("x = 41\nprint(x)"))).strip() == "41"
        await gw.suspend(kernel.kernel_id)
        assert await kernel.execute("x = 0\nprint('ran')", timeout=1) == "[Execution timed out (1 seconds).]"
        assert await gw.state(kernel.kernel_id) == "restoring"  # the interrupt did not stop the restore
        assert (await kernel.execute(openhands_action("print(x)"))).strip() == "41"
        assert "1 waiting request(s) cancelled" in gw.log.read_text()
    finally:
        await kernel.shutdown_async()

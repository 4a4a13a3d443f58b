"""Agent frameworks' own kernel clients, unmodified and without a model, against a jupyter server
with gpucr and a Kernel Gateway with gpucr: state set, suspended on request (the process gone),
suspended when idle with the client still connected; each next action gets the right answer and
the client sees no error."""
from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
import websockets
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors.docker_jupyter import DockerJupyterCodeExecutor
from autogen_ext.code_executors.docker_jupyter._jupyter_server import JupyterConnectionInfo  # not exported in 0.7.5
from jupyter_server.gateway.gateway_client import GatewayClient
from jupyter_server.gateway.managers import GatewayKernelClient
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import DockerExecutor, RemotePythonExecutor, _create_kernel_http

from jupyter_gpucr.agents import reconnect
from tests.agent_servers import TOKEN, Served, kernel_processes, kill_leftovers
from tests.conftest import criu_or_skip

IDLE = ("--GPUCR.idle_timeout=3", "--GPUCR.idle_check_interval=1", "--GPUCR.suspend_connected=True")
LISTING = ("--JupyterWebsocketPersonality.list_kernels=True",)
# Clients that send no credentials: jupyter_server's gateway client on its websocket (checked in 2.21),
# OpenHands' plugin on every request (it starts its gateway without a token).
NO_TOKEN = {"test_jupyter_client_through_the_websocket", "test_openhands_jupyter_kernel"}
#: Where scripts/setup.sh installs OpenHands' Jupyter kernel client (docs/agents.md says why there).
OPENHANDS = Path(sys.executable).parent.parent / "openhands-client"

Run = Callable[[str], Awaitable[str]]  # one agent action: code in, what the agent reads out


@pytest.fixture(params=["server", "gateway"])
def served(request, tmp_path) -> Iterator[Served]:
    """Started here, waited for in the test (async fixtures need a plugin this suite does not use)."""
    criu_or_skip()
    token = "" if request.function.__name__ in NO_TOKEN else TOKEN
    # the tests find the kernel a framework started by listing (_only_kernel): a gateway lists only
    # with list_kernels=True, as Kernel Gateway's own /api/kernels does
    options, env = (*IDLE, *LISTING) if request.param == "gateway" else IDLE, None
    if request.function.__name__ == "test_openhands_jupyter_kernel" and request.param == "gateway":
        options, env = (), openhands_runtime(tmp_path)
    s = Served(request.param, tmp_path / "root", tmp_path / "store", *options, token=token, env=env)
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp_path)


async def _only_kernel(served: Served) -> str:
    [kernel] = await served.request("api/gpucr/kernels")
    return kernel["kernel_id"]


async def _survives_suspends(served: Served, run: Run) -> None:
    """The agent's cycle: set state; suspended on request; idle-suspended while connected."""
    await served.wait_ready()
    assert (await run("x = 41\nprint('set')")).strip() == "set"
    kid = await _only_kernel(served)
    await served.suspend(kid)
    assert kernel_processes(kid) == []
    assert (await run("x += 1\nprint(x)")).strip() == "42"
    assert await served.state(kid) == "running"
    await served.wait_state(kid, "suspended", timeout=30)
    assert kernel_processes(kid) == []
    assert (await run("x += 1\nprint(x)")).strip() == "43"
    assert await _only_kernel(served) == kid


async def test_autogen_docker_jupyter_executor(served: Served) -> None:
    """autogen-ext's executor keeps one websocket for the kernel's life and asks for
    ``kernel_info`` (60 s) before every block."""
    info = JupyterConnectionInfo(host="127.0.0.1", use_https=False, port=served.port, token=TOKEN)
    executor = DockerJupyterCodeExecutor(info, timeout=60)
    await served.wait_ready()

    async def run(code: str) -> str:
        result = await executor.execute_code_blocks([CodeBlock(code=code, language="python")], CancellationToken())
        assert result.exit_code == 0, result.output
        return result.output

    try:
        await _survives_suspends(served, run)
    finally:
        await executor.stop()


async def test_autogen_executor_goes_on_after_a_server_restart(served: Served, tmp_path: Path) -> None:
    """autogen-ext's executor never opens a second websocket: after SIGTERM and a new server on the
    same store and port, its next block fails with ConnectionClosedError; ``agents.reconnect`` lets
    it go on with the same kernel, its state kept."""
    info = JupyterConnectionInfo(host="127.0.0.1", use_https=False, port=served.port, token=TOKEN)
    executor = DockerJupyterCodeExecutor(info, timeout=60)
    await served.wait_ready()

    async def run(code: str) -> str:
        result = await executor.execute_code_blocks([CodeBlock(code=code, language="python")], CancellationToken())
        assert result.exit_code == 0, result.output
        return result.output

    again = None
    try:
        assert (await run("x = 41\nprint('set')")).strip() == "set"
        kid = await _only_kernel(served)
        assert served.stop() == 0  # the kernel goes to disk with the server
        listing = LISTING if served.kind == "gateway" else ()
        again = Served(served.kind, tmp_path / "root", tmp_path / "store", *listing, token=TOKEN, port=served.port)
        await again.wait_ready()
        with pytest.raises(websockets.exceptions.ConnectionClosed):
            await run("x += 1\nprint(x)")
        await reconnect(executor)
        assert (await run("x += 1\nprint(x)")).strip() == "42"
        assert await _only_kernel(again) == kid
    finally:
        await executor.stop()
        if again is not None:
            again.stop()


async def test_smolagents_kernel_gateway_executor(served: Served) -> None:
    """smolagents' Docker executor's own code with the container left out: a kernel made over
    HTTP, a new websocket for every code action; an error in the kernel raises AgentError."""
    await served.wait_ready()
    executor = DockerExecutor.__new__(DockerExecutor)  # its __init__ builds and starts a Docker container
    RemotePythonExecutor.__init__(executor, [], AgentLogger(level=LogLevel.ERROR))
    executor.kernel_id = _create_kernel_http(f"{served.url}/api/kernels?token={TOKEN}", executor.logger)
    executor.ws_url = f"ws://127.0.0.1:{served.port}/api/kernels/{executor.kernel_id}/channels?token={TOKEN}"

    async def run(code: str) -> str:
        return (await asyncio.to_thread(executor, code)).logs

    await _survives_suspends(served, run)


async def test_jupyter_client_through_the_websocket(served: Served) -> None:
    """jupyter_client's kernel client API over the websocket, as jupyter_server's gateway client
    (a JupyterLab started with --gateway-url) talks to a gateway."""
    await served.wait_ready()
    GatewayClient.clear_instance()
    GatewayClient.instance(url=served.url, auth_token=TOKEN)
    try:
        await _through_the_gateway_client(served)
    finally:  # else every jupyter server this process makes later takes itself for a gateway's client
        GatewayClient.clear_instance()


async def _through_the_gateway_client(served: Served) -> None:
    kid = await served.start_kernel()
    client = GatewayKernelClient(kernel_id=kid)
    await client.start_channels()

    async def run(code: str) -> str:
        msg_id = client.execute(code)
        out: list[str] = []
        while True:  # iopub up to the request's idle, as jupyter_client's own callers read it
            msg = await client.get_iopub_msg(timeout=120)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            assert msg["msg_type"] != "error", msg["content"]
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        reply = await client.get_shell_msg(timeout=120)
        assert (reply["parent_header"]["msg_id"], reply["content"]["status"]) == (msg_id, "ok"), reply["content"]
        return "".join(out)

    try:
        await client.wait_for_ready(timeout=60)
        await _survives_suspends(served, run)
    finally:
        client.stop_channels()
        await served.wait_ready()


def openhands_runtime(tmp_path: Path) -> dict[str, str]:
    """docs/agents.md's recipe for OpenHands' runtime image: the gateway's command line stays the
    plugin's, the API module comes from the environment and gpucr's options from the gateway's
    config file."""
    config = tmp_path / "jupyter-config"
    config.mkdir()
    (config / "jupyter_kernel_gateway_config.py").write_text(
        "c.GPUCR.idle_timeout = 3\nc.GPUCR.idle_check_interval = 1\nc.GPUCR.suspend_connected = True\n"
        "c.JupyterWebsocketPersonality.list_kernels = True\n")
    return {"KG_API": "jupyter_gpucr.gateway", "JUPYTER_CONFIG_DIR": str(config)}


def openhands_client() -> ModuleType:
    """OpenHands' Jupyter plugin client, ``openhands/runtime/plugins/jupyter/execute_server.py`` of
    openhands-ai 0.9.8, loaded from its file: its package's ``__init__`` imports the whole agent."""
    path = OPENHANDS / "openhands/runtime/plugins/jupyter/execute_server.py"
    if not path.exists():
        reason = f"OpenHands' kernel client is not installed at {OPENHANDS} (bash scripts/setup.sh installs it)"
        pytest.fail(reason) if os.environ.get("CI") else pytest.skip(reason)
    if str(OPENHANDS) not in sys.path:
        sys.path.append(str(OPENHANDS))  # its one dependency beyond tornado, tenacity, lives there
    spec = importlib.util.spec_from_file_location("openhands_execute_server", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def openhands_action(code: str) -> str:
    """OpenHands' client stops reading at ``execute_reply``, and ipykernel 7 sends a cell's output
    from its IOPub thread, which may come after that reply: with no gpucr (a stock Kernel Gateway),
    18 of 30 ``print(i)`` actions came back as "no output" here. Actions that pause 0.5 s after
    their output got it every time (30 of 30, with and without gpucr, and after restores)."""
    return f"{code}\nimport time; time.sleep(0.5)"


async def test_openhands_jupyter_kernel(served: Served) -> None:
    """OpenHands' client as its Jupyter plugin uses it: a kernel made over HTTP on first use, one
    websocket kept (pinged every 10 s), ``%colors nocolor`` first; each action reads its messages
    by ``msg_id`` and returns the text, a traceback included."""
    kernel = openhands_client().JupyterKernel(f"127.0.0.1:{served.port}", "conversation-1")
    await served.wait_ready()
    await kernel.initialize()

    async def run(code: str) -> str:
        out = await kernel.execute(openhands_action(code))
        assert "Traceback" not in out and "Error" not in out, out
        return out

    try:
        await _survives_suspends(served, run)
    finally:
        await kernel.shutdown_async()

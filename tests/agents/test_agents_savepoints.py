"""docs/agents.md's save-point pattern with a real framework's executor: autogen-ext's Jupyter
executor runs the agent's code blocks on a jupyter server with gpucr; before a tool call the agent
takes a save point (``jupyter_gpucr.agents.save_point``), the tool call breaks the kernel's state,
and the agent goes back (``go_back``): the executor's next block, on the same websocket and the
same kernel id, sees the state from before the tool call. The CLI lists the save points."""
from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import Iterator

import pytest
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.code_executors.docker_jupyter import DockerJupyterCodeExecutor
from autogen_ext.code_executors.docker_jupyter._jupyter_server import JupyterConnectionInfo  # not exported in 0.7.5

from jupyter_gpucr import agents
from jupyter_gpucr.cli.main import main as gpucr
from tests.agent_servers import TOKEN, Served, kill_leftovers
from tests.conftest import criu_or_skip

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def served(tmp_path) -> Iterator[Served]:
    criu_or_skip()
    s = Served("server", tmp_path / "root", tmp_path / "store", token=TOKEN)
    try:
        yield s
    finally:
        s.stop()
        kill_leftovers(tmp_path)


async def test_go_back_after_a_failed_tool_call(served: Served) -> None:
    info = JupyterConnectionInfo(host="127.0.0.1", use_https=False, port=served.port, token=TOKEN)
    executor = DockerJupyterCodeExecutor(info, timeout=60)
    await served.wait_ready()

    async def run(code: str) -> tuple[int, str]:
        result = await executor.execute_code_blocks([CodeBlock(code=code, language="python")], CancellationToken())
        return result.exit_code, result.output

    try:
        assert (await run("results = {'step': 1}\nprint('ok')")) == (0, "ok\n")
        [kernel] = await served.request("api/gpucr/kernels")
        kid = kernel["kernel_id"]
        sp = await asyncio.to_thread(agents.save_point, kid, served.url, TOKEN, "before tool call")
        # the tool call: changes the state, then fails
        code, out = await run("results.clear()\nresults['broken'] = True\nraise RuntimeError('tool failed')")
        assert code != 0 and "tool failed" in out
        state = await asyncio.to_thread(agents.go_back, kid, sp["id"], served.url, TOKEN)
        assert state["kernel_id"] == kid and state["state"] == "running" and state["trash_id"]
        assert (await run("print(results)")) == (0, "{'step': 1}\n")
        assert [s["id"] for s in await asyncio.to_thread(agents.save_points, kid, served.url, TOKEN)] == [sp["id"]]
        out_json = io.StringIO()
        with contextlib.redirect_stdout(out_json):
            rc = await asyncio.to_thread(gpucr, ["--json", "kernel", "savepoints", kid, "--server", served.url,
                                                "--token", TOKEN])
        assert rc == 0 and [s["name"] for s in json.loads(out_json.getvalue())] == ["before tool call"]
    finally:
        await executor.stop()

"""Defects found trying the server as users do, each through a real jupyter server, real kernels
and real CRIU: a websocket opened in any phase of a suspend is answered after it, a suspended
kernel whose manifest cannot be read still connects and says why it cannot come back, a restart
restarts the idle clock, and the smaller rough edges (file modes, messages, readiness)."""
from __future__ import annotations

import asyncio
import json
import pathlib
import time

import psutil
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.store import MANIFEST
from jupyter_gpucr.server.lifecycle import EVENT_SCHEMA_ID

from .kernel_ws import collect, message, request, send
from .kernel_ws import execute as run_cell
from .test_server import fetch_json, jp_server_config, kernel_pid, new_session, open_ws  # noqa: F401

pytestmark = pytest.mark.timeout(300)

#: About 600 MiB in the kernel: its dump takes long enough to open a websocket in each phase.
BIG = "import numpy as np\na = np.ones(75_000_000)\nn = 0"
COUNT = "n += 1\nprint(n)"


class Phases:
    """The suspend phases the server announced on its event bus, to act in a given one."""

    def __init__(self, serverapp, kernel_id: str) -> None:
        self.kernel_id = kernel_id
        self.seen: list[str] = []
        self._changed = asyncio.Event()
        serverapp.event_logger.add_listener(schema_id=EVENT_SCHEMA_ID, listener=self._on_event)

    async def _on_event(self, logger, schema_id, data) -> None:
        if data["kernel_id"] != self.kernel_id:
            return
        if data["phase"] not in self.seen[-1:]:
            self.seen.append(data["phase"])
            self._changed.set()

    async def reached(self, phase: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while phase not in self.seen:
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), max(0.1, deadline - time.monotonic()))


async def until_frozen(pid: int, timeout: float = 30) -> None:
    """Until CRIU holds the kernel stopped to dump it (it seizes it with ptrace)."""
    deadline = time.monotonic() + timeout
    while psutil.Process(pid).status() not in (psutil.STATUS_TRACING_STOP, psutil.STATUS_STOPPED):
        assert time.monotonic() < deadline, "CRIU never froze the kernel"
        await asyncio.sleep(0.001)


async def test_a_websocket_opened_during_a_dump_is_answered_after_the_restore(jp_fetch, jp_ws_fetch, jp_serverapp):
    """A second tab (or an agent's client) connects while the kernel is being dumped and runs a
    cell: the connection opens at once, the cell waits until the suspend is complete, restores the
    kernel and runs exactly once. Five times in a row, as the race is a matter of timing."""
    kid = (await new_session(jp_fetch, "race.ipynb"))["kernel"]["id"]
    first = await open_ws(jp_ws_fetch, kid)
    await run_cell(first, BIG)
    first.close()
    phases = Phases(jp_serverapp, kid)
    # five times in the dump, whose race this is, and once in each other phase of a suspend
    for i, phase in enumerate(["dumping"] * 5 + ["trimming", "gpu-checkpoint", "verifying"], 1):
        phases.seen.clear()
        pid = kernel_pid(jp_serverapp, kid)
        suspend = asyncio.ensure_future(fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST",
                                                   body={}))
        await phases.reached(phase)
        if phase == "dumping":
            await until_frozen(pid)
        t0 = time.monotonic()
        ws = await open_ws(jp_ws_fetch, kid, f"late-{i}")
        opened = time.monotonic() - t0
        cell = request(COUNT)
        await send(ws, cell)
        assert not suspend.done(), (i, phase)  # sent while the suspend ran
        reply, out, statuses = await collect(ws, cell["header"]["msg_id"], timeout=50)
        assert (await suspend)["state"] == "suspended"  # the suspend was not disturbed
        assert reply["content"]["status"] == "ok" and out == f"{i}\n", (i, phases.seen, reply["content"], out)
        assert opened < 5, (i, opened)
        assert statuses[-1] == "idle"
        state = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
        # the cell restored the kernel: it did not reach the kernel while it was being suspended
        assert state["state"] == "running" and state["restored_at"], (i, phase, phases.seen, state)
        ws.close()


async def test_a_suspended_kernel_whose_manifest_cannot_be_read_connects_and_says_why(jp_fetch, jp_ws_fetch,
                                                                                      jp_serverapp):
    """Opening the notebook of such a kernel must not fail the websocket (its read-ahead cannot
    read the checkpoint): it connects, answers what it can from memory, and a cell gets the same
    error the REST API gives, naming the file."""
    kid = (await new_session(jp_fetch, "damaged.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await run_cell(ws, "x = 1")
    ws.close()
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    manifest = pathlib.Path(st["checkpoint"]["path"]) / MANIFEST
    manifest.write_text("{")
    ws = await open_ws(jp_ws_fetch, kid, "reopened")  # was HTTP 500
    info = message("kernel_info_request", {})
    await send(ws, info)
    reply, _, _ = await collect(ws, info["header"]["msg_id"], timeout=10)
    assert reply["content"]["implementation"] == "ipython"
    reply, out, statuses = await run_cell(ws, "print(x)", timeout=30)
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "resume", method="POST", body="{}")
    rest = json.loads(err.value.response.body)
    assert err.value.code == 422 and str(manifest) in rest["message"], rest
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RestoreFailed"
    assert rest["message"] in reply["content"]["evalue"] and rest["message"] in out
    assert statuses[-1] == "idle"
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "suspended" and str(manifest) in st["error"]
    ws.close()

"""Save points under faults, with real servers, real kernels and real CRIU (issue 44): ``kill -9``
of the server during a save point of a running kernel, and during going back to one (at fractions
of the request's measured duration, and on entering the phases between their steps:
``kill_at.py``), leaves the next server with the kernel whole (never neither) and only complete
save points listed; a cell or a request sent while a save point is taken, or while the kernel
goes back, waits for it and is answered sensibly."""
from __future__ import annotations

import asyncio
import json
import pathlib
import signal
import subprocess
from typing import Any

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import criu_or_skip
from tests.kernel_ws import collect, execute, request, send
from tests.server import kill_at
from tests.server.test_server import fetch_json, jp_server_config, new_session, open_ws, run_cell  # noqa: F401
from tests.server.test_server_faults import _leave_nothing_running, _listed_state, processes_of
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(600)

SETUP = "import numpy as np\nx = 0\na = np.arange(2_000_000)"
CHECK = "print(x, int(a.sum()))"
#: Where the server is killed: at a fraction of the request's measured duration, or on entering a
#: phase (``kill_at.PHASES``) whose window a kill timed from outside rarely hits.
SAVE_POINT_KILLS: tuple[float | str, ...] = (0.2, 0.6, "save point: dumped, the kernel runs again",
                                             "save point: complete, before the limit")
GO_BACK_KILLS: tuple[float | str, ...] = (0.5, "go back: suspended, before the trash",
                                          "go back: left state in the trash, before the copy",
                                          "go back: copy made, before the restore")


def values(x: int) -> str:
    """What ``CHECK`` prints in a kernel whose ``x`` is ``x``."""
    return f"{x} {sum(range(2_000_000))}"


def when(point: float | str, took: float) -> float | str:
    """A kill point: a phase, or the fraction ``point`` of a request that took ``took`` seconds."""
    return point if isinstance(point, str) else point * took


def _savepoints(kid: str) -> str:
    return f"api/gpucr/kernels/{kid}/savepoints"


class Servers:
    """A test's server as its own process, and a kernel of it that ran ``SETUP``; killed and
    followed by the next server on the same store. Used as ``async with``: on failure nothing of
    the test stays running; on success the last server stops and leaves no process of the kernel."""

    def __init__(self, tmp_path: pathlib.Path) -> None:
        criu_or_skip()
        self.tmp_path, self.root, self.store = tmp_path, tmp_path / "root", tmp_path / "store"
        self.root.mkdir()
        self.started = 0
        self.server = self._next()
        self.kid = ""

    def _next(self) -> RealServer:
        server = RealServer(self.root, self.store, self.tmp_path / f"server-{self.started}.log",
                            "--ServerApp.jpserver_extensions={'jupyter_gpucr': True, 'tests.server.kill_at': True}")
        self.started += 1
        return server

    async def __aenter__(self) -> Servers:
        await self.server.wait_ready()
        self.kid = (await self.post("api/sessions", {"path": "k.ipynb", "type": "notebook", "name": "k.ipynb",
                                                     "kernel": {"name": "python3"}}))["kernel"]["id"]
        await self.run(SETUP)
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: Any) -> None:
        if kind is not None:
            _leave_nothing_running(self.server, self.kid)
            return
        assert self.server.sigterm() == 0  # it suspends the kernel on its way out
        assert processes_of(self.kid) == []  # no CRIU, holder or kernel left behind

    async def run(self, code: str) -> str:
        """Run ``code`` in the kernel through a websocket of its own; its output. The cell must succeed."""
        ws = await self.server.ws(self.kid)
        try:
            reply, out, _ = await execute(ws, code, timeout=180)
        finally:
            ws.close()
        assert reply["content"]["status"] == "ok", out
        return out.strip()

    async def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return await self.server.request(path, "POST", body or {})

    async def killed_during(self, path: str, body: dict[str, Any], at: float | str) -> str | None:
        """POST ``path`` and kill -9 the server ``at`` seconds later, or on entering phase ``at``
        (``kill_at.PHASES``); then start the next server. The kernel's state there (None: not listed)."""
        armed = self.root / kill_at.ARMED
        if isinstance(at, str):
            assert at in kill_at.PHASES
            armed.write_text(at)
        task = asyncio.ensure_future(self.post(path, body))
        if isinstance(at, str):
            await _exited(self.server.proc, 180)
            armed.unlink()
            assert self.server.proc.returncode == -signal.SIGKILL, f"the server ended before {at!r}"
        else:
            await asyncio.sleep(at)
            self.server.proc.send_signal(signal.SIGKILL)
            self.server.proc.wait(10)
        task.cancel()
        self.server = self._next()
        await self.server.wait_ready()
        return await _listed_state(self.server, self.kid)

    async def go_back(self, sp: dict[str, Any]) -> None:
        """Go back to ``sp`` (named ``x=N``); the kernel's values must be the save point's."""
        await self.post(f"{_savepoints(self.kid)}/{sp['id']}/restore")
        assert await self.run(CHECK) == values(int(sp["name"].removeprefix("x="))), sp

    def no_temporary_checkpoints(self) -> None:
        assert [p.name for p in (self.store / "checkpoints").iterdir() if p.name.startswith(".tmp-")] == []


async def _exited(proc: subprocess.Popen[bytes], timeout: float) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while proc.poll() is None:
        assert loop.time() < deadline, "the server never reached the phase"
        await asyncio.sleep(0.05)


async def test_kill_9_while_a_save_point_is_taken(tmp_path):
    """The next server lists the kernel with its values; every save point it lists goes back to
    its values (a half-made one is not listed); the next save point works."""
    async with Servers(tmp_path) as s:
        first = await s.post(_savepoints(s.kid), {"name": "x=0"})
        checked = {first["id"]}
        for i, point in enumerate(SAVE_POINT_KILLS, 1):
            await s.run(f"x = {i}")
            assert await s.killed_during(_savepoints(s.kid), {"name": f"x={i}"}, when(point, first["took_s"])), point
            assert await s.run(CHECK) == values(i), point
            for sp in await s.server.get(_savepoints(s.kid)):
                if sp["id"] not in checked:
                    await s.go_back(sp)
                    checked.add(sp["id"])
            s.no_temporary_checkpoints()
        await s.run("x = 7")
        last = await s.post(_savepoints(s.kid), {"name": "x=7"})
        await s.run("x = 8")
        await s.go_back(last)
        print(f"save points listed after {len(SAVE_POINT_KILLS)} kills: {len(checked) - 1}")


async def test_kill_9_while_going_back(tmp_path):
    """The next server has the kernel at the save point or in the state it left, never neither;
    when at the save point, the state it left is in the trash and restores from there; going back
    again works."""
    async with Servers(tmp_path) as s:
        sp = await s.post(_savepoints(s.kid), {"name": "x=0"})
        await s.run("x = -1")
        took = await timed(s.go_back(sp))
        left: dict[str, int] = {}  # trash id: the x of the state left there
        for i, point in enumerate(GO_BACK_KILLS, 1):
            await s.run(f"x = {i}")
            trashed = {t["id"] for t in await s.server.get("api/gpucr/trash")}
            assert await s.killed_during(f"{_savepoints(s.kid)}/{sp['id']}/restore", {}, when(point, took)), point
            out = await s.run(CHECK)
            assert out in (values(0), values(i)), (point, out)
            if out == values(0):  # at the save point: what it left is in the trash
                (new,) = [t for t in await s.server.get("api/gpucr/trash") if t["id"] not in trashed]
                assert new["kernel_id"] == s.kid and new["reason"] == "goback", new
                left[new["id"]] = i
            s.no_temporary_checkpoints()
            await s.go_back(sp)
        for tid, x in list(left.items())[-1:]:  # the state left restores from the trash
            await s.post(f"api/gpucr/trash/{tid}/restore", {"replace": True, "sessions": False})
            assert await s.run(CHECK) == values(x)
        print(f"going back, killed at {len(GO_BACK_KILLS)} points: at the save point {len(left)} times")


async def timed(request_: Any) -> float:
    """How long ``request_`` (an awaitable) takes."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await request_
    return loop.time() - t0


def held_event(monkeypatch: Any, serverapp: Any, kid: str) -> asyncio.Event:
    """Set when the server starts holding the kernel's messages (a save point's or a suspend's
    first step): a message sent after it must wait for the operation."""
    mkm = serverapp.kernel_manager
    real, held = mkm.hold_messages, asyncio.Event()

    def hold_messages(kernel_id: str) -> None:
        real(kernel_id)
        if kernel_id == kid:
            held.set()

    monkeypatch.setattr(mkm, "hold_messages", hold_messages)
    return held


async def answered(fetch: Any) -> int:
    """The status a request got: 200, or the error's (a 409 says to try later; a 500 never)."""
    try:
        await fetch
    except HTTPClientError as e:
        assert e.code == 409, e.response and e.response.body
        return e.code
    return 200


async def test_a_cell_and_requests_sent_during_a_save_point_wait_for_it(jp_fetch, jp_ws_fetch, jp_serverapp,
                                                                         monkeypatch):
    kid = (await new_session(jp_fetch, "during.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "x = 1")
    held = held_event(monkeypatch, jp_serverapp, kid)
    save = asyncio.ensure_future(fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "savepoints", method="POST",
                                            body={"name": "x=1"}))
    await asyncio.wait_for(held.wait(), 120)
    cell = request("x += 1\nprint(x)")
    await send(ws, cell)
    second = asyncio.ensure_future(answered(jp_fetch("api", "gpucr", "kernels", kid, "savepoints", method="POST",
                                                     body=json.dumps({"name": "x=2"}))))
    suspend = asyncio.ensure_future(answered(jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST",
                                                      body="{}")))
    reply, out, _ = await collect(ws, cell["header"]["msg_id"], timeout=180)
    assert reply["content"]["status"] == "ok" and out == "2\n", (reply["content"], out)
    sp = await save
    print("second save point, suspend:", await second, await suspend)
    _, out, _ = await execute(ws, "print(x)", timeout=180)  # the cell ran once, after the dump
    assert out == "2\n"
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "savepoints", sp["id"], "restore", method="POST", body={})
    assert await run_cell(jp_ws_fetch, kid, "print(x)") == "1"
    ws.close()


async def test_a_cell_sent_while_going_back_runs_on_the_save_point(jp_fetch, jp_ws_fetch, jp_serverapp, monkeypatch):
    kid = (await new_session(jp_fetch, "back.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "x = 1")
    sp = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "savepoints", method="POST", body={})
    await execute(ws, "x = 2")
    held = held_event(monkeypatch, jp_serverapp, kid)
    back = asyncio.ensure_future(fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "savepoints", sp["id"],
                                            "restore", method="POST", body={}))
    await asyncio.wait_for(held.wait(), 120)
    cell = request("x += 10\nprint(x)")
    await send(ws, cell)
    reply, out, _ = await collect(ws, cell["header"]["msg_id"], timeout=180)
    assert reply["content"]["status"] == "ok" and out == "11\n", (reply["content"], out)
    assert (await back)["state"] == "running"
    ws.close()

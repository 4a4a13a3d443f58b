"""gpucr beside jupyter-resource-usage (in many hub images), whose kernel panel polls
``/api/metrics/v1/kernel_usage/get_usage/{kernel_id}``: each poll opens its own ZeroMQ connection to
the kernel's control port, sends ``usage_request`` and waits up to 10 s for the reply. Monitoring
must neither block a suspend, nor count as activity, nor hang while the kernel is on disk."""
from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from pathlib import Path

import pytest

from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server_lifecycle import RealServer

pytest.importorskip("jupyter_resource_usage")
pytestmark = pytest.mark.timeout(300)

BOTH = "--ServerApp.jpserver_extensions={'jupyter_gpucr': True, 'jupyter_resource_usage': True}"


def server(tmp_path: Path, *options: str) -> RealServer:
    criu_or_skip()
    root = tmp_path / "root"
    root.mkdir()
    return RealServer(root, tmp_path / "store", tmp_path / "server.log", BOTH, *options)


async def usage(srv: RealServer, kid: str) -> dict:
    return await srv.get(f"api/metrics/v1/kernel_usage/get_usage/{kid}")


async def state(srv: RealServer, kid: str) -> dict:
    return await srv.get(f"api/gpucr/kernels/{kid}")


async def start_kernel(srv: RealServer) -> str:
    kid = (await srv.request("api/kernels", "POST", {"name": "python3"}))["id"]
    ws = await srv.ws(kid)
    await execute(ws, "x = 42")
    ws.close()
    return kid


@contextlib.asynccontextmanager
async def panel(srv: RealServer, kid: str, every: float, pollers: int = 1):
    """The kernel panel, open: ``pollers`` clients each poll every ``every`` seconds; yields the answers."""
    answers: list[tuple[float, dict]] = []

    async def poll() -> None:
        while True:
            t0 = time.monotonic()
            with contextlib.suppress(Exception):  # the answers are checked by the tests, not each poll
                answers.append((time.monotonic() - t0, await usage(srv, kid)))
            await asyncio.sleep(every)

    tasks = [asyncio.ensure_future(poll()) for _ in range(pollers)]
    try:
        yield answers
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def first_output(srv: RealServer, kid: str, log: Path) -> str:
    """``print(x)`` on a new websocket. On a loaded 2-core machine the server closed such a
    websocket, opened right after the last resume, twice in many runs (cause not found yet): then
    say so with the server log's end, and ask once more on a new one (the kernel must have x)."""
    for attempt in (1, 2):
        ws = await srv.ws(kid)
        try:
            _, out, _ = await execute(ws, "print(x)")
            return out
        except ConnectionError:
            if attempt == 2:
                raise
            warnings.warn(f"the server closed a websocket right after a resume; its log ends: "
                          f"{log.read_text(errors='replace')[-3000:]}", stacklevel=1)
        finally:
            ws.close()
    raise AssertionError("unreachable")


async def test_suspends_succeed_while_the_panel_polls(tmp_path):
    """A poll's connection still in the kernel's accept queue at the freeze made CRIU refuse the
    dump ("inet: In-flight connection"): 3 of 3 suspends failed at a 0.1 s interval."""
    srv = server(tmp_path)
    try:
        await srv.wait_ready()
        kid = await start_kernel(srv)
        async with panel(srv, kid, every=0.1, pollers=2) as answers:
            for _ in range(4):
                await asyncio.sleep(0.3)
                await srv.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})  # raises on a failed suspend
                assert (await state(srv, kid))["state"] == "suspended"
                await srv.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
        out = await first_output(srv, kid, tmp_path / "server.log")
        assert out.strip().splitlines()[-1] == "42"
        assert any(a.get("content", {}).get("kernel_memory") for _, a in answers), answers[-3:]
    finally:
        assert srv.sigterm() == 0


async def test_the_panel_does_not_keep_a_kernel_from_its_idle_suspend(tmp_path):
    """Each poll made the kernel publish busy/idle for the usage request, which jupyter_server
    counted as activity: with the panel open the kernel was never idle."""
    srv = server(tmp_path, "--GPUCR.idle_timeout=3", "--GPUCR.idle_check_interval=1")
    try:
        await srv.wait_ready()
        kid = await start_kernel(srv)
        async with panel(srv, kid, every=0.5) as answers:
            deadline = time.monotonic() + 30
            while (st := await state(srv, kid))["state"] != "suspended":
                assert time.monotonic() < deadline, f"never idle-suspended while the panel polled: {st['state']}"
                await asyncio.sleep(0.3)
            assert st["checkpoint"]["reason"] == "idle"
            # the polls reached the running kernel (its own reply names its process)
            assert any(a.get("content", {}).get("pid") for _, a in answers), answers[-3:]
        # a cell still counts: the kernel comes back for it and runs it
        ws = await srv.ws(kid)
        _, out, _ = await execute(ws, "print(x)")
        assert out.strip().splitlines()[-1] == "42"
        ws.close()
    finally:
        assert srv.sigterm() == 0


async def test_a_poll_of_a_suspended_kernel_is_answered_at_once_and_leaves_it_suspended(tmp_path):
    """Each poll of a suspended kernel waited the handler's full 10 s and answered "timeout"."""
    srv = server(tmp_path)
    try:
        await srv.wait_ready()
        kid = await start_kernel(srv)
        await srv.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        for _ in range(3):
            t0 = time.monotonic()
            answer = await usage(srv, kid)
            took = time.monotonic() - t0
            assert answer.get("msg_type") == "usage_reply", answer
            assert answer["content"]["kernel_memory"] == 0 and answer["parent_header"]["msg_type"] == "usage_request"
            assert took < 1.0, f"answered in {took:.2f} s"
        await asyncio.sleep(0.5)
        assert (await state(srv, kid))["state"] == "suspended"
        # its next use restores it, as before
        ws = await srv.ws(kid)
        _, out, _ = await execute(ws, "print(x)")
        assert out.strip().splitlines()[-1] == "42"
        ws.close()
        answer = await usage(srv, kid)  # the restored kernel answers itself again
        assert answer["content"].get("pid"), answer
    finally:
        assert srv.sigterm() == 0

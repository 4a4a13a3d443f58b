"""Nothing lost under faults, with a real server, real kernels and real CRIU: messages
racing a suspend all get replies, a failed restore answers the waiting cell with the reason,
a shutdown during a suspend or restore leaves no process behind, and ``kill -9`` of the server at
any moment of a suspend or a restore leaves every kernel complete on disk and listed by the next
server (never neither)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import criu_or_skip
from tests.kernel_ws import collect, execute, request, send
from tests.server.test_server import fetch_json, jp_server_config, new_session, open_ws  # noqa: F401
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(600)


def processes_of(kernel_id: str) -> list[int]:
    """Processes whose command line names the kernel (its holder, its CRIU, the kernel itself)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if kernel_id in " ".join(p.info["cmdline"] or []) and p.status() != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


async def test_cells_racing_a_suspend_all_get_their_reply(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "race.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "n = 0")
    outcomes = []
    for delay in (0.0, 0.005, 0.01, 0.02, 0.05, 0.1, 0.3):
        suspend = asyncio.ensure_future(jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}"))
        await asyncio.sleep(delay)
        cell = request("n += 1\nprint(n)")
        await send(ws, cell)
        reply, out, _ = await collect(ws, cell["header"]["msg_id"], timeout=60)
        assert reply["content"]["status"] == "ok", (delay, reply["content"])
        try:
            await suspend
            outcomes.append("suspended")
        except HTTPClientError as e:
            assert e.code == 409, e.response.body  # the cell got there first: the kernel was busy
            outcomes.append("refused")
        assert out == f"{len(outcomes)}\n", (delay, out)  # every cell ran exactly once
        await execute(ws, "pass")  # a suspended kernel comes back
    print("racing cells:", outcomes)
    ws.close()


async def test_a_failed_restore_answers_the_waiting_cell(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "broken.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "x = 1")
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    images = pathlib.Path(st["checkpoint"]["path"], "images")
    pages = max(images.glob("pages-*.img"), key=lambda p: p.stat().st_size)
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))
    reply, out, statuses = await execute(ws, "print(x)", timeout=60)
    assert reply["content"]["status"] == "error" and reply["content"]["ename"] == "RestoreFailed"
    assert "is damaged" in reply["content"]["evalue"] and "is damaged" in out
    assert statuses[-1] == "idle"  # the cell is not left at [*]
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "suspended" and "damaged" in st["error"] and images.is_dir()
    ws.close()


@pytest.mark.parametrize("during", ["suspend", "restore"])
async def test_shutdown_during_an_operation_leaves_nothing_running(jp_fetch, jp_ws_fetch, jp_serverapp, during):
    kid = (await new_session(jp_fetch, f"{during}.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "import numpy as np; a = np.ones(30_000_000)")
    ws.close()
    if during == "restore":
        await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    op = asyncio.ensure_future(jp_fetch("api", "gpucr", "kernels", kid, during.replace("restore", "resume"),
                                        method="POST", body="{}"))
    await asyncio.sleep(0.2)
    await jp_fetch("api", "kernels", kid, method="DELETE")
    await op  # the operation finished before the shutdown acted on its result
    assert kid not in [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    for _ in range(50):
        if not processes_of(kid):
            break
        await asyncio.sleep(0.1)
    assert processes_of(kid) == []
    trash = await fetch_json(jp_fetch, "api", "gpucr", "trash")
    assert [t["kernel_id"] for t in trash] == ([kid] if during == "suspend" else [])


KILL_POINTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.8, 1.2, 2.0, 3.0)


async def test_kill_9_of_the_server_at_any_moment_loses_no_kernel(tmp_path):
    """kill -9 of the server at spread points of a suspend and of a restore; the next server
    lists the kernel (complete on disk) and a cell gets the value back."""
    criu_or_skip()
    counts = await kill_9_during_suspends_and_restores(
        tmp_path, "import numpy as np\nx = 42\na = np.arange(5_000_000)", "print(x, int(a.sum()))",
        f"42 {sum(range(5_000_000))}\n", KILL_POINTS)
    assert counts["lost"] == 0, counts


async def kill_9_during_suspends_and_restores(tmp_path: pathlib.Path, setup: str, check: str, expected: str,
                                              delays: tuple[float, ...]) -> dict[str, int]:
    """Run ``setup`` in a kernel of a real server, then for each delay: start a suspend (then a
    restore), kill -9 the server that long after, start a new one and run ``check``, whose output
    must be ``expected``. Returns how often the kernel was listed and restored, or lost."""
    root, store = tmp_path / "root", tmp_path / "store"
    root.mkdir()
    counts = {"listed and restored": 0, "lost": 0}
    points = [("suspend", d) for d in delays] + [("resume", d) for d in delays]
    server = RealServer(root, store, tmp_path / "server-0.log")
    await server.wait_ready()
    kid = (await server.request("api/sessions", "POST", {"path": "k.ipynb", "type": "notebook", "name": "k.ipynb",
                                                         "kernel": {"name": "python3"}}))["kernel"]["id"]
    ws = await server.ws(kid)
    await execute(ws, setup, timeout=300)
    ws.close()
    try:
        for i, (op, delay) in enumerate(points, 1):
            if op == "resume" and (await server.get(f"api/gpucr/kernels/{kid}"))["state"] != "suspended":
                await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            task = asyncio.ensure_future(server.request(f"api/gpucr/kernels/{kid}/{op}", "POST", {}))
            await asyncio.sleep(delay)
            server.proc.send_signal(signal.SIGKILL)
            server.proc.wait(10)
            task.cancel()
            server = RealServer(root, store, tmp_path / f"server-{i}.log")
            await server.wait_ready()
            state = await _listed_state(server, kid)
            if state is None:
                counts["lost"] += 1
                continue
            ws = await server.ws(kid)
            _, out, _ = await execute(ws, check, timeout=120)
            ws.close()
            assert out == expected, (op, delay, state, out)
            counts["listed and restored"] += 1
            leftovers = [p.name for p in (store / "checkpoints").iterdir() if p.name.startswith(".tmp-")]
            assert leftovers == [], (op, delay)
    except BaseException:
        _leave_nothing_running(server, kid)
        raise
    assert server.sigterm() == 0  # it suspends the kernel on its way out
    print(f"kill -9 at {len(points)} points: {counts}")
    return counts


def _leave_nothing_running(server: RealServer, kid: str) -> None:
    """After a failure in the loop: stop the server (it suspends the kernel), then kill whatever
    of the kernel still runs, so that no test after this one finds it."""
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
        try:
            server.proc.wait(120)
        except subprocess.TimeoutExpired:
            server.proc.kill()
    for pid in processes_of(kid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def _listed_state(server: RealServer, kid: str) -> str | None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if kid in [k["id"] for k in await server.get("api/kernels")]:
            return (await server.get(f"api/gpucr/kernels/{kid}"))["state"]
        await asyncio.sleep(0.3)
    return None



@pytest.mark.parametrize("how", ["command line", "config file with a second extension"])
def test_another_kernel_manager_class_refuses_the_start(tmp_path, how):
    """gpucr's manager stays in force, or the server does not start and says why."""
    criu_or_skip()
    config = tmp_path / "config"
    config.mkdir()
    args = ["--ServerApp.jpserver_extensions={'jupyter_gpucr': True}"]
    stock = "jupyter_server.services.kernels.kernelmanager.AsyncMappingKernelManager"
    if how == "command line":
        args.append(f"--ServerApp.kernel_manager_class={stock}")
    else:
        (config / "jupyter_server_config.json").write_text(json.dumps({"ServerApp": {
            "kernel_manager_class": stock, "jpserver_extensions": {"jupyter_gpucr": True, "jupyterlab": True}}}))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "GPUCR_STORE": str(tmp_path / "store")}
    proc = subprocess.run([sys.executable, "-m", "jupyter_server", "--port=0", f"--ServerApp.root_dir={tmp_path}", *args],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode != 0
    assert "ServerApp.kernel_manager_class is set to" in proc.stderr and "gpucr needs its own" in proc.stderr


def block_the_commit(store: pathlib.Path, stop: threading.Event) -> None:
    """Take the checkpoint's final name as soon as its temporary directory appears: the dump
    completes, the commit's rename fails, as it would on a full disk (the same path: the images
    are complete, the checkpoint cannot be finished)."""
    while not stop.is_set():
        for tmp in store.glob("checkpoints/.tmp-*"):
            blocker = tmp.with_name(tmp.name[len(".tmp-"):]) / "taken"
            blocker.parent.mkdir(exist_ok=True)
            blocker.write_text("another checkpoint of the same name")
            return
        time.sleep(0.001)


async def test_a_failed_commit_puts_the_kernel_back_under_the_server(jp_fetch, jp_ws_fetch, jp_serverapp):
    """The dump finished but the checkpoint could not be committed: the process is restored from
    its images, and the server's provisioner, restarter and websocket follow the new process."""
    store = jp_serverapp.kernel_manager.runtime.checkpointer.store.root
    kid = (await new_session(jp_fetch, "full.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "import numpy as np\nx = 42\na = np.arange(5_000_000)")
    old_pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.kernel_pid
    stop = threading.Event()
    blocker = threading.Thread(target=block_the_commit, args=(store, stop))
    blocker.start()
    try:
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}")
    finally:
        stop.set()
        blocker.join()
    body = json.loads(err.value.response.body)
    assert err.value.code == 500 and "The process was put back and runs again" in body["message"], body
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "running" and "put back" in st["error"]
    _, out, _ = await execute(ws, "print(x, int(a.sum()))")  # the same websocket works, nothing lost
    assert out == f"42 {sum(range(5_000_000))}\n"
    pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.kernel_pid
    assert pid != old_pid and psutil.pid_exists(pid)  # the provisioner tracks the process that was put back
    assert not [p for p in (store / "checkpoints").glob(".tmp-*")]
    for taken in (store / "checkpoints").glob("*/taken"):
        taken.unlink()
        taken.parent.rmdir()
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})  # works again
    _, out, _ = await execute(ws, "print(x)")
    assert out == "42\n"
    ws.close()


@pytest.mark.parametrize("when", ["during the restore", "after the restore"])
async def test_a_kernel_whose_memory_never_came_back_is_shown_suspended_and_restores_again(
        jp_fetch, jp_ws_fetch, jp_serverapp, monkeypatch, tmp_path, when):
    """The restore hands the kernel back before all its memory is in. If CRIU's lazy-pages
    daemon dies, the kernel must not run on with pages missing: it is stopped, shown suspended
    with the reason, and the next cell restores it from its intact checkpoint."""
    cr = jp_serverapp.kernel_manager.runtime.checkpointer
    if not cr.criu.lazy_pages_supported:
        pytest.skip("this kernel gives CRIU no userfaultfd for lazy restores")
    kid = (await new_session(jp_fetch, "lazy.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "x = 42")
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    # The daemon's wrapper exits with 9 once the trigger exists, whether the daemon had finished or not.
    trigger = cr.store.proc_dir(kid) / ".pages" if when == "during the restore" else tmp_path / "now"
    real = cr.criu.lazy_pages_argv
    killer = f'"$@" & d=$!; while [ ! -s {trigger} ]; do sleep 0.002; done; kill -9 $d; wait $d; exit 9'
    monkeypatch.setattr(cr.criu, "lazy_pages_argv", lambda images, workdir: ["sh", "-c", killer, "sh", *real(images, workdir)])
    try:
        await jp_fetch("api", "gpucr", "kernels", kid, "resume", method="POST", body="{}")
    except HTTPClientError as e:  # the kernel died before the restore had finished
        assert when == "during the restore" and "lost its memory" in json.loads(e.response.body)["message"]
    if when == "after the restore":
        assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"
        trigger.write_text("now")
    deadline = time.monotonic() + 20
    while (st := await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] != "suspended":
        assert time.monotonic() < deadline, st
        await asyncio.sleep(0.1)
    assert "lost its memory" in st["error"] and "checkpoint is intact" in st["hint"]
    monkeypatch.undo()
    _, out, _ = await execute(ws, "print(x)", timeout=60)
    assert out == "42\n"
    ws.close()


async def test_a_reconnect_cut_short_leaves_the_websocket_working(jp_fetch, jp_ws_fetch, jp_serverapp):
    """A restored kernel that dies while the server reconnects its websockets has that reconnect
    cancelled. The half-made connection must not stay registered as the client's session: the
    next reconnect would take the client's own websocket for a stale duplicate and close it."""
    kid = (await new_session(jp_fetch, "reconnect.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "x = 42")
    [conn] = jp_serverapp.kernel_manager.connections_of(kid)
    conn.hold()
    conn.sleep()  # dormant, as during a suspend; the kernel itself runs on
    waking = asyncio.ensure_future(conn.wake())
    for _ in range(3):  # into the reconnect: registered as the session, waiting for the kernel
        await asyncio.sleep(0)
    assert not waking.done()
    waking.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waking
    await conn.wake()
    _, out, _ = await execute(ws, "print(x)", timeout=60)
    assert out == "42\n"
    ws.close()

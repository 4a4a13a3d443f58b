"""A suspended kernel stays asleep until the user acts, through a real server, real
kernels and real CRIU: what JupyterLab, its debugger and jupyter-resource-usage send on their own
is answered from disk; a cell, a completion or a live widget's message restores the kernel;
restart and shutdown keep the saved state in the trash; a busy kernel suspends when its cell ends."""
from __future__ import annotations

import asyncio
import json

import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import gone
from tests.kernel_ws import collect, execute, message, request, send
from tests.pagecache import evict, resident_fraction
from tests.server.test_server import STATE_CODE, fetch_json, jp_server_config, kernel_pid, new_session, open_ws  # noqa: F401
from tests.server.test_server_lifecycle import wait_state

pytestmark = pytest.mark.timeout(240)


async def ask(ws, msg_type, content, channel="shell"):
    msg = message(msg_type, content, channel)
    await send(ws, msg)
    reply, _, statuses = await collect(ws, msg["header"]["msg_id"], timeout=10)
    return reply, statuses


async def suspended_kernel(jp_fetch, jp_ws_fetch, jp_serverapp, path):
    kid = (await new_session(jp_fetch, path))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "x = 42")
    pid = kernel_pid(jp_serverapp, kid)
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert gone(pid)
    return kid, ws


async def test_what_clients_send_on_their_own_does_not_restore(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid, ws = await suspended_kernel(jp_fetch, jp_ws_fetch, jp_serverapp, "asleep.ipynb")
    ws.close()
    ws = await open_ws(jp_ws_fetch, kid, "reconnect")  # a reload: JupyterLab reconnects and asks around
    info, statuses = await ask(ws, "kernel_info_request", {})
    assert info["content"]["implementation"] == "ipython" and statuses[-1] == "idle"
    hist, _ = await ask(ws, "history_request", {"hist_access_type": "tail", "n": 10, "output": False, "raw": True})
    assert hist["content"]["status"] == "ok" and "x = 42" in [h[2] for h in hist["content"]["history"]]
    comms, _ = await ask(ws, "comm_info_request", {"target_name": "jupyter.widget"})
    assert comms["content"] == {"status": "ok", "comms": {}}
    debug, _ = await ask(ws, "debug_request", {"type": "request", "seq": 7, "command": "debugInfo", "arguments": {}},
                         "control")
    assert debug["content"]["success"] and debug["content"]["request_seq"] == 7
    assert debug["content"]["body"]["isStarted"] is False
    usage, _ = await ask(ws, "usage_request", {}, "control")
    assert usage["content"]["kernel_memory"] == 0 and usage["content"]["host_virtual_memory"]["total"] > 0
    other, _ = await ask(ws, "shutdown_request", {"restart": False}, "control")
    assert other["content"]["status"] == "error" and "suspended to disk" in other["content"]["evalue"]
    # a widget manager opens its control comm and asks for state: closed at once, no restore
    opened = message("comm_open", {"comm_id": "c1", "target_name": "jupyter.widget.control", "data": {}})
    await send(ws, opened)
    await send(ws, message("comm_msg", {"comm_id": "c1", "data": {"method": "request_states"}}))
    closed = json.loads(await asyncio.wait_for(ws.read_message(), 10))
    while closed["header"]["msg_type"] == "status":  # the kernel's busy and idle around each message
        closed = json.loads(await asyncio.wait_for(ws.read_message(), 10))
    assert closed["header"]["msg_type"] == "comm_close" and closed["content"]["comm_id"] == "c1"
    await asyncio.sleep(0.5)
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"
    # a completion needs the kernel: it comes back and answers
    reply, _ = await ask(ws, "complete_request", {"code": "import o", "cursor_pos": 8})
    assert "os" in reply["content"]["matches"]
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "running" and st["restored_at"] and st["suspended_for"] >= 0
    _, out, _ = await execute(ws, "print(x)")
    assert out == "42\n"
    ws.close()


async def test_a_cell_restores_only_its_own_kernel(jp_fetch, jp_ws_fetch, jp_serverapp):
    one, ws1 = await suspended_kernel(jp_fetch, jp_ws_fetch, jp_serverapp, "one.ipynb")
    two, ws2 = await suspended_kernel(jp_fetch, jp_ws_fetch, jp_serverapp, "two.ipynb")
    _, out, _ = await execute(ws1, "print(x + 1)")
    assert out == "43\n"
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", two))["state"] == "suspended"
    models = {k["id"]: k for k in await fetch_json(jp_fetch, "api", "kernels")}
    assert models[two]["gpucr"]["state"] == "suspended" and models[two]["gpucr"]["size"] > 0
    assert models[one]["gpucr"]["state"] == "running"
    ws1.close()
    ws2.close()


async def test_busy_kernel_suspends_when_its_cell_finishes(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "busy.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "y = 'kept'")
    cell = request("import time; time.sleep(2); print('cell done')")
    await send(ws, cell)
    await asyncio.sleep(0.5)
    resp = await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body=json.dumps({"when": "idle"}))
    assert resp.code == 202 and json.loads(resp.body)["state"] == "suspend-pending"
    _, out, _ = await collect(ws, cell["header"]["msg_id"])
    assert out == "cell done\n"  # the cell ran to its end, its output arrived
    await wait_state(jp_fetch, kid, "suspended", timeout=30)
    _, out, _ = await execute(ws, "print(y)")
    assert out == "kept\n"
    # cancelled: the kernel just keeps running
    cell = request("import time; time.sleep(2)")
    await send(ws, cell)
    await asyncio.sleep(0.5)
    await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body=json.dumps({"when": "idle"}))
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="DELETE")
    assert st["state"] == "running"
    await collect(ws, cell["header"]["msg_id"])
    await asyncio.sleep(0.5)
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"
    # interrupt and suspend
    cell = request("import time; time.sleep(60)")
    await send(ws, cell)
    await asyncio.sleep(0.5)
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={"when": "interrupt"})
    assert st["state"] == "suspended"
    reply, _, _ = await collect(ws, cell["header"]["msg_id"])
    assert reply["content"]["ename"] == "KeyboardInterrupt"
    ws.close()


async def test_shutdown_and_restart_keep_the_saved_state_in_the_trash(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid, ws = await suspended_kernel(jp_fetch, jp_ws_fetch, jp_serverapp, "keep.ipynb")
    ws.close()
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")  # Kernel > Restart
    trash = await fetch_json(jp_fetch, "api", "gpucr", "trash")
    assert [(t["kernel_id"], t["reason"]) for t in trash] == [(kid, "restart")]
    assert trash[0]["notebook_path"] == "keep.ipynb" and trash[0]["expires_at"] > trash[0]["trashed_at"]
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "running" and "variables of the suspended kernel are gone" in st["warnings"][0]
    ws = await open_ws(jp_ws_fetch, kid, "after-restart")
    _, out, _ = await execute(ws, "print('x' in globals())")
    assert out == "False\n"  # a fresh kernel, as the user asked
    with pytest.raises(HTTPClientError) as err:  # the id is taken by the fresh kernel: the user decides
        await jp_fetch("api", "gpucr", "trash", trash[0]["id"], "restore", method="POST", body="{}")
    answer = json.loads(err.value.response.body)
    assert err.value.code == 409 and answer["error"] == "KernelReplacedError"
    assert answer["message"] == "keep.ipynb was restarted after its state was saved: a new kernel runs in its place."
    # "Shut down the new kernel and restore the saved one", in one step; the notebook keeps its one session
    st = await fetch_json(jp_fetch, "api", "gpucr", "trash", trash[0]["id"], "restore", method="POST",
                          body={"replace": True})
    assert st["state"] == "suspended" and st["kernel_id"] == kid
    assert [s["path"] for s in await fetch_json(jp_fetch, "api", "sessions")] == ["keep.ipynb"]
    while await asyncio.wait_for(ws.read_message(), 5) is not None:  # closed (after what was on its way):
        pass  # its client reconnects, to the kernel listed again
    ws = await open_ws(jp_ws_fetch, kid, "back")
    _, out, _ = await execute(ws, "print(x)")
    assert out == "42\n"
    # A client that reconnects its open notebook itself gets no session made for it
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    ws.close()
    session = (await fetch_json(jp_fetch, "api", "sessions"))[0]["id"]
    await jp_fetch("api", "sessions", session, method="DELETE")  # JupyterLab's Kernel > Shut Down: to the trash
    trash = await fetch_json(jp_fetch, "api", "gpucr", "trash")
    st = await fetch_json(jp_fetch, "api", "gpucr", "trash", trash[0]["id"], "restore", method="POST",
                          body={"sessions": False})
    assert st["state"] == "suspended" and await fetch_json(jp_fetch, "api", "sessions") == []
    await jp_fetch("api", "kernels", kid, method="DELETE")  # on disk again: to the trash again
    trash = await fetch_json(jp_fetch, "api", "gpucr", "trash")
    assert [(t["kernel_id"], t["reason"]) for t in trash] == [(kid, "shutdown")]
    await jp_fetch("api", "gpucr", "trash", trash[0]["id"], method="DELETE")
    assert await fetch_json(jp_fetch, "api", "gpucr", "checkpoints") == []


async def test_opening_a_suspended_kernel_reads_its_checkpoint_into_the_page_cache(jp_fetch, jp_ws_fetch,
                                                                                     jp_serverapp):
    """Opening the notebook (a client connects) prefetches the image so a restore reads memory;
    the kernel stays on disk."""
    kid = (await new_session(jp_fetch, "prefetch.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "import numpy as np\nbig = np.random.default_rng(1).random(40_000_000)\nx = 42")
    pid = kernel_pid(jp_serverapp, kid)
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    ws.close()
    ckpt = jp_serverapp.kernel_manager.runtime.store.latest(kid)
    files = [f for f in ckpt.path.rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) > 300 << 20
    evict(files)  # as after a reboot or under memory pressure: nothing of it in memory
    if resident_fraction(files) > 0.1:
        pytest.skip("this filesystem keeps the pages in memory whatever (tmpfs)")

    ws = await open_ws(jp_ws_fetch, kid, "opened")
    for _ in range(300):
        if resident_fraction(files) > 0.95:
            break
        await asyncio.sleep(0.1)
    assert resident_fraction(files) > 0.95, "the checkpoint was not read into the page cache"
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"
    assert gone(pid)
    _, out, _ = await execute(ws, "print(x, big.shape)")
    assert out == "42 (40000000,)\n"
    ws.close()

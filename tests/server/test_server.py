"""The server extension end to end: a real jupyter server (pytest-jupyter), real ipykernels,
real CRIU. What a user checks: the kernel comes back with its variables, under the same id."""
from __future__ import annotations

import asyncio
import json
import time

import psutil
import pytest
from tornado.httpclient import HTTPClientError

from tests.conftest import criu_or_skip, gone
from tests.core.test_core import gpucr
from tests.kernel_ws import collect, execute, request, send

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def jp_server_config(tmp_path, request):
    criu_or_skip()
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store"), **getattr(request, "param", {})},
    }


async def fetch_json(jp_fetch, *parts, method="GET", body=None):
    kwargs = {"method": method}
    if body is not None:
        kwargs["body"] = json.dumps(body)
    resp = await jp_fetch(*parts, **kwargs)
    return json.loads(resp.body) if resp.body else None


async def new_session(jp_fetch, path="work.ipynb"):
    return await fetch_json(jp_fetch, "api", "sessions", method="POST",
                            body={"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}})


async def open_ws(jp_ws_fetch, kernel_id, session_id="test-session"):
    return await jp_ws_fetch("api", "kernels", kernel_id, "channels", params={"session_id": session_id})


async def run_cell(jp_ws_fetch, kernel_id, code, timeout=120):
    """Run ``code`` in the kernel over a websocket of its own; its output. The cell must succeed."""
    ws = await open_ws(jp_ws_fetch, kernel_id, f"s-{kernel_id}")
    try:
        reply, out, _ = await execute(ws, code, timeout=timeout)
    finally:
        ws.close()
    assert reply["content"]["status"] == "ok", out
    return out.strip()


def kernel_pid(jp_serverapp, kernel_id):
    return jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner.kernel_pid


STATE_CODE = "x = 42\nimport numpy as np, os\na = np.arange(20_000_000, dtype=np.int64)\nprint(int(a.sum()))"


# Lazy: the kernel runs while CRIU's daemon brings its memory in. Eager (every GPU kernel's way):
# gpucr's page daemon copies it all in first, with many threads.
@pytest.mark.parametrize("jp_server_config", [{}, {"lazy_restore": False}], ids=["lazy", "eager"], indirect=True)
async def test_suspend_then_websocket_restores_with_state(jp_fetch, jp_ws_fetch, jp_serverapp, jp_server_config):
    session = await new_session(jp_fetch)
    kid = session["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    reply, out, _ = await execute(ws, STATE_CODE)
    assert reply["content"]["status"] == "ok"
    checksum = out.strip()
    ws.close()
    pid = kernel_pid(jp_serverapp, kid)
    assert psutil.pid_exists(pid)

    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert st["state"] == "suspended" and st["checkpoint"]["size"] > 100 << 20
    assert st["engine"] == "criu" and st["trim"]["reserved_after"] == 0, st["trim"]  # trimmed first (no GPU here)
    assert gone(pid)
    assert kid in [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    assert (await fetch_json(jp_fetch, "api", "kernels", kid))["id"] == kid
    sessions = await fetch_json(jp_fetch, "api", "sessions")
    assert [s["kernel"]["id"] for s in sessions if s["id"] == session["id"]] == [kid]
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"
    listed = await fetch_json(jp_fetch, "api", "gpucr", "kernels")
    assert [k["state"] for k in listed if k["kernel_id"] == kid] == ["suspended"]

    # A reconnecting client's kernel_info_request is answered without restoring.
    ws = await open_ws(jp_ws_fetch, kid)
    info = request("", "kernel_info_request")
    await send(ws, info)
    reply, _, _ = await collect(ws, info["header"]["msg_id"])
    assert reply["content"]["implementation"] == "ipython"
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"

    # Running a cell restores the kernel transparently; the cell's output arrives.
    t0 = time.perf_counter()
    reply, out, statuses = await execute(ws, "print(x, int(a.sum()))")
    waited = time.perf_counter() - t0
    assert reply["content"]["status"] == "ok"
    assert out.split()[-2:] == ["42", checksum]
    assert "busy" in statuses
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "running" and st["kernel_id"] == kid
    # where the wait went: the server's own steps around the engine's restore, within the wait
    timings = st["timings"]
    assert timings["engine_other"] >= 0, timings  # the engine's steps fit in the time it took
    assert timings["server_before"] + timings["total"] + timings["engine_other"] + timings["server_after"] < waited, \
        (timings, waited)
    assert ("page_fill" in st["timings"]) == (not jp_server_config["GPUCR"].get("lazy_restore", True)), st["timings"]
    assert kid in [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    ws.close()


async def test_suspend_with_open_tab_and_resume_by_rest(jp_fetch, jp_ws_fetch, jp_serverapp, tmp_path):
    session = await new_session(jp_fetch, "open.ipynb")
    kid = session["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "y = 'kept'")
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    # the CLI leaves a server's kernel to the server (restored by it, it would run unmanaged)
    refused = gpucr(tmp_path / "gpucr-store", "restore", kid, check=False)
    assert refused.returncode == 1 and "only that server restores it" in refused.stderr, refused.stderr
    assert f"gpucr kernel resume {kid}" in refused.stderr
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "suspended"
    assert (await fetch_json(jp_fetch, "api", "kernels", kid))["execution_state"] == "idle"
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    assert st["state"] == "running"
    # idle as before: the server's own trim request must not leave it "busy" (a second suspend works)
    assert (await fetch_json(jp_fetch, "api", "kernels", kid))["execution_state"] == "idle"
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    reply, out, _ = await execute(ws, "print(y)")  # the tab that stayed open works again
    assert out == "kept\n"  # the cell's output is the cell's own: the notice goes through REST and events
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["restored_at"] > st["restored_at"] - st["suspended_for"] > 0 and st["lost"] == []
    # interrupt and restart still reach the restored kernel, which is not the server's child
    await fetch_json(jp_fetch, "api", "kernels", kid, "interrupt", method="POST", body={})
    ws.close()
    await fetch_json(jp_fetch, "api", "kernels", kid, "restart", method="POST", body={})
    ws = await open_ws(jp_ws_fetch, kid, "after-restart")
    reply, out, _ = await execute(ws, "print('y' in globals())")
    assert out.strip() == "False"
    ws.close()


async def test_bad_requests(jp_fetch, jp_ws_fetch, jp_serverapp, http_server_client, jp_base_url):
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", "no-such-kernel", "suspend", method="POST", body="{}")
    assert err.value.code == 404
    session = await new_session(jp_fetch, "bad.ipynb")
    kid = session["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "z = 1")
    # busy kernel
    busy = request("import time; time.sleep(3)")
    await send(ws, busy)
    await asyncio.sleep(0.5)
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}")
    assert err.value.code == 409
    body = json.loads(err.value.response.body)
    assert body["message"] == "“bad.ipynb” is running a cell." and body["options"] == ["idle", "interrupt"]
    await collect(ws, busy["header"]["msg_id"])
    ws.close()
    # unauthenticated
    with pytest.raises(HTTPClientError) as err:
        await http_server_client.fetch(f"{jp_base_url}api/gpucr/kernels/{kid}/suspend", method="POST", body="{}",
                                       headers={"Authorization": ""})
    assert err.value.code in (401, 403)
    # already suspended
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}")
    assert err.value.code == 409 and b"suspended" in err.value.response.body
    # damaged checkpoint: clear error, the kernel stays suspended, the checkpoint is kept
    ckpts = await fetch_json(jp_fetch, "api", "gpucr", "checkpoints")
    path = [c for c in ckpts if c["kernel_id"] == kid][0]["path"]
    import pathlib

    pages = max(pathlib.Path(path, "images").glob("pages-*.img"), key=lambda p: p.stat().st_size)
    data = bytearray(pages.read_bytes())
    data[len(data) // 2] ^= 0xFF
    pages.write_bytes(bytes(data))
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "resume", method="POST", body="{}")
    assert err.value.code == 422 and b"is damaged" in err.value.response.body
    # the cause in plain words (no id, no CRIU text), and that asking again cannot help
    body = json.loads(err.value.response.body)
    assert body["summary"] == "The saved state is damaged" and body["retryable"] is False
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "suspended" and "damaged" in st["error"]
    assert st["summary"] == "The saved state is damaged" and st["retryable"] is False
    assert pathlib.Path(path).is_dir()
    # the user gives up on it: shutting the kernel down moves its checkpoint to the trash
    await jp_fetch("api", "kernels", kid, method="DELETE")
    assert not pathlib.Path(path).exists()
    assert [t["kernel_id"] for t in await fetch_json(jp_fetch, "api", "gpucr", "trash")] == [kid]


async def test_other_endpoints(jp_fetch):
    doctor = await fetch_json(jp_fetch, "api", "gpucr", "doctor")
    assert {"criu", "criu check", "nvidia driver"} <= {c["name"] for c in doctor["checks"]}
    assert await fetch_json(jp_fetch, "api", "gpucr", "gpus") == []  # no GPU on this machine
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "checkpoints", "..%2Fetc", method="DELETE")
    assert err.value.code in (400, 404)


async def test_snapshot_engine_through_the_server(jp_fetch, jp_ws_fetch, jp_serverapp):
    session = await new_session(jp_fetch, "snap.ipynb")
    kid = session["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, "import numpy as np\nb = np.arange(1000) * 3\ndef twice(v):\n    return 2 * v\n"
                      "gen = (i for i in range(3))")
    pid = kernel_pid(jp_serverapp, kid)
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body=json.dumps({"engine": "warp"}))
    assert err.value.code == 400
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={"engine": "snapshot"})
    assert st["state"] == "suspended" and st["engine"] == "snapshot" and st["engine_reason"] == "requested"
    assert [(x["name"], x["type"]) for x in st["lost"]] == [("gen", "generator")]
    assert gone(pid)
    reply, out, _ = await execute(ws, "print(int(b.sum()), twice(21))")
    assert out == "1498500 42\n"
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "running" and st["kernel_id"] == kid
    assert [(x["name"], x["type"]) for x in st["lost"]] == [("gen", "generator")]  # what the UI tells the user
    ws.close()


async def test_kernels_do_not_share_a_history_file(jp_fetch, jp_ws_fetch, jp_serverapp):
    """Another kernel writing IPython history while one is suspended must not break its restore."""
    first = (await new_session(jp_fetch, "one.ipynb"))["kernel"]["id"]
    second = (await new_session(jp_fetch, "two.ipynb"))["kernel"]["id"]
    ws1, ws2 = await open_ws(jp_ws_fetch, first, "s1"), await open_ws(jp_ws_fetch, second, "s2")
    await execute(ws1, "k = 'first'")
    _, hist, _ = await execute(ws1, "print(get_ipython().history_manager.hist_file)")
    _, hist2, _ = await execute(ws2, "print(get_ipython().history_manager.hist_file)")
    assert hist.strip() != hist2.strip() and first in hist
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", first, "suspend", method="POST", body={})
    for i in range(20):
        await execute(ws2, f"h{i} = {i}")
    _, out, _ = await execute(ws1, "print(k)")
    assert out.strip().splitlines()[-1] == "first"
    ws1.close()
    ws2.close()


async def test_checkpoint_listing_follows_a_renamed_notebook(jp_fetch, jp_ws_fetch, jp_serverapp):
    session = await new_session(jp_fetch, "before.ipynb")
    kid = session["kernel"]["id"]
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    await fetch_json(jp_fetch, "api", "sessions", session["id"], method="PATCH", body={"path": "after.ipynb"})
    listed = [c for c in await fetch_json(jp_fetch, "api", "gpucr", "checkpoints") if c["kernel_id"] == kid]
    assert [c["notebook_path"] for c in listed] == ["after.ipynb"]
    one = await fetch_json(jp_fetch, "api", "gpucr", "checkpoints", listed[0]["id"])
    assert one["notebook_path"] == "after.ipynb"
    state = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert state["checkpoint"]["notebook_path"] == "after.ipynb"

"""Save points through the server (issue 44): a real jupyter server, real ipykernels, real CRIU.
What a user checks: a variable changed after a save point is back after going back, under the
same kernel id; the state left is in the trash; a suspended kernel has save points too; the
limit drops the oldest; a file that changed since the save point is named and nothing is done."""
from __future__ import annotations

import json

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.criu import pagemaps
from tests.server.test_server import fetch_json, jp_server_config, kernel_pid, new_session, open_ws, run_cell  # noqa: F401

pytestmark = pytest.mark.timeout(240)


def _api(kid, *rest):
    return ("api", "gpucr", "kernels", kid, "savepoints", *rest)


async def test_go_back_to_a_save_point(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "risky.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, "x = 1\nimport numpy as np\na = np.arange(1_000_000)")
    pid = kernel_pid(jp_serverapp, kid)
    first = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "x is 1"})
    assert first["name"] == "x is 1" and first["size"] > 0 and 0 < first["paused_s"] < 60, first
    assert first["cell"]["code"].startswith("x = 1") and first["cell"]["execution_count"] >= 1, first
    # the kernel was left running, the same process
    state = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert state["state"] == "running" and kernel_pid(jp_serverapp, kid) == pid
    await run_cell(jp_ws_fetch, kid, "x = 2\na[:] = 0")
    second = await fetch_json(jp_fetch, *_api(kid), method="POST", body={})
    assert second["name"] is None and second["cell"]["code"].startswith("x = 2")
    await run_cell(jp_ws_fetch, kid, "x = 3")
    listed = await fetch_json(jp_fetch, *_api(kid))
    assert [s["id"] for s in listed] == [first["id"], second["id"]]

    # go back to the older one: the same kernel id, x and the array as they were
    back = await fetch_json(jp_fetch, *_api(kid, first["id"], "restore"), method="POST", body={})
    assert back["kernel_id"] == kid and back["state"] == "running" and back["trash_id"], back
    assert await run_cell(jp_ws_fetch, kid, "print(x, int(a.sum()))") == "1 499999500000"
    assert kid in [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    # both save points are still there (go back again, or to the newer one)
    assert [s["id"] for s in await fetch_json(jp_fetch, *_api(kid))] == [first["id"], second["id"]]
    again = await fetch_json(jp_fetch, *_api(kid, second["id"], "restore"), method="POST", body={})
    assert await run_cell(jp_ws_fetch, kid, "print(x, int(a.sum()))") == "2 0"

    # the state left by each go-back is in the trash, restorable: the first one held x == 3
    trash = {t["id"]: t for t in await fetch_json(jp_fetch, "api", "gpucr", "trash")}
    assert back["trash_id"] in trash and again["trash_id"] in trash
    assert trash[back["trash_id"]]["reason"] == "goback" and trash[back["trash_id"]]["kernel_id"] == kid
    # restoring it replaces the kernel, whose state now goes to the trash in turn (it is suspended
    # first: its process is not killed, so none of its connections lingers in TIME_WAIT on the
    # addresses the restored one needs)
    restored = await fetch_json(jp_fetch, "api", "gpucr", "trash", back["trash_id"], "restore", method="POST",
                                body={"replace": True, "sessions": False})
    assert restored["kernel_id"] == kid and restored["state"] == "suspended"
    assert await run_cell(jp_ws_fetch, kid, "print(x)") == "3"
    trash = await fetch_json(jp_fetch, "api", "gpucr", "trash")
    assert [t["reason"] for t in trash if t["kernel_id"] == kid][-1] == "shutdown", trash


async def test_save_point_of_a_suspended_kernel_and_the_limit(jp_fetch, jp_ws_fetch, jp_serverapp):
    jp_serverapp.kernel_manager.runtime.options.max_save_points = 2
    kid = (await new_session(jp_fetch, "on-disk.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, "y = 'kept'")
    sp0 = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "zero"})
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    sp1 = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "on disk"})
    assert sp1["kernel_state"] == "suspended" and sp1["cell"]["code"] == "y = 'kept'", sp1
    state = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert state["state"] == "suspended" and state["checkpoint"]["reason"] != "savepoint"
    await run_cell(jp_ws_fetch, kid, "y = 'changed'")  # restores it
    sp2 = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "two"})
    assert sp2["dropped"] == [sp0["id"]]
    assert [s["name"] for s in await fetch_json(jp_fetch, *_api(kid))] == ["on disk", "two"]
    with pytest.raises(HTTPClientError) as gone:
        await fetch_json(jp_fetch, *_api(kid, sp0["id"], "restore"), method="POST", body={})
    assert gone.value.code == 404
    await fetch_json(jp_fetch, *_api(kid, sp1["id"], "restore"), method="POST", body={})
    assert await run_cell(jp_ws_fetch, kid, "print(y)") == "kept"
    await jp_fetch(*_api(kid, sp2["id"]), method="DELETE")
    assert [s["id"] for s in await fetch_json(jp_fetch, *_api(kid))] == [sp1["id"]]


async def test_a_changed_file_is_named_and_nothing_is_done(jp_fetch, jp_ws_fetch, jp_serverapp, tmp_path):
    kid = (await new_session(jp_fetch, "files.ipynb"))["kernel"]["id"]
    data = tmp_path / "data.txt"
    data.write_text("0123456789")
    await run_cell(jp_ws_fetch, kid, f"f = open({str(data)!r})\nz = 1")
    sp = await fetch_json(jp_fetch, *_api(kid), method="POST", body={})
    await run_cell(jp_ws_fetch, kid, "z = 2")
    data.write_text("longer than it was")
    with pytest.raises(HTTPClientError) as refused:
        await fetch_json(jp_fetch, *_api(kid, sp["id"], "restore"), method="POST", body={})
    error = json.loads(refused.value.response.body)
    assert refused.value.code == 409
    assert str(data) in error["message"] and "Nothing was done" in error["message"], error
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"
    assert await run_cell(jp_ws_fetch, kid, "print(z)") == "2"


async def test_fork_from_a_save_point(jp_fetch, jp_ws_fetch, jp_serverapp):
    kid = (await new_session(jp_fetch, "tree.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, "w = 'then'")
    sp = await fetch_json(jp_fetch, *_api(kid), method="POST", body={})
    await run_cell(jp_ws_fetch, kid, "w = 'now'")
    session = await run_cell(jp_ws_fetch, kid, "print(get_ipython().history_manager.session_number)")
    made = await fetch_json(jp_fetch, *_api(kid, sp["id"], "fork"), method="POST", body={})
    (fork,) = [k["id"] for k in made["kernels"]]
    assert await run_cell(jp_ws_fetch, fork, "print(w)") == "then"
    assert await run_cell(jp_ws_fetch, kid, "print(w)") == "now"
    # going back to it after the fork: the history is as it was then too (had the fork taken the save
    # point's copy of it, IPython would find its next lines taken and move to a new session)
    await fetch_json(jp_fetch, *_api(kid, sp["id"], "restore"), method="POST", body={})
    await run_cell(jp_ws_fetch, kid, "w = 'again'")
    assert await run_cell(jp_ws_fetch, kid, "h = get_ipython().history_manager\nh.writeout_cache()\n"
                                        "print(h.session_number)") == session


async def test_save_points_keep_unchanged_pages_once(jp_fetch, jp_ws_fetch, jp_serverapp):
    """Two save points of a running kernel whose cell changed a little of its memory: one takes the
    unchanged pages from the other (CRIU's parent link) and holds only the changed ones; going
    back to either gives its values; the one whose pages the other takes is deleted, and going
    back to the other still gives its values. Where the kernel tracks written pages the second
    save point's dump is incremental; where not (this machine), the dump is full, says why, and
    the first one takes its unchanged pages from the second."""
    runtime = jp_serverapp.kernel_manager.runtime
    kid = (await new_session(jp_fetch, "share.ipynb"))["kernel"]["id"]
    await run_cell(jp_ws_fetch, kid, "import numpy as np\nx = 1\na = np.ones(64 << 17)")  # 64 MiB
    first = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "one"})
    await run_cell(jp_ws_fetch, kid, "x = 2\na[:1000] = 2")
    second = await fetch_json(jp_fetch, *_api(kid), method="POST", body={"name": "two"})
    tracked = runtime.checkpointer.criu.dirty_tracking
    assert second["memory"]["dump"] == ("incremental" if tracked else "full"), second
    if not tracked:
        assert "CONFIG_MEM_SOFT_DIRTY" in second["memory"]["why_full"] and second["shared"]["id"] == first["id"], second

    listed = {s["id"]: s for s in await fetch_json(jp_fetch, *_api(kid))}
    child, parent = ((second, first) if tracked else (first, second))
    x = 1 if child is first else 2  # the child's values: x, and a's sum
    values = f"{x} {(64 << 17) + (x - 1) * 1000}"
    assert listed[child["id"]]["parent"] == parent["id"] and listed[parent["id"]]["parent"] is None, listed
    store = runtime.store
    child_images, parent_images = store.get(child["id"]).images, store.get(parent["id"]).images
    assert (child_images / "parent").resolve() == parent_images.resolve()
    whole = pagemaps.own_page_bytes(parent_images)
    assert whole > 64 << 20 and pagemaps.own_page_bytes(child_images) < whole // 8
    assert listed[child["id"]]["size"] < listed[parent["id"]]["size"] // 4, listed

    await run_cell(jp_ws_fetch, kid, "x = 3")
    await fetch_json(jp_fetch, *_api(kid, first["id"], "restore"), method="POST", body={})
    assert await run_cell(jp_ws_fetch, kid, "print(x, int(a.sum()))") == f"1 {64 << 17}"
    await fetch_json(jp_fetch, *_api(kid, second["id"], "restore"), method="POST", body={})
    assert await run_cell(jp_ws_fetch, kid, "print(x, int(a.sum()))") == f"2 {(64 << 17) + 1000}"
    (fork,) = [k["id"] for k in (await fetch_json(jp_fetch, *_api(kid, child["id"], "fork"), method="POST",
                                                  body={}))["kernels"]]
    assert await run_cell(jp_ws_fetch, fork, "print(x, int(a.sum()))") == values

    # the one whose pages the other takes goes: the other copies them in first
    await jp_fetch(*_api(kid, parent["id"]), method="DELETE")
    (left,) = await fetch_json(jp_fetch, *_api(kid))
    assert left["id"] == child["id"] and left["parent"] is None, left
    assert pagemaps.own_page_bytes(store.get(child["id"]).images) > 64 << 20
    store.get(child["id"]).verify("images")
    await fetch_json(jp_fetch, *_api(kid, child["id"], "restore"), method="POST", body={})
    assert await run_cell(jp_ws_fetch, kid, "print(x, int(a.sum()))") == values

"""A kernel the snapshot engine suspended starts its process when a client opens it, ahead of the
restore, through a real server and real kernels: it stays suspended for the clients until a cell
restores it, the cell then loads into that process, and nothing of it outlives a timeout, a shutdown,
a restart or the server."""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import psutil
import pytest

from tests.conftest import criu_or_skip, gone
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, new_session, open_ws
from tests.server.test_server_lifecycle import RealServer, wait_state
from tests.server.test_snapshot_engine import TENSOR_FINGERPRINT, TENSORS

pytestmark = pytest.mark.timeout(240)

STATE = "import numpy as np\nb = np.arange(1000) * 3\ndef twice(v):\n    return 2 * v"
CHECK = "print(int(b.sum()), twice(21))"
CHECKED = "1498500 42\n"


@pytest.fixture
def jp_server_config(tmp_path, request):
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store"), "engine": "snapshot", **getattr(request, "param", {})},
    }


def kernel_processes(kernel_id: str) -> list[psutil.Process]:
    """The kernel's ipykernel processes, found by the connection file on their command line (the
    gpucr provisioner's holder has it on its own after a ``--``). A child of one is not another:
    until it execs, a child the kernel starts shows the kernel's command line (an ipykernel starting
    runs ``uname -p`` through vfork, the kernel in disk-sleep meanwhile)."""
    found = []
    for p in psutil.process_iter(["cmdline", "ppid"]):
        cmd = p.info["cmdline"] or []
        if cmd[1:3] == ["-m", "ipykernel_launcher"] and any(part.endswith(f"kernel-{kernel_id}.json") for part in cmd):
            found.append(p)
    pids = {p.pid for p in found}
    return [p for p in found if p.info["ppid"] not in pids]


def imported_numpy(p: psutil.Process) -> bool:
    try:
        return "_multiarray_umath" in Path(f"/proc/{p.pid}/maps").read_text()
    except OSError:
        return False


async def until_warm(kernel_id: str, imported: bool = True, timeout: float = 90) -> psutil.Process:
    """The kernel's one process, once it runs (and, with ``imported``, has imported NumPy)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = kernel_processes(kernel_id)
        assert len(found) <= 1, f"more than one process for kernel {kernel_id}: {found}"
        if found and (not imported or imported_numpy(found[0])):
            return found[0]
        await asyncio.sleep(0.1)
    raise AssertionError(f"kernel {kernel_id} was not started ahead of its restore within {timeout:.0f} s")


async def until_gone(p: psutil.Process, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not gone(p.pid):
        assert time.monotonic() < deadline, f"process {p.pid} still runs"
        await asyncio.sleep(0.1)


async def state(jp_fetch, kid):
    return await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)


async def suspended_kernel(jp_fetch, jp_ws_fetch, path):
    """A kernel holding STATE, suspended by the snapshot engine, its websocket closed."""
    kid = (await new_session(jp_fetch, path))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, STATE)
    [first] = kernel_processes(kid)
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert st["state"] == "suspended" and st["engine"] == "snapshot"
    assert gone(first.pid) and kernel_processes(kid) == []
    ws.close()
    return kid


@pytest.mark.parametrize("jp_server_config", [{}, {"checkpointable_kernels": False}], ids=["gpucr-provisioner", "stock"],
                         indirect=True)
async def test_opening_starts_the_kernel_ahead_and_a_cell_loads_into_it(jp_fetch, jp_ws_fetch, jp_serverapp,
                                                                           jp_server_config):
    kid = await suspended_kernel(jp_fetch, jp_ws_fetch, "warm.ipynb")
    ws = await open_ws(jp_ws_fetch, kid, "opened")  # the notebook is opened again
    warm = await until_warm(kid)
    other_tab = await open_ws(jp_ws_fetch, kid, "other-tab")  # opened twice: still one process
    await asyncio.sleep(1)
    assert [p.pid for p in kernel_processes(kid)] == [warm.pid]
    # suspended for every client until a cell: in gpucr's state and in jupyter_server's model
    assert (await state(jp_fetch, kid))["state"] == "suspended"
    model = await fetch_json(jp_fetch, "api", "kernels", kid)
    assert model["gpucr"]["state"] == "suspended" and model["execution_state"] == "idle"

    _, out, _ = await execute(ws, CHECK)
    assert out == CHECKED
    st = await wait_state(jp_fetch, kid, "running")  # the other tab may still be reconnecting
    assert st["timings"]["warm_start"] is True, st["timings"]
    assert [p.pid for p in kernel_processes(kid)] == [warm.pid]  # loaded into it
    _, out, _ = await execute(other_tab, CHECK)  # the other tab talks to it too
    assert out == CHECKED
    ws.close()
    other_tab.close()


async def test_a_pytorch_kernel_opened_again_loads_its_tensors_ahead_bit_for_bit(jp_fetch, jp_ws_fetch, jp_serverapp):
    """Its storages (several of them larger than one read) are read ahead into the process started
    when it was opened, and come back bit for bit."""
    kid = (await new_session(jp_fetch, "tensors.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    await execute(ws, TENSORS)
    _, before, _ = await execute(ws, TENSOR_FINGERPRINT)
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    ws.close()
    ws = await open_ws(jp_ws_fetch, kid, "opened")
    warm = await until_warm(kid, imported=False)
    _, after, _ = await execute(ws, TENSOR_FINGERPRINT)
    assert after == before and json.loads(after)["shared"] is True
    timings = (await wait_state(jp_fetch, kid, "running"))["timings"]
    assert timings["warm_start"] is True and [p.pid for p in kernel_processes(kid)] == [warm.pid], timings
    assert timings["in_kernel_storage_bytes"] > 70 << 20, timings
    ws.close()


@pytest.mark.parametrize("jp_server_config", [{"warm_start_timeout_s": 8}], indirect=True)
async def test_a_kernel_nobody_restores_is_stopped_after_the_timeout_and_stays_restorable(jp_fetch, jp_ws_fetch,
                                                                                           jp_serverapp):
    kid = await suspended_kernel(jp_fetch, jp_ws_fetch, "left-open.ipynb")
    record = jp_serverapp.kernel_manager.runtime.store.read_proc(kid)
    ws = await open_ws(jp_ws_fetch, kid, "opened")
    opened = time.monotonic()
    warm = await until_warm(kid, imported=False)
    await until_gone(warm, timeout=40)
    assert time.monotonic() - opened > 7
    assert kernel_processes(kid) == []
    assert (await state(jp_fetch, kid))["state"] == "suspended"
    store = jp_serverapp.kernel_manager.runtime.store
    for _ in range(100):  # written back once the process is reaped
        if store.read_proc(kid) == record:
            break
        await asyncio.sleep(0.1)
    assert store.read_proc(kid) == record  # on disk as its suspend left it

    _, out, _ = await execute(ws, CHECK)
    assert out == CHECKED
    st = await wait_state(jp_fetch, kid, "running")
    assert st["timings"]["warm_start"] is False, st["timings"]
    ws.close()


async def until_no_process(kernel_id: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while kernel_processes(kernel_id):
        assert time.monotonic() < deadline, f"kernel {kernel_id} still has a process: {kernel_processes(kernel_id)}"
        await asyncio.sleep(0.1)


async def test_a_kernel_shut_down_while_its_process_is_launched_ahead_is_shut_down(jp_fetch, jp_ws_fetch):
    """The shutdown comes while the process started ahead of the restore is still being launched:
    the kernel is shut down (its launch is unseen: jupyter_client's shutdown found a kernel still
    starting, and the server answered 500), and nothing of it is left but its place in the trash."""
    kid = await suspended_kernel(jp_fetch, jp_ws_fetch, "at-once.ipynb")
    ws = await open_ws(jp_ws_fetch, kid, "opened")  # the launch starts now; the shutdown does not wait for it
    ws.close()
    response = await jp_fetch("api", "kernels", kid, method="DELETE")
    assert response.code == 204
    await until_no_process(kid)
    assert kid not in [k["id"] for k in await fetch_json(jp_fetch, "api", "kernels")]
    assert [t["kernel_id"] for t in await fetch_json(jp_fetch, "api", "gpucr", "trash")] == [kid]


@pytest.mark.parametrize("action", ["shutdown", "restart"])
async def test_shutting_down_or_restarting_a_warm_kernel_leaves_no_process_of_it(jp_fetch, jp_ws_fetch, jp_serverapp,
                                                                                 action):
    kid = await suspended_kernel(jp_fetch, jp_ws_fetch, f"{action}.ipynb")
    ws = await open_ws(jp_ws_fetch, kid, "opened")
    warm = await until_warm(kid, imported=False)  # possibly still starting: stopped all the same
    ws.close()
    if action == "shutdown":
        await jp_fetch("api", "kernels", kid, method="DELETE")
        await until_gone(warm)
        assert kernel_processes(kid) == []
        assert [t["kernel_id"] for t in await fetch_json(jp_fetch, "api", "gpucr", "trash")] == [kid]  # kept there
        return
    await jp_fetch("api", "kernels", kid, "restart", method="POST", body="{}")
    await until_gone(warm)
    ws = await open_ws(jp_ws_fetch, kid, "after-restart")
    _, out, _ = await execute(ws, "print('b' in globals())")
    assert out == "False\n"  # the fresh kernel the user asked for
    assert len(kernel_processes(kid)) == 1
    ws.close()


async def test_the_server_stops_with_a_warm_kernel_which_the_next_server_restores(tmp_path):
    root, store, log = tmp_path / "root", tmp_path / "store", tmp_path / "server.log"
    root.mkdir()
    first = RealServer(root, store, log, "--GPUCR.engine=snapshot")
    try:
        await first.wait_ready()
        kid = (await first.request("api/sessions", "POST", {"path": "stop.ipynb", "type": "notebook",
                                                            "name": "stop.ipynb", "kernel": {"name": "python3"}}))["kernel"]["id"]
        ws = await first.ws(kid)
        await execute(ws, STATE)
        await first.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        ws.close()
        ws = await first.ws(kid)
        warm = await until_warm(kid)
    finally:
        assert first.sigterm() == 0
    assert gone(warm.pid) and kernel_processes(kid) == []
    assert "1 kernel(s) are on disk for the next start" in log.read_text()

    second = RealServer(root, store, log, "--GPUCR.engine=snapshot")
    try:
        await second.wait_ready()
        await second.wait_listed(kid)
        assert (await second.get(f"api/gpucr/kernels/{kid}"))["state"] == "suspended"
        ws = await second.ws(kid)
        _, out, _ = await execute(ws, CHECK)
        assert out == CHECKED
        ws.close()
    finally:
        second.sigterm()


@pytest.mark.parametrize("jp_server_config", [{"host_memory_budget": "2.5GiB", "kernel_memory": "1GiB",
                                               "min_resident_s": 0}], indirect=True)
async def test_a_warm_kernel_counts_in_the_host_budget_and_gives_way_before_any_kernel_is_suspended(
        jp_fetch, jp_ws_fetch, jp_serverapp):
    """Kernels are declared 1 GiB under a 2.5 GiB budget: a warm process counts as its kernel, a new
    kernel that needs its room stops it rather than suspend an idle running kernel, and a kernel whose
    restore finds no room is not started ahead."""
    criu_or_skip()  # the budget counts the processes of kernels the gpucr provisioner launched
    a = await suspended_kernel(jp_fetch, jp_ws_fetch, "a.ipynb")
    b = (await new_session(jp_fetch, "b.ipynb"))["kernel"]["id"]
    ws_b = await open_ws(jp_ws_fetch, b, "b")
    await execute(ws_b, "y = 2")
    ws_a = await open_ws(jp_ws_fetch, a, "a")
    warm = await until_warm(a, imported=False)
    room = {r["where"]: r for r in await fetch_json(jp_fetch, "api", "gpucr", "room")}["host memory"]
    assert room["held_by_kernels"] >= 2 << 30, room  # b and a's warm process

    c = (await fetch_json(jp_fetch, "api", "kernels", method="POST", body={"name": "python3"}))["id"]
    await until_gone(warm)
    assert (await state(jp_fetch, b))["state"] == "running" and (await state(jp_fetch, a))["state"] == "suspended"
    assert (await state(jp_fetch, c))["state"] == "running"

    ws_a.close()
    ws_a = await open_ws(jp_ws_fetch, a, "a-again")  # b and c hold 2 GiB: no room for a's restore
    await asyncio.sleep(3)
    assert kernel_processes(a) == []
    _, out, _ = await execute(ws_a, CHECK)  # its restore makes room as any restore does
    assert out == CHECKED
    ws_a.close()
    ws_b.close()


FREEZER = Path("/sys/fs/cgroup/freezer")
# At exit the kernel puts itself into a cgroup v1 freezer and freezes it: a process that does not
# go away, not even on SIGKILL, until the test thaws it (as one stuck in disk-sleep).
FREEZE_AT_EXIT = """import atexit
def _freeze(cgroup={cgroup!r}):
    with open(cgroup + "/cgroup.procs", "w") as f:
        f.write("0")
    with open(cgroup + "/freezer.state", "w") as f:
        f.write("FROZEN")
atexit.register(_freeze)"""


async def test_a_suspend_is_done_only_once_the_old_process_is_gone(jp_fetch, jp_ws_fetch, jp_serverapp, tmp_path):
    """The kernel's process outlives its stop (and the kill after it) for longer than jupyter_client
    waits for it: the suspend is reported only once it is gone, and no process is started for the
    kernel meanwhile."""
    if not FREEZER.is_dir():
        pytest.skip("needs the cgroup v1 freezer (a frozen process outlives SIGKILL there)")
    cgroup = FREEZER / f"gpucr-test-{uuid.uuid4().hex[:8]}"
    cgroup.mkdir()
    try:
        kid = (await new_session(jp_fetch, "slow-exit.ipynb"))["kernel"]["id"]
        ws = await open_ws(jp_ws_fetch, kid)
        await execute(ws, f"{STATE}\n{FREEZE_AT_EXIT.format(cgroup=str(cgroup))}")
        [old] = kernel_processes(kid)
        suspend = asyncio.ensure_future(jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}",
                                                 request_timeout=120))
        deadline = time.monotonic() + 60
        while (cgroup / "freezer.state").read_text().strip() != "FROZEN":  # the kernel is exiting, frozen
            assert time.monotonic() < deadline and not suspend.done(), "the kernel never froze at its exit"
            await asyncio.sleep(0.1)
        ws.close()
        opened = await open_ws(jp_ws_fetch, kid, "opened")  # a warm start must wait for the old process
        await asyncio.wait({suspend}, timeout=25)  # jupyter_client gives up on it after about 15 s
        done_while_frozen = suspend.done()
        assert not gone(old.pid) and [p.pid for p in kernel_processes(kid)] == [old.pid]
    finally:
        (cgroup / "freezer.state").write_text("THAWED")  # the kill pending on it ends it
    assert not done_while_frozen, "the suspend was reported done while the kernel's process still existed"
    st = json.loads((await suspend).body)
    assert st["state"] == "suspended" and gone(old.pid)
    _, out, _ = await execute(opened, CHECK)
    assert out == CHECKED
    opened.close()
    await until_gone(old)
    cgroup.rmdir()

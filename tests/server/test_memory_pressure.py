"""The host memory budget holds under a real memory limit: a real server runs in a memory cgroup
of its own, as KubeSpawner or systemd would run it, its budget below the limit and its periodic
budget check out of the way. Four kernels each fill DATA; all four at once would pass the limit
(the OOM killer would kill one, and its state with it). The idle ones are suspended in LRU order,
the first while the growing kernel's cell still runs (memory pressure in the cgroup), no process is
OOM-killed, and every cell answers right, the suspended kernels' after their restore."""
from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_room_growth import states, wait_states
from tests.server.test_server_lifecycle import RealServer

pytestmark = pytest.mark.timeout(240)

MiB = 1 << 20
DATA = 300 * MiB  # each kernel: about 350 MiB with its own baseline
BUDGET = 900 * MiB  # two and a half kernels
# Three kernels, the server, the kernels' holders and CRIU dumping one of them fit (the budget is
# passed by one cell's growth before the idle kernel goes), with room for a slow machine, where the
# growing cell's pages are all in before the dump ends (1400 MiB: the OOM killer took CRIU's dump
# beside a CPU hog); four kernels, the server and a dump do not.
LIMIT = 1600 * MiB


class Cgroup:
    """A memory cgroup made for the test (v1's memory hierarchy, or v2 with the memory controller)."""

    def __init__(self, folder: Path, version: int) -> None:
        self.folder, self.version = folder, version

    def limit(self, nbytes: int) -> None:
        (self.folder / ("memory.max" if self.version == 2 else "memory.limit_in_bytes")).write_text(str(nbytes))

    def join(self, pid: int) -> None:
        (self.folder / "cgroup.procs").write_text(str(pid))

    def pids(self) -> list[int]:
        return [int(p) for p in (self.folder / "cgroup.procs").read_text().split()]

    def oom_kills(self) -> int:
        text = (self.folder / ("memory.events" if self.version == 2 else "memory.oom_control")).read_text()
        return next(int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill "))


def _make_cgroup() -> Cgroup:
    name = f"gpucr-test-{uuid.uuid4().hex[:8]}"
    v1, v2 = Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup")
    tried = []
    if (v1 / "memory.limit_in_bytes").exists():
        try:
            (v1 / name).mkdir()
            return Cgroup(v1 / name, 1)
        except OSError as e:
            tried.append(f"{v1 / name}: {e.strerror}")
    if "memory" in (v2 / "cgroup.subtree_control").read_text().split() if (v2 / "cgroup.subtree_control").exists() else False:
        try:
            (v2 / name).mkdir()
            return Cgroup(v2 / name, 2)
        except OSError as e:
            tried.append(f"{v2 / name}: {e.strerror}")
    pytest.skip("a memory cgroup could not be created (root and a cgroup v1 memory hierarchy, or cgroup v2 with the "
                f"memory controller enabled, are needed): {'; '.join(tried) or 'no memory controller mounted'}")


@pytest.fixture
def cgroup() -> Iterator[Cgroup]:
    cg = _make_cgroup()
    try:
        yield cg
    finally:  # what the server left there (nothing when it stopped cleanly), then the cgroup
        deadline = time.monotonic() + 10
        while cg.pids() and time.monotonic() < deadline:
            for pid in cg.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.2)
        cg.folder.rmdir()




async def run(server: RealServer, kid: str, code: str) -> str:
    ws = await server.ws(kid)
    try:
        _, out, _ = await execute(ws, code)
    finally:
        ws.close()
    return out


def fill(name: str, then: str = "") -> str:
    return f"x = bytearray([{ord(name)}]) * {DATA}\n{then}print(x.count({ord(name)}))"


def grow(name: str, then: str = "") -> str:
    """A cell that loads its data a part at a time, as cells that read data do: memory comes under
    pressure while the cell runs, and an idle kernel can go before the rest comes in."""
    part = DATA // 6
    return (f"import os, time\nx = []\nfor _ in range(6):\n    x.append(bytearray([{ord(name)}]) * {part})\n"
            f"    time.sleep(0.5)\n{then}print(sum(p.count({ord(name)}) for p in x))")


async def test_idle_kernels_go_in_lru_order_under_a_cgroup_limit_and_none_is_oom_killed(tmp_path, cgroup):
    criu_or_skip()
    root, log = tmp_path / "root", tmp_path / "server.log"
    root.mkdir()
    cgroup.limit(LIMIT)
    # the periodic check is out of the way: cells' ends and the cgroup's pressure hold the budget
    server = RealServer(root, tmp_path / "store", log, f"--GPUCR.host_memory_budget={BUDGET}",
                        "--GPUCR.min_resident_s=0", "--GPUCR.budget_check_interval=600", "--GPUCR.suspend_on_stop=False")
    try:
        cgroup.join(server.proc.pid)  # before any kernel: they are its children and stay in it
        await server.wait_ready()
        kids: dict[str, str] = {}
        for name in "abc":  # each started when it is used: the last started is the last used
            kids[name] = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
            if name != "c":
                assert await run(server, kids[name], fill(name)) == f"{DATA}\n"
        assert len(cgroup.pids()) > 3, "the kernels run in the server's cgroup"
        want = {"a": "running", "b": "running", "c": "running"}
        assert await states(server, kids) == want

        # c grows past the budget and keeps running its cell: a goes while it does
        # the cell ends only once the test says so: a cell's end cannot be what suspends a here
        go_on = tmp_path / "go-on"
        cell = asyncio.ensure_future(run(server, kids["c"], grow("c", f"while not os.path.exists({str(go_on)!r}): "
                                                                      "time.sleep(0.1)\n")))
        await wait_states(server, kids, {**want, "a": "suspended"}, timeout=60)
        assert not cell.done(), "a was suspended under pressure, before c's cell ended"
        go_on.touch()
        assert await cell == f"{DATA}\n"
        want["a"] = "suspended"
        kids["d"] = (await server.request("api/kernels", "POST", {"name": "python3"}))["id"]
        assert await run(server, kids["d"], fill("d")) == f"{DATA}\n"
        want |= {"b": "suspended", "d": "running"}  # the least recently used idle kernel of those left
        await wait_states(server, kids, want, timeout=30)
        await asyncio.sleep(1)  # nothing else goes
        assert await states(server, kids) == want
        reasons = {k["kernel_id"]: (k.get("checkpoint") or {}).get("reason") for k in await server.get("api/gpucr/kernels")}
        assert reasons[kids["a"]] == reasons[kids["b"]] == "memory"

        for name in "ab":  # they answer right; room is made for them as they come back
            assert await run(server, kids[name], f"print(x.count({ord(name)}))") == f"{DATA}\n"
        assert cgroup.oom_kills() == 0
        text = log.read_text()
        assert "on memory pressure in the memory cgroup" in text and "OOM killer" not in text
    finally:
        assert server.sigterm() == 0

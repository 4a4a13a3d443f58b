"""The room kept free on a GPU (``c.GPUCR.room_headroom``) holds as kernels grow, through the real
server on a real GPU: two kernels hold memory on GPU 0, a idle, b growing in a cell until less than
the headroom is free; right after b's cell a is suspended (reason ``gpu-memory``), b never, and a's
tensor comes back intact once b gave its growth back. Real NVML figures throughout. Runs on the
GPU machine (docs/dev/gpu-tests.md); skips without a GPU."""
from __future__ import annotations

import asyncio

import pytest

from jupyter_gpucr.core.gpu import cuda, gpus
from jupyter_gpucr.server.room import ROOM_EVENT_ID
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, new_session, open_ws
from tests.server.test_server_lifecycle import wait_state

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

GiB = 1 << 30
A_GIB, B_GIB, GROWTH_GIB = 4, 1, 8  # a's tensor; b's, before and what its growth adds
#: The headroom is GPU 0's free memory at the start less this: a and b (with their CUDA contexts, at
#: most 1 GiB each) leave more than it free, b's growth less, and a's suspend more again.
BESIDE_GIB = 12


@pytest.fixture
def jp_server_config(tmp_path):
    criu_or_skip()
    if not gpus.list_gpus() or cuda.unavailable_reason():
        pytest.skip(f"needs an NVIDIA GPU with the CUDA checkpoint API: {cuda.unavailable_reason() or 'no GPU'}")
    headroom = gpus.list_gpus()[0].memory_free - BESIDE_GIB * GiB
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store"), "min_resident_s": 0, "room_headroom": str(headroom)},
    }


def fill(name: str, gib: int, seed: int) -> str:
    return (f"import torch\n{name} = torch.empty({gib} << 30, dtype=torch.uint8, device='cuda:0')\n"
            f"{name}.random_(0, 256, generator=torch.Generator('cuda:0').manual_seed({seed}))\n"
            f"print(sum(int(c.sum(dtype=torch.int64)) for c in {name}.split(1 << 26)))")


async def test_an_idle_kernel_is_suspended_when_another_grows_into_the_room_kept_free(
        jp_fetch, jp_ws_fetch, jp_serverapp):
    room_events: list[dict] = []

    async def listener(logger, schema_id, data):
        room_events.append(dict(data))

    jp_serverapp.event_logger.add_listener(schema_id=ROOM_EVENT_ID, listener=listener)
    a = (await new_session(jp_fetch, "a.ipynb"))["kernel"]["id"]
    b = (await new_session(jp_fetch, "b.ipynb"))["kernel"]["id"]
    ws_a, ws_b = await open_ws(jp_ws_fetch, a, "sa"), await open_ws(jp_ws_fetch, b, "sb")
    _, sum_a, _ = await execute(ws_a, fill("x", A_GIB, 1), timeout=300)
    _, out, _ = await execute(ws_b, fill("y", B_GIB, 2), timeout=300)
    assert out.strip().isdigit(), out
    await asyncio.sleep(2)  # the checks after those cells: room was kept, nobody goes
    for kid in (a, b):
        assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"

    _, out, _ = await execute(ws_b, fill("z", GROWTH_GIB, 3), timeout=300)  # b grows into the room kept free
    assert out.strip().isdigit(), out
    st = await wait_state(jp_fetch, a, "suspended", timeout=120)
    assert st["checkpoint"]["reason"] == "gpu-memory"
    assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", b))["state"] == "running"
    suspending = [e for e in room_events if e["outcome"] == "suspending"]
    assert [(e["for"], e["kernel_id"], e["victims"]) for e in suspending] == [("headroom", b, [a])]

    _, out, _ = await execute(ws_b, "del z\ntorch.cuda.empty_cache()\nprint('given back')", timeout=300)
    assert out.strip() == "given back"
    _, again, _ = await execute(ws_a, "print(sum(int(c.sum(dtype=torch.int64)) for c in x.split(1 << 26)))",
                                timeout=300)  # restores a
    assert again.strip() == sum_a.strip(), "kernel a lost its tensor"
    await asyncio.sleep(2)  # the room kept free holds again: nobody else goes
    for kid in (a, b):
        assert (await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid))["state"] == "running"
    ws_a.close()
    ws_b.close()

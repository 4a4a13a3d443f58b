"""Make room on a real GPU through the real server: GPU 0 is filled (by another process) until two
kernels of N GiB do not fit on it at once; the second kernel's start suspends the first, and each
one's next cell restores it by suspending the other, with its tensor intact every time. Real NVML
figures throughout. Runs on the H200 machine (docs/dev/gpu-tests.md); skips without a GPU."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from jupyter_gpucr.core.gpu import cuda, gpus
from jupyter_gpucr.core.gpu.roomreport import memory_section, place_line
from jupyter_gpucr.server.lifecycle import EVENT_SCHEMA_ID, WAITING
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, new_session, open_ws

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]

GiB = 1 << 30
N = 8  # GiB each kernel holds
KEEP = int(1.5 * N * GiB) + GiB // 2  # what the filler leaves free on GPU 0: one kernel fits, two do not

FILLER = """
import sys, torch
x = torch.empty(int(sys.argv[1]), dtype=torch.uint8, device="cuda:0")
print("filled", flush=True)
sys.stdin.read()
"""


@pytest.fixture
def jp_server_config(tmp_path):
    criu_or_skip()
    if not gpus.list_gpus() or cuda.unavailable_reason():
        pytest.skip(f"needs an NVIDIA GPU with the CUDA checkpoint API: {cuda.unavailable_reason() or 'no GPU'}")
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}},
        "GPUCR": {"store": str(tmp_path / "gpucr-store"), "min_resident_s": 0, "kernel_gpu_memory": f"{N}GiB"},
    }


@pytest.fixture
def gpu0_nearly_full():
    """Another process holds all of GPU 0 but KEEP bytes (what NVML says is free, minus its own context)."""
    free = gpus.list_gpus()[0].memory_free
    proc = subprocess.Popen([sys.executable, "-c", FILLER, str(free - KEEP - GiB // 2)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "filled"
        time.sleep(1)
        yield gpus.list_gpus()[0].memory_free
    finally:
        proc.kill()
        proc.wait()


def fill(seed: int) -> str:
    return (f"import torch\nx = torch.empty({N} << 30, dtype=torch.uint8, device='cuda:0')\n"
            f"x.random_(0, 256, generator=torch.Generator('cuda:0').manual_seed({seed}))\n"
            "print(sum(int(c.sum(dtype=torch.int64)) for c in x.split(1 << 26)))")


CHECK = "print(sum(int(c.sum(dtype=torch.int64)) for c in x.split(1 << 26)))"  # an int64 copy of 8 GiB would not fit


async def test_a_start_and_each_restore_make_room_on_a_full_gpu(jp_fetch, jp_ws_fetch, jp_serverapp, gpu0_nearly_full):
    free = gpu0_nearly_full
    assert N * GiB < free < 2 * N * GiB, f"GPU 0 has {free >> 20} MiB free"
    events: list[dict] = []

    async def listener(logger, schema_id, data):
        events.append(dict(data))

    jp_serverapp.event_logger.add_listener(schema_id=EVENT_SCHEMA_ID, listener=listener)
    km = jp_serverapp.kernel_manager
    a = (await new_session(jp_fetch, "a.ipynb"))["kernel"]["id"]
    ws_a = await open_ws(jp_ws_fetch, a, "sa")
    reply, sum_a, _ = await execute(ws_a, fill(1), timeout=300)
    assert reply["content"]["status"] == "ok", sum_a

    t0 = time.monotonic()
    b = (await new_session(jp_fetch, "b.ipynb"))["kernel"]["id"]  # no room for it: a goes
    start_b = time.monotonic() - t0
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", a)
    assert (st["state"], st["checkpoint"]["reason"], st["made_room_for"]) == ("suspended", "room", b)
    ws_b = await open_ws(jp_ws_fetch, b, "sb")
    reply, sum_b, _ = await execute(ws_b, fill(2), timeout=300)
    assert reply["content"]["status"] == "ok", sum_b
    pid_b = km.get_kernel(b).provisioner.kernel_pid
    assert any(pid_b in g.processes for g in gpus.list_gpus()[:1])

    report = await fetch_json(jp_fetch, "api", "gpucr", "room")
    gpu0 = report[0]
    assert [k["kernel_id"] for k in gpu0["kernels"]] == [b] and gpu0["held_by_kernels"] >= N * GiB
    assert gpu0["idle"] == gpu0["held_by_kernels"]
    doctor_line = place_line(memory_section(gpus.list_gpus(), report, "this server", None)["places"][0])
    assert doctor_line.startswith(f"GPU 0 ({gpu0['name']}): ") and "held by 1 kernel," in doctor_line, doctor_line

    timings = {"start_b": start_b}
    for name, ws, kid, other, expected in (("a", ws_a, a, b, sum_a), ("b", ws_b, b, a, sum_b)):
        t0 = time.monotonic()
        _, out, _ = await execute(ws, CHECK, timeout=300)
        timings[f"cell_{name}"] = time.monotonic() - t0
        assert out.strip() == expected.strip(), f"kernel {name} lost its tensor"
        st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", other)
        assert (st["state"], st["made_room_for"]) == ("suspended", kid)
    waits = [e["room"]["message"] for e in events if e["state"] == WAITING]
    assert waits == ["waiting for room on GPU 0: suspending 1 idle kernel"] * 2
    print(f"\nGPU 0: {free >> 20} MiB free for kernels of {N} GiB; seconds: {timings}")
    ws_a.close()
    ws_b.close()

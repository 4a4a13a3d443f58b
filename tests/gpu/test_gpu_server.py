"""A PyTorch kernel on the GPU through the real server: suspend frees the GPU, restore brings
the tensors back, and trimming the allocator cache first shrinks the image. Runs on the H200
machine (docs/dev/gpu-tests.md); skips without a GPU."""
from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gpucr_hooks.idle import IDLE_S
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.gpu import gpus
from tests.kernel_ws import execute
from tests.server.test_server import fetch_json, jp_server_config, new_session, open_ws  # noqa: F401
from tests.server.test_server_faults import kill_9_during_suspends_and_restores

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900), pytest.mark.usefixtures("need_gpu")]

SETUP = """
import torch
torch.manual_seed(0)
keep = torch.rand(2 * 2**30 // 4, device="cuda")          # 2 GiB that must survive
tmp = torch.empty(6 * 2**30, dtype=torch.uint8, device="cuda"); tmp.fill_(1); del tmp   # 6 GiB freed, still cached
print(float(keep.sum(dtype=torch.float64)), torch.cuda.memory_reserved() >> 20)
"""


def on_gpu(pid: int) -> bool:
    return any(pid in g.processes for g in gpus.list_gpus())


async def test_trim_shrinks_gpu_kernel_image(jp_fetch, jp_ws_fetch, jp_serverapp):
    svc = jp_serverapp.kernel_manager.runtime.suspender
    kid = (await new_session(jp_fetch, "gpu.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    _, out, _ = await execute(ws, SETUP, timeout=300)
    checksum, reserved_mib = out.split()[-2:]
    assert int(reserved_mib) >= 8000
    pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.kernel_pid
    assert on_gpu(pid)

    svc.options.trim_before_suspend = svc.options.offload_gpu_tensors = False
    untrimmed = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert not on_gpu(pid), "the GPU must be free while the kernel is suspended"
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    _, out, _ = await execute(ws, "print(float(keep.sum(dtype=torch.float64)))")
    assert out.split()[-1] == checksum

    stack = ("import ctypes\n_v = ctypes.c_size_t()\n"
             "ctypes.CDLL('libcuda.so.1').cuCtxGetLimit(ctypes.byref(_v), 0)\nprint(_v.value)")
    _, stack_before, _ = await execute(ws, stack)
    svc.options.trim_before_suspend = svc.options.offload_gpu_tensors = True
    trimmed = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert trimmed["trim"]["reserved_after"] < trimmed["trim"]["reserved_before"]
    offload = trimmed["trim"]["offload"]
    assert offload["bytes"] >= 2 << 30, trimmed["trim"]  # the 2 GiB tensor went out through pinned buffers
    assert offload["files"] > 1, "parallel writers each fill their own file"
    assert "flush_wait" in trimmed["timings"], trimmed["timings"]  # the tensors were made durable beside the dump
    assert not on_gpu(pid)
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    _, out, _ = await execute(ws, "print(float(keep.sum(dtype=torch.float64)), torch.cuda.memory_reserved() >> 20)")
    assert out.split()[-2] == checksum
    _, stack_after, _ = await execute(ws, stack)
    assert int(stack_before) > 0 and stack_after == stack_before, "the stack limit given back at suspend is put back"
    a, b = untrimmed["checkpoint"]["size"], trimmed["checkpoint"]["size"]
    print(f"\nGPU kernel image: {a >> 20} MiB untrimmed, {b >> 20} MiB trimmed; timings untrimmed "
          f"{untrimmed['timings']}, trimmed {trimmed['timings']}")
    assert b < a - (4 << 30), f"trimming should drop the 6 GiB cache: {a >> 20} MiB -> {b >> 20} MiB"
    assert b < 2 << 30, f"the offloaded 2 GiB tensor must not be in the CRIU image as well: {b >> 20} MiB"
    ws.close()


LATE_TENSOR_SETUP = f"""
import threading, time, torch
keep = torch.rand(64 << 20, device="cuda")                  # 256 MiB
def _made_later():
    global late
    time.sleep({IDLE_S} + 1.0)                                # after the idle collection found the tensors
    late = torch.full((16 << 20,), 7.0, device="cuda")      # 64 MiB no cell made
threading.Thread(target=_made_later).start()
print(float(keep.sum(dtype=torch.float64)))
"""


async def test_tensors_found_while_idle_spare_the_suspend_a_search_and_one_made_since_is_kept(
        jp_fetch, jp_ws_fetch, jp_serverapp):
    """The idle kernel finds its GPU tensors after its garbage collection; a suspend before the
    next cell moves those out without searching the heap again. A tensor a thread made after that
    is not among them and still comes back (through the driver's checkpoint); a suspend right
    after a cell searches again and finds both."""
    kid = (await new_session(jp_fetch, "census.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    _, out, _ = await execute(ws, LATE_TENSOR_SETUP, timeout=300)
    checksum = out.split()[-1]
    await asyncio.sleep(IDLE_S + 2.5)
    pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.kernel_pid

    idle = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert idle["trim"]["offload"]["found_while_idle"] is True, idle["trim"]["offload"]
    assert idle["trim"]["offload"]["bytes"] == 256 << 20, "only the tensor that existed when the kernel went idle"
    assert not on_gpu(pid)
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    _, out, _ = await execute(ws, "print(float(keep.sum(dtype=torch.float64)), float(late.sum(dtype=torch.float64)))")
    assert out.split() == [checksum, str(7.0 * (16 << 20))]

    busy = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert busy["trim"]["offload"]["found_while_idle"] is False
    assert busy["trim"]["offload"]["bytes"] == (256 + 64) << 20
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    _, out, _ = await execute(ws, "print(float(keep.sum(dtype=torch.float64)), float(late.sum(dtype=torch.float64)))")
    assert out.split() == [checksum, str(7.0 * (16 << 20))]
    ws.close()


# Eight 256 MiB CUDA tensors of known contents (the suspend moves them out through the offload),
# the cell that sums them, and that sum.
EIGHT_N = (256 << 20) // 8
EIGHT_TENSORS = f"import torch\nts = [torch.arange(i, i + {EIGHT_N}, dtype=torch.int64, device='cuda') for i in range(8)]"
SUM_OF_EIGHT = "print(sum(int(t.sum()) for t in ts))"
EIGHT_SUM = sum(EIGHT_N * i + EIGHT_N * (EIGHT_N - 1) // 2 for i in range(8))


async def test_kill_9_of_the_server_during_a_gpu_suspend_or_restore_loses_nothing_and_leaks_no_gpu_process(tmp_path):
    """The fast path's states (tensors moved out to files, the driver's checkpoint, the refill)
    under kill -9 of the server: the next server lists the kernel, a cell gets every tensor back,
    and once the last server has stopped (suspending the kernel) no process holds the GPU."""
    before = {p for g in gpus.list_gpus() for p in g.processes}
    counts = await kill_9_during_suspends_and_restores(
        tmp_path, f"{EIGHT_TENSORS}\nx = 42", "print(x, sum(int(t.sum()) for t in ts))", f"42 {EIGHT_SUM}\n",
        (0.0, 0.1, 0.3, 0.6, 1.0, 2.0))
    assert counts["lost"] == 0, counts
    left = {p for g in gpus.list_gpus() for p in g.processes} - before
    assert not left, f"processes still on the GPU after every kill: {left}"


@pytest.fixture
def tmpfs_store(tmp_path, request):
    """The server's store (``jp_server_config`` puts it at tmp_path/gpucr-store) on a tmpfs of
    ``request.param`` bytes, mounted before the server starts."""
    store = tmp_path / "gpucr-store"
    store.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={request.param},mode=0700", "gpucr-test", str(store)]).returncode:
        pytest.skip("needs to mount a tmpfs (root)")
    yield store
    subprocess.run(["umount", "-l", str(store)], check=True)


@pytest.mark.parametrize("tmpfs_store, tensors_fit", [(1 << 30, False), (2300 << 20, True)], indirect=["tmpfs_store"],
                         ids=["full while the tensors are written", "full after they are written"])
async def test_a_full_store_leaves_the_gpu_kernel_running_with_every_tensor(tmpfs_store, tensors_fit, caplog, jp_fetch,
                                                                            jp_ws_fetch, jp_serverapp):
    """Disk full on the fast path: with 1 GiB the tensors' writes fail before anything left the
    GPU; with 2.3 GiB they fit and the checkpoint's own space check refuses after, so the tensors
    go back from the files. Either way the suspend says why and the kernel runs on, on the GPU,
    with every tensor, and nothing of the attempt is left in the store."""
    kid = (await new_session(jp_fetch, "full.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    _, out, _ = await execute(ws, f"{EIGHT_TENSORS}\n{SUM_OF_EIGHT}", timeout=300)
    assert int(out) == EIGHT_SUM
    pid = jp_serverapp.kernel_manager.get_kernel(kid).provisioner.kernel_pid
    with pytest.raises(HTTPClientError) as err:
        await jp_fetch("api", "gpucr", "kernels", kid, "suspend", method="POST", body="{}")
    body = json.loads(err.value.response.body)
    failed_writes = [r.getMessage() for r in caplog.records if "did not answer before the suspend" in r.getMessage()]
    if tensors_fit:  # they went out to the files and came back from them
        assert failed_writes == []
        back = [r.getMessage() for r in caplog.records if "took its GPU tensors back" in r.getMessage()]
        assert back and int(back[0].rsplit("(", 1)[1].split()[0]) >= 2048, back
    else:
        assert failed_writes and "No space left on device" in failed_writes[0], failed_writes
    assert "Not enough disk" in body["message"] and "left running" in body["message"], body
    assert "Free disk space" in body["hint"], body
    st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
    assert st["state"] == "running" and "Not enough disk" in st["error"], st
    assert on_gpu(pid)
    _, again, _ = await execute(ws, "print(sum(int(t.sum()) for t in ts), sum(t.numel() for t in ts))")
    assert again.split() == [out.strip(), str(8 * EIGHT_N)]
    deadline = time.monotonic() + 10  # the refilled folder is deleted behind the reply
    while (left := _large_files(tmpfs_store)) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert left == [], f"the failed suspend left large files in the store: {left}"
    ws.close()


def _large_files(root: Path) -> list[Path]:
    found = []
    for p in root.rglob("*"):
        with contextlib.suppress(FileNotFoundError):  # being deleted meanwhile
            if p.is_file() and p.stat().st_size > 1 << 20:
                found.append(p.relative_to(root))
    return found


HOG = """
import sys, time, torch
hogs = []
for d in range(torch.cuda.device_count()):  # every GPU: auto placement would pick another
    free, _total = torch.cuda.mem_get_info(d)
    hogs.append(torch.empty(free - int(sys.argv[1]), dtype=torch.uint8, device=f"cuda:{d}"))
print("ready", flush=True)
time.sleep(600)
"""


def _needed_and_free_mib(message: str) -> tuple[float, list[float]]:
    """What a refusal for want of GPU memory says is needed and free, in MiB: the room maker's
    words ("No room for 2.6 GiB: on GPU 0 1.5 GiB free", when the manifest reports the offload's
    bytes per GPU) or the placement's ("has the 2650 MiB free this process needs ... GPU 0 ...:
    1530 MiB free", for an older checkpoint)."""
    room = re.search(r"No room for ([\d.]+) GiB: on GPU \d+ ([\d.]+) GiB free", message)
    if room:
        return float(room[1]) * 1024, [float(room[2]) * 1024]
    need = re.search(r"has the (\d+) MiB free this process needs", message)
    free = [float(m) for m in re.findall(r"GPU \d+ [^:]*: (\d+) MiB free", message)]
    assert need and free, message
    return float(need[1]), free


@pytest.mark.parametrize("reported", [True, False], ids=["bytes-per-gpu-reported", "older-checkpoint"])
async def test_a_gpu_without_room_for_the_offloaded_tensors_is_refused_before_anything_is_restored(
        reported, jp_fetch, jp_ws_fetch, jp_serverapp):
    """What the driver restores of a suspended kernel is only its context; its tensors come back
    from the offload's files after. A GPU with room for the context but not the tensors must be
    refused up front, with what is needed and free, and the kernel stays suspended; once the GPU
    has room, it restores with every tensor. A checkpoint whose manifest lacks the offload's bytes
    per GPU (taken by a server from before that report) counts its offload folder instead."""
    kid = (await new_session(jp_fetch, "busy.ipynb"))["kernel"]["id"]
    ws = await open_ws(jp_ws_fetch, kid)
    _, out, _ = await execute(ws, f"{EIGHT_TENSORS}\n{SUM_OF_EIGHT}", timeout=300)
    suspended = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "suspend", method="POST", body={})
    assert suspended["trim"]["offload"]["bytes"] >= 2 << 30, suspended["trim"]
    if not reported:
        ckpt = jp_serverapp.kernel_manager.runtime.checkpointer.store.latest(kid)
        manifest = json.loads((ckpt.path / "manifest.json").read_text())
        assert manifest["offload"].pop("bytes_by_gpu")
        (ckpt.path / "manifest.json").write_text(json.dumps(manifest))
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(1536 << 20)], stdout=subprocess.PIPE, text=True)
    try:
        assert hog.stdout is not None and hog.stdout.readline().strip() == "ready"
        with pytest.raises(HTTPClientError) as err:
            await jp_fetch("api", "gpucr", "kernels", kid, "resume", method="POST", body="{}")
        body = json.loads(err.value.response.body)
        need_mib, free_mib = _needed_and_free_mib(body["message"])
        assert need_mib > (2 << 10) > max(free_mib), body
        assert "Free GPU memory" in body["hint"] or "Suspend or shut down a kernel" in body["hint"], body
        st = await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid)
        assert st["state"] == "suspended" and "B free" in st["error"], st
    finally:
        hog.kill()
        hog.wait()
    await fetch_json(jp_fetch, "api", "gpucr", "kernels", kid, "resume", method="POST", body={})
    _, again, _ = await execute(ws, SUM_OF_EIGHT)
    assert again == out
    ws.close()

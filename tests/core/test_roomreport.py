"""The doctor's memory section from GPUs as NVML describes them (values here: this machine has no
GPU) and a server's room report: each GPU once, the server's share where it gave one."""
from __future__ import annotations

from jupyter_gpucr.core.gpu.gpus import Gpu
from jupyter_gpucr.core.gpu.roomreport import memory_lines, memory_section

GiB = 1 << 30
H200 = Gpu(0, "GPU-a", "NVIDIA H200", 141 * GiB, 75 * GiB, 66 * GiB)
OTHER = Gpu(1, "GPU-b", "NVIDIA H200", 141 * GiB, 1 * GiB, 140 * GiB)
HOST = {"where": "host memory", "total": 8 * GiB, "used": 2 * GiB, "free": 6 * GiB, "held_by_kernels": 2 * GiB,
        "idle": 0, "kernels": [{"kernel_id": "k2", "bytes": 2 * GiB, "idle_s": 3.0, "kept": "used in the last 300 s"}]}


def test_without_a_server_each_gpu_has_its_totals_and_the_kernels_were_not_counted():
    section = memory_section([H200], None, None, "No running Jupyter server found for this user.")
    assert memory_lines(section) == [
        "GPU memory:",
        "    GPU 0 (NVIDIA H200): 75.0 GiB of 141.0 GiB used by all processes, 66.0 GiB free",
        "    kernels: not counted (No running Jupyter server found for this user. "
        "'gpucr kernel room --server URL --token TOKEN' asks a given server.)"]


def test_a_servers_share_goes_with_its_gpu_and_the_host_budget_comes_last():
    gpu0 = {"where": "GPU 0", "index": 0, "uuid": "GPU-a", "name": "NVIDIA H200", "total": 141 * GiB,
            "used": 75 * GiB, "free": 66 * GiB, "held_by_kernels": 61 * GiB, "idle": 40 * GiB,
            "kernels": [{"kernel_id": "k1", "bytes": 40 * GiB, "idle_s": 900.0, "kept": None},
                        {"kernel_id": "k3", "bytes": 21 * GiB, "idle_s": 1.0, "kept": "running a cell"}]}
    section = memory_section([H200, OTHER], [gpu0, HOST], "http://127.0.0.1:8888/", None)
    assert [p["where"] for p in section["places"]] == ["GPU 0", "GPU 1", "host memory"]
    assert memory_lines(section)[1:] == [
        "    GPU 0 (NVIDIA H200): 75.0 GiB of 141.0 GiB used by all processes, 61.0 GiB of it held by 2 kernels, "
        "40.0 GiB idle (could be made room of); 66.0 GiB free",
        "    GPU 1 (NVIDIA H200): 1.0 GiB of 141.0 GiB used by all processes, 140.0 GiB free",
        "    host memory budget: 2.0 GiB of 8.0 GiB counted for kernels, 2.0 GiB of it held by 1 kernel, "
        "none of it idle; 6.0 GiB free",
        "    kernels: as the Jupyter server at http://127.0.0.1:8888/ counts them"]


def test_no_gpu_is_said_plainly_and_a_place_without_kernels_says_so():
    empty = {**HOST, "used": 0, "free": 8 * GiB, "held_by_kernels": 0, "kernels": []}
    assert memory_lines(memory_section([], [empty], "http://s/", None))[1:3] == [
        "    no GPU", "    host memory budget: 0 MiB of 8.0 GiB counted for kernels, none of it by a kernel; 8.0 GiB free"]

"""What a CUDA context still holds once a notebook's tensors are gone, and what the stack limit
gives back (issue 11's W2 notebook; needs a GPU, PyTorch and transformers).

Prints one JSON line: MiB in use with the model, after its tensors are gone, and after setting
``CU_LIMIT_STACK_SIZE`` to 512 / 256 / 64 / 0 bytes (each ``[rc, limit, MiB in use, seconds]``),
then whether a generation still runs afterwards. Run as ``python3 bench/bench_context.py``.
"""
from __future__ import annotations

import ctypes
import gc
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import torch  # noqa: E402
from w2_workload import GPU_CELL, GPU_SETUP  # noqa: E402

CU_LIMIT_STACK_SIZE = 0


def main() -> None:
    ns: dict = {}
    exec(GPU_SETUP, ns)
    exec(GPU_CELL, ns)
    cuda = ctypes.CDLL("libcuda.so.1")

    def used_mib() -> int:
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info(0)
        return (total - free) >> 20

    def stack_limit() -> int:
        value = ctypes.c_size_t()
        cuda.cuCtxGetLimit(ctypes.byref(value), CU_LIMIT_STACK_SIZE)
        return value.value

    out = {"with_model": used_mib(), "stack_limit": stack_limit()}
    weights = {k: v.to("cpu") for k, v in ns["model"].state_dict().items()}
    ns["model"].to("meta")
    del ns["kv"]
    gc.collect()
    torch.cuda.empty_cache()
    out["tensors_gone"] = used_mib()
    for size in (512, 256, 64, 0):
        t0 = time.perf_counter()
        rc = cuda.cuCtxSetLimit(CU_LIMIT_STACK_SIZE, ctypes.c_size_t(size))
        out[f"stack_{size}"] = [rc, stack_limit(), used_mib(), round(time.perf_counter() - t0, 4)]
    ns["model"].to_empty(device="cuda:0")
    ns["model"].load_state_dict(weights)
    t0 = time.perf_counter()
    exec(GPU_CELL, ns)
    out.update(cell_after_s=round(time.perf_counter() - t0, 2), used_after_cell=used_mib())
    print(json.dumps(out))


if __name__ == "__main__":
    main()

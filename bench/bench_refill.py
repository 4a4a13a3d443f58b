"""The refill after a restore, alone and repeated: gpucr_hooks' real offload and refill of a
W2-sized set of CUDA storages in this process (no CRIU), against copying straight from the offload
files' own pages (mapped and registered with the driver, no staging buffers).

    python bench/bench_refill.py [--gb 6] [--rounds 3] [--dir /dev/shm]

Each round: offload the storages into a fresh folder (GPU memory freed), then refill them
(the timings ``reload_tensors_from`` reports), checking the bytes; then offload again and refill
by the direct path, checking again. Needs a GPU and PyTorch.
"""
from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernel_hooks"))
import torch  # noqa: E402
from gpucr_hooks import offload  # noqa: E402

CU_HOST_REGISTER_PORTABLE, CU_HOST_REGISTER_READ_ONLY = 1, 8
MAP_POPULATE = 0x8000


def make_storages(total: int) -> list[torch.Tensor]:
    """Tensors of W2's mix of sizes (a 164 MiB embedding, 35 MiB and 10 MiB matrices), filled
    with a pattern that tells any misplaced chunk apart."""
    sizes, left = [], total
    for size in [164 << 20] * 2 + [35 << 20, 35 << 20, 35 << 20, 10 << 20] * 1000:
        if left < size:
            break
        sizes.append(size)
        left -= size
    tensors = []
    for i, size in enumerate(sizes):
        t = torch.empty(size // 8, dtype=torch.int64, device="cuda:0")
        t.copy_(torch.arange(size // 8, device="cuda:0") * 7919 + i)
        tensors.append(t)
    torch.cuda.synchronize()
    return tensors


def digest(tensors: list[torch.Tensor]) -> list[int]:
    return [int(t[:: 4099].sum()) + int(t[-1]) for t in tensors]


def direct_refill(path: str) -> dict[str, float]:
    """Refill from the files' pages: map each file (populated), register the mapping with the
    driver, copy every chunk from it."""
    t0 = time.perf_counter()
    cudart, libc = torch.cuda.cudart(), offload._libc
    names = sorted((n for n in os.listdir(path) if n.endswith(".bin")), key=lambda n: int(n[:-4]))
    mapped: list[tuple[int, int]] = []
    for name in names:
        fd = os.open(os.path.join(path, name), os.O_RDONLY)
        size = os.fstat(fd).st_size
        address = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED | MAP_POPULATE, fd, 0)
        os.close(fd)
        if address in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), "mmap of an offload file failed")
        mapped.append((address, size))
    t_mapped = time.perf_counter()
    for address, size in mapped:
        rc = int(cudart.cudaHostRegister(address, size, CU_HOST_REGISTER_PORTABLE | CU_HOST_REGISTER_READ_ONLY))
        if rc != 0:
            raise RuntimeError(f"cudaHostRegister of a file mapping failed: error {rc}")
    t_registered = time.perf_counter()
    for st, _offset, size in offload._offloaded:
        st.resize_(size)
    for st, offset, size in offload._offloaded:
        dst = offload._bytes_of(torch, st)
        for off in range(0, size, offload.CHUNK):
            n = min(offload.CHUNK, size - off)
            stripe, at = offload._placed[offset + off]
            src = torch.frombuffer((ctypes.c_char * n).from_address(mapped[stripe][0] + at), dtype=torch.uint8)
            dst[off:off + n].copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    t_copied = time.perf_counter()
    offload.stacks.restore(torch)
    for address, size in mapped:
        cudart.cudaHostUnregister(address)
        libc.munmap(address, size)
    offload._offloaded.clear()
    offload._placed.clear()
    offload._folder = None
    return {"seconds": round(time.perf_counter() - t0, 3), "map_s": round(t_mapped - t0, 3),
            "register_s": round(t_registered - t_mapped, 3), "copy_s": round(t_copied - t_registered, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gb", type=float, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    tensors = make_storages(int(args.gb * (1 << 30)))
    reference = digest(tensors)
    total = sum(t.nbytes for t in tensors)
    print(f"{len(tensors)} storages, {total / 1e9:.2f} GB", flush=True)
    for i in range(args.rounds):
        for how in ("staged (gpucr)", "direct from the files"):
            path = os.path.join(args.dir, f"gpucr-refill-{i}-{how[0]}")
            out = offload.offload_tensors(path, collect=False)
            if how.startswith("staged"):
                back = offload.reload_tensors_from(path)
            else:
                back = direct_refill(path)
                shutil.rmtree(path)
            same = digest(tensors) == reference
            print(f"round {i + 1}, {how}: offload {out['seconds']:.3f} s; refill {json.dumps(back)}; bytes intact: {same}",
                  flush=True)
            time.sleep(1)  # the staged path deletes its folder in the background


if __name__ == "__main__":
    main()

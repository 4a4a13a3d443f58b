"""The ceilings the fast path works against, measured on the machine it runs on: writing fresh
tmpfs pages (one and several threads), reading them back, and pinned device<->host copies in the
chunk size the tensor offload uses.

    python bench/bench_bandwidth.py [--gb 6] [--dir /dev/shm]
"""
from __future__ import annotations

import argparse
import os
import time
from concurrent.futures import ThreadPoolExecutor

CHUNK = 64 << 20


def write_file(path: str, total: int, threads: int) -> float:
    buf = b"\1" * CHUNK
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.ftruncate(fd, total)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda off: os.pwrite(fd, buf, off), range(0, total, CHUNK)))
    os.close(fd)
    return total / (time.perf_counter() - t0) / 1e9


def read_file(path: str, total: int, threads: int) -> float:
    fd = os.open(path, os.O_RDONLY)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda off: len(os.pread(fd, CHUNK, off)), range(0, total, CHUNK)))
    os.close(fd)
    return total / (time.perf_counter() - t0) / 1e9


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=6)
    ap.add_argument("--dir", default="/dev/shm")
    args = ap.parse_args()
    total = int(args.gb * (1 << 30)) // CHUNK * CHUNK
    path = os.path.join(args.dir, "gpucr-bandwidth.bin")
    for threads in (1, 4, 8):
        print(f"write fresh tmpfs pages, {threads} thread(s): {write_file(path, total, threads):.2f} GB/s")
        print(f"read them back, {threads} thread(s): {read_file(path, total, threads):.2f} GB/s")
        os.unlink(path)
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available():
        return
    src = torch.empty(total, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for off in range(0, total, CHUNK):
        pinned.copy_(src[off:off + CHUNK])
    d2h = total / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    for off in range(0, total, CHUNK):
        src[off:off + CHUNK].copy_(pinned)
    torch.cuda.synchronize()
    h2d = total / (time.perf_counter() - t0) / 1e9
    print(f"device -> pinned, 64 MiB synchronous chunks: {d2h:.2f} GB/s; pinned -> device: {h2d:.2f} GB/s")


if __name__ == "__main__":
    main()

"""The ceilings the fast path works against, measured on the machine it runs on: writing fresh
tmpfs pages (one and several threads), reading them back, faulting in fresh anonymous memory with
4 KiB and with transparent huge pages, and device<->host copies: through a pinned staging buffer
in the chunk size the tensor offload uses, into a whole pinned allocation, and into huge-page
memory registered with the driver.

    python bench/bench_bandwidth.py [--gb 6] [--dir /dev/shm]
"""
from __future__ import annotations

import argparse
import mmap
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CHUNK = 64 << 20
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def fresh_anonymous(total: int, huge: bool) -> tuple[mmap.mmap, float]:
    """Fault in `total` bytes of new anonymous memory; returns the mapping and GB/s."""
    region = mmap.mmap(-1, total, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge:
        region.madvise(mmap.MADV_HUGEPAGE)
    buf = b"\1" * CHUNK
    t0 = time.perf_counter()
    for off in range(0, total, CHUNK):
        region[off:off + CHUNK] = buf
    return region, total / (time.perf_counter() - t0) / 1e9


def disk_bandwidth(directory: Path, gb: float, threads: int = 8) -> dict[str, float]:
    """Write ``gb`` into ``threads`` files and fsync them, then read them back after evicting them
    from the page cache: what a suspend to this disk and a resume from it cannot beat."""
    from tests.pagecache import evict

    per = int(gb * (1 << 30)) // threads // CHUNK * CHUNK
    paths = [directory / f"gpucr-bandwidth-{i}.bin" for i in range(threads)]
    buf = os.urandom(CHUNK)

    def write(path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for off in range(0, per, CHUNK):
            os.pwrite(fd, buf, off)
        os.fsync(fd)
        os.close(fd)

    def read(path: Path) -> None:
        fd = os.open(path, os.O_RDONLY)
        for off in range(0, per, CHUNK):
            os.pread(fd, CHUNK, off)
        os.close(fd)

    try:
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(write, paths))
        write_s = time.perf_counter() - t0
        evict(paths)
        t0 = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, paths))
        read_s = time.perf_counter() - t0
    finally:
        for path in paths:
            path.unlink(missing_ok=True)
    return {"write_gbs": per * threads / write_s / 1e9, "read_gbs": per * threads / read_s / 1e9}


def gpu_copies(total: int) -> None:
    import ctypes

    import torch

    src = torch.empty(total, dtype=torch.uint8, device="cuda")
    staging = torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for off in range(0, total, CHUNK):
        staging.copy_(src[off:off + CHUNK])
    d2h = total / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    for off in range(0, total, CHUNK):
        src[off:off + CHUNK].copy_(staging)
    torch.cuda.synchronize()
    h2d = total / (time.perf_counter() - t0) / 1e9
    print(f"device -> pinned, 64 MiB synchronous chunks: {d2h:.2f} GB/s; pinned -> device: {h2d:.2f} GB/s")

    t0 = time.perf_counter()
    whole = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    alloc = time.perf_counter() - t0
    t0 = time.perf_counter()
    whole.copy_(src)
    copy = time.perf_counter() - t0
    print(f"pinned allocation of {total / 1e9:.1f} GB: {alloc:.2f} s; device -> it in one copy: {copy:.2f} s")
    del whole

    region, _ = fresh_anonymous(total, huge=True)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    t0 = time.perf_counter()
    err = torch.cuda.cudart().cudaHostRegister(address, total, 0)
    register = time.perf_counter() - t0
    host = torch.frombuffer(region, dtype=torch.uint8)
    t0 = time.perf_counter()
    host.copy_(src)
    copy = time.perf_counter() - t0
    print(f"cudaHostRegister of faulted huge-page memory: {register:.2f} s (error {int(err)}); "
          f"device -> it in one copy: {copy:.2f} s")
    torch.cuda.cudart().cudaHostUnregister(address)


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
    for huge in (False, True):
        region, rate = fresh_anonymous(total, huge)
        region.close()
        print(f"fault in fresh anonymous memory, {'transparent huge pages' if huge else '4 KiB pages'}: {rate:.2f} GB/s")
    try:
        import torch
    except ImportError:
        return
    if torch.cuda.is_available():
        gpu_copies(total)


if __name__ == "__main__":
    main()

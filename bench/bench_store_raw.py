"""How close gpucr's uploads and downloads come to an S3 store's raw rate: the same bytes, the same
store, put and got by a plain client at its best concurrency, then by gpucr's own paths.

    .venv/bin/python bench/bench_store_raw.py --gb 2 --weed /tmp/weed           # SeaweedFS, data in /dev/shm
    .venv/bin/python bench/bench_store_raw.py --gb 2 --s3 env --bucket BUCKET   # the store AWS_* point at

``--gb`` GiB of random bytes shaped like a W2 checkpoint (a process image of 22 %, the rest in
``--tensor-files`` offloaded tensor files of the process's folder, and 40 small image files) in
``--src``; the prefix is emptied before each upload. Each round, in this order:

- raw boto3 ``CONC/PART``: s3transfer's TransferManager, one pool of ``CONC`` threads for all
  files, parts of ``PART`` MiB (``--raw``; boto3 needed);
- raw s3fs ``BATCH/CONC``: ``S3FileSystem.put``/``get`` with ``batch_size=BATCH`` files at once
  and ``max_concurrency=CONC`` parts of each;
- gpucr put_files / get_files: ``ObjectStore.put_files`` and its ranged download (``--sealed``:
  also with an encryption key);
- gpucr suspend upload: what a suspend does, the process image copied into a folder as CRIU
  writes it while ``StreamingUpload`` follows (the tensor files handed to it as they are final
  before the dump), then ``ObjectStore.put_files`` for what it did not complete.

Prints MB/s (10^6 bytes), the seconds, the CPU seconds of this process and of the S3 server
(SeaweedFS), and each path's share of the best raw rate; JSON with ``--json-out``. The
SeaweedFS server keeps its data in ``--s3-data`` (default in /dev/shm, so that its disk is out of
the picture); ``--weed-flag`` gives it more flags (``--raw-only`` to compare them).
"""
from __future__ import annotations

import argparse
import contextlib
import filecmp
import importlib.util
import json
import os
import platform
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3_server  # noqa: E402

from jupyter_gpucr.core.objectstore import bucket, streamup  # noqa: E402
from jupyter_gpucr.core.objectstore.bucket import ObjectStore  # noqa: E402
from jupyter_gpucr.core.objectstore.sealing import StoreKey  # noqa: E402
from tests.s3 import environ  # noqa: E402

PREFIX, USER = "gpucr-raw", "bench"
IMAGE_SHARE = 0.22  # of W2's checkpoint on the H200: 1.75 GB of CRIU images, 6.07 GB of offloaded tensors
SMALL_FILES = 40
WRITE = 4 << 20  # bytes per write of the simulated dump


def make_files(src: Path, gb: float, tensor_files: int) -> dict[str, int]:
    """Random files shaped like a checkpoint, below ``src`` by their keys; (re)made only if their sizes differ."""
    total = int(gb * 2**30)
    pages = int(total * IMAGE_SHARE)
    shape = {"checkpoint/images/pages-1.img": pages}
    shape.update({f"checkpoint/images/small-{i}.img": 4096 * (i + 1) for i in range(SMALL_FILES)})
    each = (total - sum(shape.values())) // tensor_files
    shape.update({f"proc/gpu-tensors/{i}.bin": each for i in range(tensor_files)})
    if {str(p.relative_to(src)): p.stat().st_size for p in src.rglob("*") if p.is_file()} != shape if src.exists() else True:
        shutil.rmtree(src, ignore_errors=True)
        for key, size in shape.items():
            (src / key).parent.mkdir(parents=True, exist_ok=True)
            with open(src / key, "wb") as f:
                for at in range(0, size, 64 << 20):
                    f.write(os.urandom(min(64 << 20, size - at)))
    return shape


class Meter:
    """Seconds, this process's CPU seconds and the S3 server's, over a block."""

    def __init__(self, server_pid: int | None) -> None:
        self.server_pid = server_pid

    def server_cpu(self) -> float | None:
        if self.server_pid is None:
            return None
        fields = Path(f"/proc/{self.server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    @contextlib.contextmanager
    def measure(self, row: dict[str, Any]) -> Iterator[None]:
        c0, s0, t0 = os.times(), self.server_cpu(), time.perf_counter()
        yield
        seconds, c1, s1 = time.perf_counter() - t0, os.times(), self.server_cpu()
        row.update(seconds=round(seconds, 3), client_cpu_s=round(c1.user + c1.system - c0.user - c0.system, 2),
                   server_cpu_s=round(s1 - s0, 2) if s0 is not None and s1 is not None else None)


# -- the clients ----------------------------------------------------------------------------
def boto3_client(concurrency: int) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(max_pool_connections=concurrency + 4))


def raw_boto3(bucket: str, shape: dict[str, int], src: Path, dst: Path, up: bool, concurrency: int, part_mib: int) -> None:
    from boto3.s3.transfer import TransferConfig
    from s3transfer.manager import TransferManager

    config = TransferConfig(max_concurrency=concurrency, multipart_chunksize=part_mib << 20,
                            multipart_threshold=part_mib << 20)
    with TransferManager(boto3_client(concurrency), config) as tm:
        if up:
            done = [tm.upload(str(src / key), bucket, f"{PREFIX}/{USER}/{key}") for key in shape]
        else:
            done = [tm.download(bucket, f"{PREFIX}/{USER}/{key}", str(dst / key)) for key in shape]
        for future in done:
            future.result()


def raw_s3fs(bucket: str, shape: dict[str, int], src: Path, dst: Path, up: bool, batch: int, concurrency: int) -> None:
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True, max_concurrency=concurrency,
                           config_kwargs={"max_pool_connections": batch * concurrency})
    remote = [f"{bucket}/{PREFIX}/{USER}/{key}" for key in shape]
    if up:
        fs.put([str(src / key) for key in shape], remote, batch_size=batch)
    else:
        fs.get(remote, [str(dst / key) for key in shape], batch_size=batch)


def suspend_upload(store: ObjectStore, shape: dict[str, int], src: Path, work: Path) -> dict[str, int]:
    """What a suspend uploads: the image files written into a folder as CRIU writes them while
    StreamingUpload follows, the tensor files handed to it at the dump's start, then put_files for the
    rest. The bytes sent while the 'dump' ran."""
    images = work / "images"
    shutil.rmtree(images, ignore_errors=True)
    images.mkdir(parents=True)
    early = [(str(src / key), f"proc/{key.split('/', 1)[1]}") for key in shape if key.startswith("proc/")]
    with streamup.StreamingUpload(store, "ckpt", images, "bench-node", early) as stream:
        for key in (k for k in shape if k.startswith("checkpoint/images/")):
            with open(src / key, "rb") as f, open(images / key.rsplit("/", 1)[1], "wb") as out:
                while chunk := f.read(WRITE):
                    out.write(chunk)
    done = stream.result()  # its keys are the shape's: checkpoint/images/..., proc/...
    rest = [(str(images / k.rsplit("/", 1)[1] if k.startswith("checkpoint/") else src / k), f"ckpt/{k}")
            for k in shape if k not in done]
    store.put_files(rest)
    shutil.rmtree(images, ignore_errors=True)
    return {"during_dump": stream.during_dump, "completed_beside_dump": sum(done.values()), "left_after": len(rest)}


# -- the rounds -----------------------------------------------------------------------------
Fresh = Callable[[], contextlib.AbstractContextManager[tuple[str, Meter]]]


def one_round(args: argparse.Namespace, fresh: Fresh, shape: dict[str, int], key: StoreKey | None) -> list[dict]:
    """Each path's upload, then its download, on a fresh server (SeaweedFS does not reuse the space
    of deleted objects until it vacuums: repeated uploads run out of volumes) or an emptied prefix."""
    src, dst = args.src / "files", args.src / "back"
    total = sum(shape.values())
    rows: list[dict[str, Any]] = []

    def timed(meter: Meter, name: str, direction: str, fn: Callable[[], Any], check: bool = False) -> None:
        shutil.rmtree(dst, ignore_errors=True)
        for k in shape:
            (dst / k).parent.mkdir(parents=True, exist_ok=True)
        row: dict[str, Any] = {"path": name, "direction": direction, "bytes": total}
        with meter.measure(row):
            extra = fn()
        row["mb_s"] = round(total / row["seconds"] / 1e6, 1)
        if isinstance(extra, dict):
            row.update(extra)
        if check:
            row["identical"] = all(filecmp.cmp(src / k, dst / k, shallow=False) for k in shape)
        rows.append(row)
        print(f"  {name:34} {direction:4} {row['mb_s']:8.1f} MB/s {row['seconds']:7.2f} s  cpu here {row['client_cpu_s']:6.2f} s, "
              f"server {row['server_cpu_s']} s{'' if row.get('identical', True) else '  NOT IDENTICAL'}", flush=True)

    for spec in args.raw:
        kind, a, b = spec.split(":")
        with fresh() as (bucket, meter):
            if kind == "boto3":
                name = f"raw boto3 TransferManager {a}/{b}M"
                timed(meter, name, "up", partial(raw_boto3, bucket, shape, src, dst, True, int(a), int(b)))
                timed(meter, name, "down", partial(raw_boto3, bucket, shape, src, dst, False, int(a), int(b)), True)
            else:
                name = f"raw s3fs batch {a} x {b}"
                timed(meter, name, "up", partial(raw_s3fs, bucket, shape, src, dst, True, int(a), int(b)))
                timed(meter, name, "down", partial(raw_s3fs, bucket, shape, src, dst, False, int(a), int(b)), True)
    for name, sealed in [] if args.raw_only else [("gpucr", None)] + ([("gpucr sealed", key)] if key else []):
        with fresh() as (bucket, meter):
            store = ObjectStore(f"s3://{bucket}/{PREFIX}", user=USER, key=sealed)
            timed(meter, f"{name} put_files", "up", partial(store.put_files, [(str(src / k), k) for k in shape]))
            timed(meter, f"{name} get_files", "down",
                  partial(store.get_files, [(k, str(dst / k), size) for k, size in shape.items()]), True)
        with fresh() as (bucket, meter):
            store = ObjectStore(f"s3://{bucket}/{PREFIX}", user=USER, key=sealed)
            timed(meter, f"{name} suspend upload", "up", partial(suspend_upload, store, shape, src, args.src / "work"))
    return rows


def summary(rows: list[dict]) -> str:
    by: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        by.setdefault((r["path"], r["direction"]), []).append(r["mb_s"])
    best = {d: max((statistics.median(v) for (p, dd), v in by.items() if dd == d and p.startswith("raw")), default=0)
            for d in ("up", "down")}
    lines = [f"{'':36} {'':4} {'MB/s (median)':>14} {'min-max':>16} {'of best raw':>12}"]
    for (path, direction), vals in by.items():
        med = statistics.median(vals)
        share = f"{med / best[direction]:.0%}" if best[direction] else "-"
        lines.append(f"{path:36} {direction:4} {med:14.1f} {min(vals):7.1f}-{max(vals):<8.1f} {share:>12}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=2.0, help="GiB of random bytes")
    ap.add_argument("--tensor-files", type=int, default=16, help="offloaded tensor files (one per writer thread)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--s3", choices=["weed", "moto", "env"], default="weed")
    ap.add_argument("--weed", default=shutil.which("weed"), help="SeaweedFS's weed binary (default: on PATH)")
    ap.add_argument("--weed-flag", action="append", default=[], help="one more flag for weed mini (repeatable)")
    ap.add_argument("--s3-data", type=Path, default=Path("/dev/shm/gpucr-raw-s3"), help="the SeaweedFS server's data")
    ap.add_argument("--bucket", help="--s3 env: the bucket")
    ap.add_argument("--src", type=Path, default=Path("/dev/shm/gpucr-raw-files"), help="the files and their copies")
    ap.add_argument("--raw", nargs="*", default=["boto3:8:32", "boto3:16:32", "boto3:32:32", "s3fs:8:4", "s3fs:16:10"],
                    help="plain clients: boto3:CONCURRENCY:PART_MIB, s3fs:BATCH:CONCURRENCY")
    ap.add_argument("--raw-only", action="store_true", help="the plain clients only (to compare the server's flags)")
    ap.add_argument("--sealed", action="store_true", help="gpucr's paths with an encryption key too")
    ap.add_argument("--streams", type=int, help="gpucr's parts in flight at once (bucket.STREAMS, streamup.IN_FLIGHT)")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if any(r.startswith("boto3:") for r in args.raw) and importlib.util.find_spec("boto3") is None:
        print("boto3 is not installed (scripts/s3-carry.sh carries it): its rows are left out", flush=True)
        args.raw = [r for r in args.raw if not r.startswith("boto3:")]
    if args.streams:  # read when an upload or download starts
        bucket.STREAMS = streamup.STREAMS = streamup.IN_FLIGHT = args.streams
    shape = make_files(args.src / "files", args.gb, args.tensor_files)
    print(f"{sum(shape.values()) / 1e9:.2f} GB in {len(shape)} files; {os.cpu_count()} CPUs on {platform.node()}",
          flush=True)
    key = StoreKey(os.urandom(32), "bench") if args.sealed else None
    if args.s3 == "weed" and not args.weed:
        ap.error("no weed binary: give --weed PATH (SeaweedFS), or --s3 moto / env")
    if args.s3 == "env" and not args.bucket:
        ap.error("--s3 env needs --bucket")
    servers: list[str] = []

    @contextlib.contextmanager
    def fresh() -> Iterator[tuple[str, Meter]]:
        if args.s3 == "weed":
            shutil.rmtree(args.s3_data, ignore_errors=True)
            try:
                with s3_server.seaweedfs(args.weed, args.s3_data, args.src / "weed.log", args.weed_flag) as s3, \
                        environ(s3.env):
                    servers.append(f"{s3.name}, data {s3_server.medium(args.s3_data)}")
                    yield s3.bucket, Meter(s3.pid)
            finally:
                shutil.rmtree(args.s3_data, ignore_errors=True)
            return
        with contextlib.ExitStack() as stack:
            if args.s3 == "moto":
                s3 = stack.enter_context(s3_server.moto(args.src / "moto.log"))
                stack.enter_context(environ(s3.env))
            else:
                s3 = s3_server.S3Server("the store AWS_* name", os.environ.get("AWS_ENDPOINT_URL", ""), args.bucket, {}, None)
            servers.append(s3.name)
            try:
                yield s3.bucket, Meter(None)
            finally:
                ObjectStore(f"s3://{s3.bucket}/{PREFIX}", user=USER).delete("", recursive=True)

    rows = []
    for n in range(1, args.rounds + 1):
        print(f"round {n}", flush=True)
        rows += one_round(args, fresh, shape, key)
    text = summary(rows)
    print(text)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
              "cpus": os.cpu_count(), "command": " ".join([Path(sys.executable).name, *sys.argv]), "s3": servers[0] if servers else None,
              "weed_flags": args.weed_flag,
              "streams": bucket.STREAMS, "bytes": sum(shape.values()), "files": len(shape), "rows": rows,
              "summary": text}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2))
    shutil.rmtree(args.src / "back", ignore_errors=True)


if __name__ == "__main__":
    main()

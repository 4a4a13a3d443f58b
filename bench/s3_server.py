"""A real S3 server on localhost for the object-storage benches: SeaweedFS (``weed mini``: master,
volume server, filer and S3 gateway in one process, its data in a directory given, with a key and
secret of its own) or moto's server (objects in one Python process's memory). Each yields the
bucket, the ``AWS_*`` variables a user would set for it, and where its data lives.

``check`` asks the server for what gpucr relies on: multipart uploads, ranged reads, and
conditional writes (``If-None-Match: *`` and ``If-Match``, which the lease is made of).
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.s3 import BUCKET, aws_env, free_port, moto_server, wait_listening  # noqa: E402

#: The key pair the SeaweedFS server is configured with (its ``-s3.config``), as a user's would be.
WEED_KEY, WEED_SECRET = "gpucr-bench", "gpucr-bench-secret"
#: Volumes large enough that a multi-GB checkpoint does not have the master grow dozens of them.
WEED_VOLUME_MB = 4096
#: SeaweedFS's gRPC port for each HTTP port, by default.
GRPC_OFFSET = 10000


@dataclass(frozen=True)
class S3Server:
    name: str  # e.g. "SeaweedFS 4.48 (weed mini)"
    endpoint: str
    bucket: str
    env: dict[str, str]  # AWS_* for a server or shell that uses it
    data: Path | None  # where it keeps the objects; None: in memory
    pid: int | None = None  # the server's process, for the CPU time it spends


def medium(path: Path) -> str:
    """The file system holding ``path`` (or the nearest folder above it that exists) and its source,
    from the mount table ("ext4 on /dev/vda (mounted at /)")."""
    path = path.resolve()
    while not path.exists():
        path = path.parent
    best = ("", "?", "?")
    for line in Path("/proc/self/mounts").read_text().splitlines():
        source, point, fstype = line.split()[:3]
        point = point.replace("\\040", " ")
        if (path == Path(point) or Path(point) in path.parents) and len(point) >= len(best[0]):
            best = (point, fstype, source)
    return f"{best[1]} on {best[2]} (mounted at {best[0]})"


def _free_with_grpc() -> int:
    """A free port whose number + 10000 is free too: each part's gRPC port (the plugin worker
    finds the admin server's there whatever ``-admin.port.grpc`` says)."""
    while True:
        port = free_port()
        if port + GRPC_OFFSET < 65536:
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port + GRPC_OFFSET))
                    return port
                except OSError:
                    continue


@contextlib.contextmanager
def seaweedfs(weed: str, data: Path, log: Path, tuning: Sequence[str] = ()) -> Iterator[S3Server]:
    """``weed mini`` on free localhost ports with its data in ``data`` (no replication: one
    volume server), S3 signed with a key of its own, the WebDAV, admin UI, Iceberg and Lance
    endpoints and the telemetry off; the bucket created through S3 as a user would. ``tuning``: more
    flags for ``weed mini`` (none measurably sped it up: bench/bench_store_raw.py --weed-flag)."""
    data.mkdir(parents=True, exist_ok=True)
    config = log.with_name("weed-s3.json")
    config.write_text(json.dumps({"identities": [{"name": "bench", "credentials": [
        {"accessKey": WEED_KEY, "secretKey": WEED_SECRET}], "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
    ports = {f"-{part}.port": _free_with_grpc() for part in ("master", "volume", "filer", "s3", "admin")}
    said = subprocess.run([weed, "version"], capture_output=True, text=True, timeout=30).stdout.splitlines()
    version = next((line.split() for line in said if line.startswith("version ")), [])  # version 8000GB 4.48 ...
    proc = subprocess.Popen(
        [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         *(f"{flag}={port}" for flag, port in ports.items()),
         "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
         f"-master.volumeSizeLimitMB={WEED_VOLUME_MB}", f"-s3.config={config}", *tuning],
        stdout=open(log, "ab"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    endpoint = f"http://127.0.0.1:{ports['-s3.port']}"
    env = {**aws_env(endpoint), "AWS_ACCESS_KEY_ID": WEED_KEY, "AWS_SECRET_ACCESS_KEY": WEED_SECRET}
    try:
        wait_listening(proc, ports["-s3.port"], log, timeout=60)
        _make_bucket(env, BUCKET, proc, log)
        name = f"SeaweedFS {version[2] if len(version) > 2 else '?'} (weed mini)"
        yield S3Server(name, endpoint, BUCKET, env, data, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def moto(log: Path) -> Iterator[S3Server]:
    """moto's server (tests/s3.py), with its bucket."""
    with moto_server(log) as endpoint:
        yield S3Server("moto (objects in the server's memory)", endpoint, BUCKET, aws_env(endpoint), None)


def _make_bucket(env: dict[str, str], bucket: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    """Create ``bucket`` with s3fs, retried until the gateway has found its filer and volumes."""
    import s3fs

    fs = s3fs.S3FileSystem(key=env["AWS_ACCESS_KEY_ID"], secret=env["AWS_SECRET_ACCESS_KEY"],
                           endpoint_url=env["AWS_ENDPOINT_URL"], skip_instance_cache=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            fs.mkdir(bucket)
            fs.ls(bucket)
            return
        except Exception as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the bucket was not created ({e}): {log.read_text()[-3000:]}") from e
            time.sleep(0.3)


def check(url: str, scratch: Path, mib: int = 96) -> dict[str, object]:
    """What gpucr needs of the store, tried through ObjectStore (its environment's AWS_* apply):
    a file of ``mib`` MiB up as a multipart upload and back as ranged reads, identical; a create
    refused when the object exists; a replace refused with a stale ETag. With the seconds each
    transfer took."""
    from jupyter_gpucr.core.objectstore.bucket import ObjectStore

    store = ObjectStore(url, user="gpucr-bench-check")
    src, back = scratch / "check.bin", scratch / "check.back"
    src.write_bytes(os.urandom(mib << 20))
    try:
        t0 = time.perf_counter()
        store.put_files([(str(src), "big.bin")])
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        store.get_files([("big.bin", str(back), mib << 20)])
        down = time.perf_counter() - t0
        same = back.read_bytes() == src.read_bytes()
        first = store.put_json_if("lease.json", {"node": "a"}, None)
        second_create = store.put_json_if("lease.json", {"node": "b"}, None)
        replaced = store.put_json_if("lease.json", {"node": "a", "beat": 1}, first) if first else None
        stale = store.put_json_if("lease.json", {"node": "b"}, first) if first else None
        kept = store.read_json("lease.json")
    finally:
        store.delete("", recursive=True)
        src.unlink(missing_ok=True)
        back.unlink(missing_ok=True)
    return {"multipart_and_ranged_reads": same, "check_mib": mib, "check_put_s": round(up, 3), "check_get_s": round(down, 3),
            "if_none_match": bool(first) and second_create is None,
            "if_match": bool(replaced) and stale is None and kept == {"node": "a", "beat": 1}}

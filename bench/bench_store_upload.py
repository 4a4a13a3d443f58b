"""Suspend until durable in object storage: the upload after the dump against the upload while CRIU
writes (core/streamup.py), a process holding MB MiB of numpy data, through the core API, with
moto's S3 server on localhost as the store (the S3 API s3fs is tested against; moto keeps objects
in one Python process's memory, so it bounds what any upload can do here).

    .venv/bin/python bench/bench_store_upload.py --mb 1024 --runs 1

Prints one JSON line per run: the checkpoint (local disk, committed), the upload, and the sum.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr.core.checkpointer import Checkpointer  # noqa: E402
from jupyter_gpucr.core.objectstore import ObjectStore  # noqa: E402
from jupyter_gpucr.core.store import Store  # noqa: E402
from jupyter_gpucr.core.streamup import StreamingUpload  # noqa: E402
from jupyter_gpucr.core.upload import upload  # noqa: E402
from tests.conftest import agent_command, wait_for_line  # noqa: E402
from tests.s3 import BUCKET, aws_env, environ, moto_server  # noqa: E402


def one(mb: int, stream: bool, root: Path, n: int) -> dict[str, object]:
    store = Store(root / f"cache-{n}")
    remote = ObjectStore(f"s3://{BUCKET}/bench", user=f"run{n}")
    cr = Checkpointer(store)
    streams: dict[str, StreamingUpload] = {}
    if stream:
        def follow(name: str, cid: str, images: Path) -> StreamingUpload:
            streams[cid] = StreamingUpload(remote, f"{name}/{cid}", images, "bench")
            return streams[cid]

        cr.beside_dump = follow
    os.environ["AGENT_FILE"] = str(root / f"counts-{n}")
    cr.run("agent", agent_command("cpu_agent.py", str(mb)))
    wait_for_line(store.proc_dir("agent") / "stdout.log", timeout=300)
    try:
        t0 = time.perf_counter()
        ckpt = cr.checkpoint("agent")
        t1 = time.perf_counter()
        moved = upload(remote, store, ckpt, streamed=streams.get(ckpt.id))
        t2 = time.perf_counter()
    finally:
        cr.remove("agent", kill=True)
        shutil.rmtree(store.root, ignore_errors=True)
        remote.delete("", recursive=True)  # moto holds every object in memory
    return {"mode": "during the dump" if stream else "after the dump", "mib": int(moved["bytes"]) >> 20,
            "checkpoint_s": round(t1 - t0, 2), "upload_after_commit_s": round(t2 - t1, 2),
            "durable_s": round(t2 - t0, 2), "sent_during_dump_mib": int(moved["during_dump"]) >> 20}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--runs", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpucr-bench-store-") as d, ExitStack() as stack:
        root = Path(d)
        endpoint = stack.enter_context(moto_server(root / "moto.log"))
        stack.enter_context(environ(aws_env(endpoint)))
        n = 0
        for _ in range(args.runs):
            for stream in (False, True):
                n += 1
                print(json.dumps(one(args.mb, stream, root, n)), flush=True)


if __name__ == "__main__":
    main()

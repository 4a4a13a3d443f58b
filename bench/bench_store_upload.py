"""Checkpoints in object storage against the local disk: a process holding MB MiB of numpy data,
through the core API, with moto's S3 server on localhost as the store (the S3 API s3fs is tested
against; moto keeps objects in one Python process's memory, so read the ratios to the local disk
and the bytes moved, not its throughput).

    .venv/bin/python bench/bench_store_upload.py --mb 1024 --runs 3 --encrypt [--upload-after-dump]

Each run suspends and restores a fresh process per mode:

- local: suspend until durable on the local disk (the checkpoint committed and fsynced); the page
  cache emptied of the cache directory's files; restore until the process answers.
- store: suspend until durable in the store (the images uploaded while CRIU writes them, the rest
  after the commit, ``complete.json`` written); the node's cache deleted; on "another node" (a
  fresh cache directory) download (ranged reads in parallel) and restore until the process answers.
- encrypted (``--encrypt``): the same sealed with a fresh key file.
- after-dump (``--upload-after-dump``): the store's upload only once the checkpoint is committed.

"Answers": the process replies with the checksum of all its memory, which must be the one it had
before the suspend (a lazy restore is then complete). Prints one JSON line per run, with the
ratios, then a summary against the goals: the store's suspend within 1.2x of the local one, its
restore within 1.5x of a cold local one.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_gpucr.core.checkpointer import Checkpointer  # noqa: E402
from jupyter_gpucr.core.objectstore.bucket import ObjectStore  # noqa: E402
from jupyter_gpucr.core.objectstore.sealing import load_key  # noqa: E402
from jupyter_gpucr.core.objectstore.streamup import StreamingUpload  # noqa: E402
from jupyter_gpucr.core.objectstore.transfer import download, latest, upload  # noqa: E402
from jupyter_gpucr.core.storage.openfiles import OpenFiles  # noqa: E402
from jupyter_gpucr.core.storage.store import Store  # noqa: E402
from tests.conftest import agent_command, ask, wait_for_line  # noqa: E402
from tests.pagecache import evict, resident_fraction  # noqa: E402
from tests.s3 import BUCKET, aws_env, environ, moto_server  # noqa: E402

#: The repository (the venv and its numpy) is the agent's working directory: on a cluster it is in the
#: image or on shared storage, not a scratch folder a checkpoint copies (docs/storage.md, Files).
SHARED = OpenFiles(shared=(str(Path.home()), str(Path(__file__).resolve().parents[1])))
SUSPEND_GOAL = 1.2
RESTORE_GOAL = 1.5


@dataclass(frozen=True)
class Mode:
    name: str
    remote: bool = False
    stream: bool = False
    encrypt: bool = False


LOCAL = Mode("local")
STORE = Mode("store", remote=True, stream=True)
ENCRYPTED = Mode("encrypted", remote=True, stream=True, encrypt=True)
AFTER_DUMP = Mode("after-dump", remote=True)


def new_key(path: Path) -> Path:
    """32 random bytes in a file only its owner reads, as docs/storage.md says to make one."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, os.urandom(32))
    os.close(fd)
    return path


def drop_from_memory(root: Path) -> float:
    """Evict every file below ``root`` from the page cache, as after a reboot; returns what stayed resident."""
    files = [p for p in root.rglob("*") if p.is_file()]
    evict(files)
    return resident_fraction(files)


def answered(hello: dict[str, Any]) -> float:
    """Seconds until the process replied with the checksum it had before (all its memory back)."""
    t0 = time.perf_counter()
    reply = ask(hello["port"], timeout=600)
    if reply["checksum"] != hello["checksum"]:
        raise RuntimeError(f"the restored process's memory differs: {reply}")
    return time.perf_counter() - t0


def measure(mode: Mode, mb: int, root: Path) -> dict[str, Any]:
    """Suspend a fresh process until durable, then restore it cold until it answers."""
    where = root / mode.name
    where.mkdir()
    node_a = Store(where / "node-a")
    key = load_key(new_key(where / "gpucr.key")) if mode.encrypt else None
    remote = ObjectStore(f"s3://{BUCKET}/bench", user=where.name, key=key) if mode.remote else None
    holder = Checkpointer(node_a, open_files=SHARED if remote else None)
    streams: dict[str, StreamingUpload] = {}
    if remote is not None and mode.stream:
        def follow(name: str, cid: str, images: Path) -> StreamingUpload:
            streams[cid] = StreamingUpload(remote, f"{name}/{cid}", images, "node-a")
            return streams[cid]

        holder.beside_dump = follow
    os.environ["AGENT_FILE"] = str(where / "counts")
    holder.run("agent", agent_command("cpu_agent.py", str(mb)))
    hello = wait_for_line(node_a.proc_dir("agent") / "stdout.log", timeout=600)
    row: dict[str, Any] = {"mode": mode.name, "answer_warm_s": answered(hello), "load_before": os.getloadavg()[0]}
    try:
        t0 = time.perf_counter()
        ckpt = holder.checkpoint("agent")
        row.update(checkpoint_s=time.perf_counter() - t0, checkpoint_mib=ckpt.size / 2**20)
        if remote is None:
            row["durable_s"] = row["checkpoint_s"]
            row["resident_before_restore"] = drop_from_memory(node_a.root)
            t1 = time.perf_counter()
            holder.restore("agent")
            row["restore_s"] = time.perf_counter() - t1
        else:
            moved = upload(remote, node_a, ckpt, streamed=streams.get(ckpt.id))
            row.update(durable_s=time.perf_counter() - t0, upload_after_commit_s=moved["seconds"],
                       stored_mib=sum(remote.sizes(f"agent/{ckpt.id}").values()) / 2**20,
                       sent_during_dump_mib=moved["during_dump"] / 2**20)
            shutil.rmtree(node_a.root)  # node A is gone, and its files with it
            holder = Checkpointer(Store(where / "node-b"), open_files=SHARED)
            t1 = time.perf_counter()
            complete = latest(remote, "agent")
            assert complete is not None and complete["id"] == ckpt.id, complete
            download(remote, holder.store, complete)
            row["download_s"] = time.perf_counter() - t1
            row["downloaded_mib"] = sum(remote.stored_size(int(n)) for n in complete["objects"].values()) / 2**20
            t2 = time.perf_counter()
            holder.restore("agent")
            row["restore_s"] = time.perf_counter() - t2
        row["restored_to_answer_s"] = answered(hello)
        row["to_answer_s"] = time.perf_counter() - t1
        row["load_after"] = os.getloadavg()[0]
    finally:
        holder.remove("agent", kill=True)
        shutil.rmtree(where, ignore_errors=True)
        if remote is not None:
            remote.delete("", recursive=True)  # moto holds every object in memory
    return {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}


def ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Each store mode's suspend and restore against the local disk's (and sealed against plain)."""
    out = {}
    for name, row in rows.items():
        if name == LOCAL.name:
            continue
        out[f"{name}_suspend_vs_local"] = row["durable_s"] / rows[LOCAL.name]["durable_s"]
        out[f"{name}_restore_vs_local"] = row["to_answer_s"] / rows[LOCAL.name]["to_answer_s"]
    if ENCRYPTED.name in rows:
        out["encrypted_suspend_vs_store"] = rows[ENCRYPTED.name]["durable_s"] / rows[STORE.name]["durable_s"]
        out["encrypted_restore_vs_store"] = rows[ENCRYPTED.name]["to_answer_s"] / rows[STORE.name]["to_answer_s"]
    return {k: round(v, 2) for k, v in out.items()}


def spread(values: list[float], unit: str = "") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}{unit}" if round(lo, 2) == round(hi, 2) else f"{lo:.2f}–{hi:.2f}{unit}"


def summary(runs: list[dict[str, Any]], modes: list[Mode]) -> str:
    def over(pick: Callable[[dict[str, Any]], float], unit: str = "") -> str:
        return spread([pick(r) for r in runs], unit)

    lines = [f"{len(runs)} runs, load average {over(lambda r: r['modes'][LOCAL.name]['load_before'])} at the start of each"]
    for mode in modes:
        def of(field: str, m: Mode = mode) -> Callable[[dict[str, Any]], float]:
            return lambda r: r["modes"][m.name][field]
        line = f"{mode.name:>15}: durable {over(of('durable_s'), ' s')}, answered after restore {over(of('to_answer_s'), ' s')}"
        if mode.remote:
            line += (f" (download {over(of('download_s'), ' s')}); {over(of('stored_mib'), ' MiB')} stored and read back, "
                     f"{over(of('sent_during_dump_mib'), ' MiB')} sent while CRIU wrote")
        lines.append(line)
    for key in runs[0]["ratios"]:
        met = ""
        if key.endswith("suspend_vs_local") or key.endswith("restore_vs_local"):
            goal = SUSPEND_GOAL if "suspend" in key else RESTORE_GOAL
            hits = sum(r["ratios"][key] <= goal for r in runs)
            met = f"  goal <= {goal}x: met in {hits} of {len(runs)}"
        lines.append(f"{key:>34}: {over(lambda r, k=key: r['ratios'][k], 'x')}{met}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1024, help="MiB of numpy data the process holds")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--encrypt", action="store_true", help="also sealed with a fresh key file")
    ap.add_argument("--upload-after-dump", action="store_true", help="also uploading only after the commit")
    args = ap.parse_args()
    modes = [LOCAL, STORE, *([ENCRYPTED] if args.encrypt else []), *([AFTER_DUMP] if args.upload_after_dump else [])]
    runs = []
    with tempfile.TemporaryDirectory(prefix="gpucr-bench-store-") as d, ExitStack() as stack:
        base = Path(d)
        endpoint = stack.enter_context(moto_server(base / "moto.log"))
        stack.enter_context(environ(aws_env(endpoint)))
        for n in range(1, args.runs + 1):
            (base / str(n)).mkdir()
            rows = {mode.name: measure(mode, args.mb, base / str(n)) for mode in modes}
            runs.append({"run": n, "mib": args.mb, "modes": rows, "ratios": ratios(rows)})
            print(json.dumps(runs[-1]), flush=True)
    print(summary(runs, modes), flush=True)


if __name__ == "__main__":
    main()

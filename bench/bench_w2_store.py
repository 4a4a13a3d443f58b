"""W2 (bench/w2_workload.py) suspended into object storage, a real S3 server on localhost, against
the local disk, through real jupyter servers with gpucr.

    python3 bench/bench_w2_store.py --kind gpu --weed /tmp/weed --json-out w2-store.json
    .venv/bin/python bench/bench_w2_store.py --kind cpu --cpu-arrays 1 [--s3 moto]

Each round runs two modes, each with a fresh kernel (setup, then the cell: the reference tokens):

- local: ``c.GPUCR.store`` a directory on disk (``--local-store``). Suspend through REST until
  ``suspended`` (the checkpoint committed and fsynced): the *durable local suspend*. The server
  stopped, the store's files dropped from the page cache, a server started again on the same
  store; resume + cell (the websocket opened, the generation cell run): the *cold local restore*.
- store: ``c.GPUCR.store = s3://BUCKET/w2-store``, node A with a cache directory of its own.
  Suspend through REST until ``suspended`` (``uploading`` before: every object in the store): the
  *suspend until durable in the store*. Node A stopped and its cache deleted, the S3 server's
  files dropped from the page cache; node B (another server, another cache directory, the same
  store and user) lists the kernel; resume + cell there: the *restore on a cold node* (download
  and restore as the server reports them).

The S3 server (``--s3``): SeaweedFS's ``weed mini`` (``--weed``) with its data in ``--s3-data``,
or moto's server (objects in memory). Endpoint and keys reach the servers as ``AWS_*`` variables.
The tokens after each restore must be the reference's. Prints a table against the goals (the
store's suspend within 1.2x of the local one, its restore within 1.5x of the cold local one) and
JSON with the bytes moved, the date, the machine and the command.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import websocket

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import s3_server  # noqa: E402
from bench_w2 import TOKEN, Server, drop_from_memory, run_cell  # noqa: E402
from w2_workload import code, cpu_setup  # noqa: E402

from jupyter_gpucr.core.gpu import gpus  # noqa: E402
from jupyter_gpucr.core.objectstore import transfer
from jupyter_gpucr.core.objectstore.bucket import ObjectStore  # noqa: E402
from tests.s3 import environ  # noqa: E402

SUSPEND_GOAL, RESTORE_GOAL = 1.2, 1.5
PREFIX = "w2-store"
UPLOADED = re.compile(r"kernel (\S+) is in .*?: (\d+) MiB in (\d+) objects, (\d+) MiB of them sent while CRIU wrote them, "
                      r"(\d+) MiB more by the upload beside the dump; done ([\d.]+) s after the dump")
DOWNLOADED = re.compile(r"downloaded checkpoint \S+ of kernel (\S+) from .* \((\d+) MiB in ([\d.]+) s\)")


def connect(server: Server, kernel_id: str) -> websocket.WebSocket:
    """The kernel's channels, as JupyterLab opens them for a notebook it reopens."""
    return websocket.create_connection(
        f"ws://127.0.0.1:{server.port}/api/kernels/{kernel_id}/channels?session_id={uuid.uuid4()}",
        header=[f"Authorization: token {TOKEN}"], timeout=3600)


def wait_listed(server: Server, kernel_id: str, timeout: float = 300) -> float:
    """Seconds until the server lists the kernel (it reads it back from its store at start)."""
    t0 = time.perf_counter()
    while kernel_id not in [k["id"] for k in server.rest("api/kernels")]:
        if time.perf_counter() - t0 > timeout:
            raise TimeoutError(f"kernel {kernel_id} was never listed")
        time.sleep(0.1)
    return time.perf_counter() - t0


def start_kernel(server: Server, setup: str, cell: str) -> tuple[str, websocket.WebSocket, dict[str, Any]]:
    """A fresh W2 kernel: setup, the cell (its output is the reference), the cell again (warm)."""
    kid, ws = server.kernel("w2.ipynb")
    t0 = time.perf_counter()
    run_cell(ws, setup)
    reference = run_cell(ws, cell)
    cold_start = time.perf_counter() - t0
    t0 = time.perf_counter()
    warm = run_cell(ws, cell)
    return kid, ws, {"reference": reference, "cold_start_s": cold_start, "warm_cell_s": time.perf_counter() - t0,
                     "warm_same": warm == reference}


def suspended_size(st: dict[str, Any]) -> int:
    """The checkpoint's bytes with the GPU tensors written beside the image."""
    return st["checkpoint"]["size"] + ((st.get("trim") or {}).get("offload") or {}).get("bytes", 0)


def resume_cold(server: Server, kernel_id: str, cell: str, reference: str) -> dict[str, Any]:
    """The returning user: the notebook's websocket opened, the cell run; with the server's split."""
    t0, first = time.perf_counter(), {}
    ws = connect(server, kernel_id)
    connected = time.perf_counter() - t0
    digest = run_cell(ws, cell, first)
    resume_s = time.perf_counter() - t0
    ws.close()
    st = server.rest(f"api/gpucr/kernels/{kernel_id}")
    t = st["timings"]
    return {"resume_and_cell_s": resume_s, "websocket_s": connected, "cell_in_kernel_s": first.get("kernel_s"),
            "restore_s": t.get("total", 0.0), "server_before_restore_s": t.get("server_before", 0.0),
            "restore_timings": t, "tokens_identical": digest == reference, "state": st["state"]}


def suspend(server: Server, kernel_id: str, row: dict[str, Any]) -> tuple[dict[str, Any], float]:
    """Suspend through REST, recording its answer in ``row``; the answer and when it was asked."""
    t0 = time.perf_counter()
    st = server.rest(f"api/gpucr/kernels/{kernel_id}/suspend", "POST", {})
    row.update(state_after_suspend=st["state"], bytes=suspended_size(st), suspend_timings=st["timings"])
    return st, t0


def local_round(args: argparse.Namespace, root: Path, store: Path, logs: Path) -> dict[str, Any]:
    setup, cell = code_for(args)
    shutil.rmtree(store, ignore_errors=True)
    store.mkdir(parents=True)
    server = Server(root, store, logs / "local-1.log")
    try:
        kid, ws, row = start_kernel(server, setup, cell)
        st, t0 = suspend(server, kid, row)
        row["durable_s"] = time.perf_counter() - t0
        if st["state"] != "suspended":
            raise RuntimeError(f"the suspend ended {st['state']}: {st.get('error')}")
        ws.close()
    finally:
        server.stop()
    os.sync()
    row["resident_before_restore"] = drop_from_memory(store)
    server = Server(root, store, logs / "local-2.log")
    try:
        row["listed_after_start_s"] = wait_listed(server, kid)
        row.update(resume_cold(server, kid, cell, row["reference"]))
        server.rest(f"api/kernels/{kid}", "DELETE")
    finally:
        server.stop()
    shutil.rmtree(store, ignore_errors=True)
    return row


def store_round(args: argparse.Namespace, root: Path, s3: s3_server.S3Server, caches: Path, logs: Path,
                n: int) -> dict[str, Any]:
    setup, cell = code_for(args)
    url = f"s3://{s3.bucket}/{PREFIX}"
    cache_a, cache_b = caches / "cache-a", caches / "cache-b"
    for d in (cache_a, cache_b):
        shutil.rmtree(d, ignore_errors=True)
    log_a, log_b = logs / f"node-a-{n}.log", logs / f"node-b-{n}.log"
    node_a = Server(root, url, log_a, (f"--GPUCR.cache_dir={cache_a}",))
    try:
        kid, ws, row = start_kernel(node_a, setup, cell)
        st, t0 = suspend(node_a, kid, row)
        row["suspend_returned_s"] = time.perf_counter() - t0
        st, progress = until_durable(node_a, kid, t0)
        row.update(durable_s=time.perf_counter() - t0, upload_progress=progress,
                   upload_after_dump_s=st["timings"].get("upload"))
        ws.close()
    finally:
        node_a.stop()
    row.update(uploaded(log_a.read_text(), kid))
    complete = transfer.latest(ObjectStore(url), kid)
    row["stored_bytes"] = sum(int(v) for v in complete["objects"].values()) if complete else None
    shutil.rmtree(cache_a)  # node A is gone, and its disk with it
    os.sync()
    row["resident_before_restore"] = drop_from_memory(s3.data) if s3.data else None
    node_b = Server(root, url, log_b, (f"--GPUCR.cache_dir={cache_b}",))
    try:
        row["listed_after_start_s"] = wait_listed(node_b, kid)
        row.update(resume_cold(node_b, kid, cell, row["reference"]))
        row.update(downloaded(log_b.read_text(), kid))
        node_b.rest(f"api/kernels/{kid}", "DELETE")  # its objects go too
    finally:
        node_b.stop()
    shutil.rmtree(cache_b, ignore_errors=True)
    return row


def until_durable(server: Server, kernel_id: str, t0: float, timeout: float = 1800) -> tuple[dict[str, Any], list]:
    """Poll the kernel's state until ``suspended``; the upload's progress meanwhile as (seconds since
    ``t0``, bytes done, bytes in all), about every 0.25 s. Raises when the upload failed."""
    samples: list[tuple[float, int, int]] = []
    while True:
        st = server.rest(f"api/gpucr/kernels/{kernel_id}")
        now = time.perf_counter() - t0
        if st["state"] == "suspended":
            if st.get("error"):
                raise RuntimeError(f"the upload failed: {st['error']} {st.get('hint')}")
            return st, samples
        if st["state"] != "uploading" or now > timeout:
            raise RuntimeError(f"the kernel is {st['state']} after {now:.1f} s, not uploading: {st.get('error')}")
        p = st.get("progress") or {}
        if not samples or now - samples[-1][0] >= 0.25:
            samples.append((round(now, 3), int(p.get("bytes_done", 0)), int(p.get("bytes_total", 0))))
        time.sleep(0.02)


def uploaded(log: str, kernel_id: str) -> dict[str, Any]:
    """What node A's log says its upload moved."""
    m = next((m for m in UPLOADED.finditer(log) if m.group(1) == kernel_id), None)
    return {"uploaded_mib": int(m.group(2)), "objects": int(m.group(3)), "during_dump_mib": int(m.group(4)),
            "streamed_mib": int(m.group(4)) + int(m.group(5))} if m else {}


def downloaded(log: str, kernel_id: str) -> dict[str, Any]:
    """What node B's log says its download moved."""
    m = next((m for m in DOWNLOADED.finditer(log) if m.group(1) == kernel_id), None)
    return {"downloaded_mib": int(m.group(2)), "download_s": float(m.group(3))} if m else {}


def code_for(args: argparse.Namespace) -> tuple[str, str]:
    setup, cell = code(args.kind)
    return (cpu_setup(args.cpu_arrays), cell) if args.kind == "cpu" else (setup, cell)


def spread(values: list[float | None], unit: str = " s", digits: int = 2) -> str:
    vals = [v for v in values if v is not None]
    if not vals:
        return "-"
    lo, hi = min(vals), max(vals)
    return f"{lo:.{digits}f}{unit}" if round(lo, digits) == round(hi, digits) else f"{lo:.{digits}f}–{hi:.{digits}f}{unit}"


def summary(result: dict[str, Any]) -> str:
    local, store, ratios = result["local"], result["store"], result["ratios"]

    def col(rows: list[dict], key: str, unit: str = " s", scale: float = 1.0) -> str:
        return spread([r.get(key) / scale if r.get(key) is not None else None for r in rows], unit)

    def goal(key: str, limit: float) -> str:
        met = sum(v <= limit for v in ratios[key])
        return f"<= {limit}x: {'met' if met == len(ratios[key]) else 'NOT met'} ({met} of {len(ratios[key])})"

    fmt = "{:34} {:>22} {:>26} {:>12}  {}"
    lines = [f"W2 ({result['kind']}), {len(local)} round(s); S3: {result['s3']['name']}, data: {result['s3']['data_medium']}; "
             f"local store: {result['local_store_medium']}",
             "S3 server checks: multipart upload + ranged reads {multipart_and_ranged_reads}, If-None-Match {if_none_match}, "
             "If-Match {if_match}; {check_mib} MiB up in {check_put_s} s, down in {check_get_s} s".format(**result["s3"]),
             fmt.format("", "local disk", "object store", "store/local", "goal"),
             fmt.format("suspend until durable", col(local, "durable_s"), col(store, "durable_s"),
                        spread(ratios["suspend"], "x"), goal("suspend", SUSPEND_GOAL)),
             fmt.format("  the suspend call returned", "", col(store, "suspend_returned_s"), "", "(then uploading)"),
             fmt.format("restore on a cold node: resume+cell", col(local, "resume_and_cell_s"), col(store, "resume_and_cell_s"),
                        spread(ratios["restore"], "x"), goal("restore", RESTORE_GOAL)),
             fmt.format("  download (server's log)", "-", col(store, "download_s"), "", ""),
             fmt.format("  server before restore (lease, dl)", col(local, "server_before_restore_s"),
                        col(store, "server_before_restore_s"), "", ""),
             fmt.format("  restore (engine)", col(local, "restore_s"), col(store, "restore_s"), "", ""),
             fmt.format("  the cell in the kernel", col(local, "cell_in_kernel_s"), col(store, "cell_in_kernel_s"), "", ""),
             fmt.format("  the cell warm, before suspending", col(local, "warm_cell_s"), col(store, "warm_cell_s"), "", ""),
             fmt.format("checkpoint", col(local, "bytes", " MiB", 2**20), col(store, "stored_bytes", " MiB", 2**20), "", ""),
             fmt.format("  sent by the upload begun in the dump", "", col(store, "streamed_mib", " MiB"), "", ""),
             fmt.format("    of them while CRIU wrote", "", col(store, "during_dump_mib", " MiB"), "", ""),
             fmt.format("  downloaded", "", col(store, "downloaded_mib", " MiB"), "", ""),
             fmt.format("resident in page cache before restore", col(local, "resident_before_restore", "", 1 / 100),
                        col(store, "resident_before_restore", "", 1 / 100), "", "(% of the store's files)"),
             fmt.format("cold start (setup + cell)", col(local, "cold_start_s"), col(store, "cold_start_s"), "", ""),
             fmt.format("tokens identical after restore", str(all(r["tokens_identical"] for r in local)),
                        str(all(r["tokens_identical"] for r in store)), "", f"reference {result['reference']}")]
    return "\n".join(lines)


def main() -> None:
    home = Path.home() / "gpucr-w2-store"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--rounds", type=int, default=1, help="times each mode runs, each with a fresh kernel")
    ap.add_argument("--s3", choices=["weed", "moto"], default="weed")
    ap.add_argument("--weed", default=shutil.which("weed"), help="SeaweedFS's weed binary (default: on PATH)")
    ap.add_argument("--local-store", type=Path, default=home / "local", help="the local mode's store, on disk")
    ap.add_argument("--s3-data", type=Path, default=home / "s3-data", help="the SeaweedFS server's data directory")
    ap.add_argument("--caches", type=Path, default=home, help="where nodes A and B keep their cache directories")
    ap.add_argument("--cpu-arrays", type=int, default=6, help="--kind cpu: arrays of 256 MiB the kernel holds")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    if args.s3 == "weed" and not args.weed:
        ap.error("no weed binary: give --weed PATH (SeaweedFS), or --s3 moto")
    mediums = {"local": s3_server.medium(args.local_store), "s3": s3_server.medium(args.s3_data)}
    work = Path(tempfile.mkdtemp(prefix="gpucr-w2-store-"))
    root, logs = work / "root", work / "logs"
    root.mkdir()
    logs.mkdir()
    print(f"servers' logs in {logs}", flush=True)
    with ExitStack() as stack:
        if args.s3 == "weed":
            shutil.rmtree(args.s3_data, ignore_errors=True)
            s3 = stack.enter_context(s3_server.seaweedfs(args.weed, args.s3_data, logs / "weed.log"))
        else:
            s3 = stack.enter_context(s3_server.moto(logs / "moto.log"))
        stack.enter_context(environ(s3.env))  # the servers inherit them, as from a pod's environment
        checks = s3_server.check(f"s3://{s3.bucket}/{PREFIX}-check", work)
        if not (checks["if_none_match"] and checks["if_match"]):
            print(f"WARNING: {s3.name} does not honour conditional writes (If-None-Match / If-Match): {checks}; "
                  "the lease that keeps two nodes from running one kernel does not hold on it", flush=True)
        local, store = [], []
        for n in range(1, args.rounds + 1):
            local.append(local_round(args, root, args.local_store, logs))
            print(f"round {n} local: {json.dumps(local[-1], default=str)}", flush=True)
            store.append(store_round(args, root, s3, args.caches, logs, n))
            print(f"round {n} store: {json.dumps(store[-1], default=str)}", flush=True)
        if s3.data:
            shutil.rmtree(s3.data, ignore_errors=True)
    for made in {args.local_store.parent, args.s3_data.parent, args.caches}:
        with contextlib.suppress(OSError):  # the default folder, left empty
            made.rmdir()
    references = {r["reference"] for r in local + store}
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(), "cpus": os.cpu_count(),
        "platform": platform.platform(), "gpus": [g.name for g in gpus.list_gpus()], "driver": gpus.driver_version(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "kind": args.kind,
        "cpu_arrays": args.cpu_arrays if args.kind == "cpu" else None,
        "s3": {"name": s3.name, "data": str(s3.data) if s3.data else None,
               "data_medium": mediums["s3"] if s3.data else "memory", **checks},
        "local_store": str(args.local_store), "local_store_medium": mediums["local"],
        "reference": "/".join(sorted(references)), "same_reference_in_all_kernels": len(references) == 1,
        "ratios": {"suspend": [round(s["durable_s"] / lo["durable_s"], 3) for lo, s in zip(local, store)],
                   "restore": [round(s["resume_and_cell_s"] / lo["resume_and_cell_s"], 3) for lo, s in zip(local, store)]},
        "goals": {"suspend": SUSPEND_GOAL, "restore": RESTORE_GOAL},
        "local": local, "store": store}
    print(summary(result), flush=True)
    print(json.dumps(result, indent=2, default=str))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    if not all(r["tokens_identical"] and r["warm_same"] for r in local + store):
        sys.exit("the tokens after a restore differ from the reference")
    shutil.rmtree(work, ignore_errors=True)  # the servers' logs; kept when the bench failed


if __name__ == "__main__":
    main()

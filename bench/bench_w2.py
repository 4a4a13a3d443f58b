"""Issue 11's "W2" notebook through the real server, side by side with the raw driver + CRIU path.

    python bench/bench_w2.py --kind gpu --store /dev/shm/gpucr-w2 [--rounds 2] [--json-out FILE]
    python bench/bench_w2.py --kind cpu ...            # the 2 GB numpy/pandas kernel

A jupyter server with gpucr runs as a separate process; the kernel builds the W2 state
(bench/w2_workload.py). Each round: REST suspend (GPU free as seen by NVML, suspend complete over
HTTP, image versus live bytes), then the user's cell over the websocket (resume to first result),
then the same cell warm; the cell's digest must equal the first one. One more round restores onto
the other GPU (with one GPU: the same one) and compares tokens, parameters, KV cache and an
optimizer's state bit for bit, and which GPU the process believes it is on. Then a cold start (a fresh kernel:
setup + cell), and the raw path: the same workload in a plain process, driver lock + checkpoint +
``criu dump``, ``criu restore`` + driver restore + unlock, then the cell. Prints a table and JSON,
with what the CPUs and GPU 0 did during each cell (``cell_watch``) and, with ``--cold``, what the
store's disk did during each suspend and resume.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from datetime import datetime
from pathlib import Path

import psutil
import websocket  # websocket-client, a jupyter_server dependency

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import raw_path  # noqa: E402
from bench_bandwidth import disk_bandwidth  # noqa: E402
from cell_watch import CellWatch  # noqa: E402
from w2_workload import GPU_FIDELITY_CELL, GPU_FIDELITY_SETUP, code  # noqa: E402

from jupyter_gpucr.core.gpu import cuda, gpus  # noqa: E402
from jupyter_gpucr.core.storage.store import dir_size  # noqa: E402
from tests.pagecache import block_device_stat, device_counters, evict, resident_fraction  # noqa: E402

TOKEN = "bench-token"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A jupyter server with gpucr, driven over REST and the kernel websocket."""

    def __init__(self, root: Path, store: Path, log: Path, options: tuple[str, ...] = ()) -> None:
        self.store = store
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "jupyter_server", f"--port={self.port}", "--ip=127.0.0.1", "--no-browser",
             "--allow-root", f"--ServerApp.root_dir={root}", f"--IdentityProvider.token={TOKEN}",
             "--ServerApp.jpserver_extensions={'jupyter_gpucr': True}", f"--GPUCR.store={store}", *options],
            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                self.rest("api/status")
                return
            except OSError:
                time.sleep(0.3)
        raise TimeoutError(f"the server did not start; see {log}")

    def rest(self, path: str, method: str = "GET", body: object = None) -> object:
        req = urllib.request.Request(f"{self.url}/{path}", method=method, headers={"Authorization": f"token {TOKEN}"},
                                     data=None if body is None else json.dumps(body).encode())
        with urllib.request.urlopen(req, timeout=3600) as resp:
            data = resp.read()
        return json.loads(data) if data else None

    def kernel(self, path: str) -> tuple[str, websocket.WebSocket]:
        session = self.rest("api/sessions", "POST", {"path": path, "type": "notebook", "name": path,
                                                     "kernel": {"name": "python3"}})
        kid = session["kernel"]["id"]
        ws = websocket.create_connection(f"ws://127.0.0.1:{self.port}/api/kernels/{kid}/channels?session_id={uuid.uuid4()}",
                                         header=[f"Authorization: token {TOKEN}"], timeout=3600)
        return kid, ws

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(600)


def run_cell(ws: websocket.WebSocket, source: str, timing: dict[str, float] | None = None) -> str:
    """Execute ``source`` as JupyterLab does; its stdout once the reply and idle arrived.
    ``timing["kernel_s"]``: how long the kernel itself ran it (its reply's ``started`` to its date);
    ``first_output_s`` and ``done_s``: seconds from sending it to its first output, and to the idle."""
    msg_id = uuid.uuid4().hex
    t0 = time.perf_counter()
    ws.send(json.dumps({"header": {"msg_id": msg_id, "msg_type": "execute_request", "username": "bench", "session": "b",
                                   "version": "5.3", "date": ""}, "parent_header": {}, "metadata": {}, "channel": "shell",
                        "content": {"code": source, "silent": False, "store_history": True, "user_expressions": {},
                                    "allow_stdin": False, "stop_on_error": True}}))
    out, reply, idle = [], None, False
    while reply is None or not idle:
        msg = json.loads(ws.recv())
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            if timing is not None:
                timing.setdefault("first_output_s", time.perf_counter() - t0)
            out.append(msg["content"]["text"])
        elif kind == "error":
            raise RuntimeError("\n".join(msg["content"]["traceback"])[-2000:])
        elif kind == "execute_reply":
            reply = msg
            if timing is not None:
                started = datetime.fromisoformat(msg["metadata"]["started"]).timestamp()
                replied = datetime.fromisoformat(msg["header"]["date"]).timestamp()
                timing.update(kernel_s=replied - started, started_at=started, replied_at=replied)
        elif kind == "status" and msg["content"]["execution_state"] == "idle":
            idle = True
    if timing is not None:
        timing["done_s"] = time.perf_counter() - t0
        timing.setdefault("first_output_s", timing["done_s"])
    return "".join(out).strip()


class GpuFreeWatch:
    """When NVML stops listing any compute process on any GPU (the kernel is the only GPU user)."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.freed_after: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not any(g.processes for g in gpus.list_gpus()):
                self.freed_after = time.perf_counter() - self.t0
                return
            time.sleep(0.01)

    def stop(self) -> float | None:
        self._stop.set()
        self._thread.join()
        return self.freed_after


class DiskWatch:
    """The store's block device over time (its sysfs ``stat``, every 20 ms): when it started and
    stopped writing (``reads``: reading) during a suspend (a resume), how fast it went in
    between, how long it was busy then, and what it did in any span (``window``). None where the
    store is not on a block device of its own (tmpfs, overlay)."""

    def __init__(self, store: Path, reads: bool = False) -> None:
        self.stat = block_device_stat(store)
        self.key = "read" if reads else "written"
        self.samples: list[tuple[float, dict[str, int]]] = []  # (time.time(), counters)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(self.stat,), daemon=True)
        if self.stat is not None:
            self._thread.start()

    def _run(self, stat: Path) -> None:
        while not self._stop.is_set():
            self.samples.append((time.time(), device_counters(stat)))
            time.sleep(0.02)

    def stop(self) -> dict | None:
        """Seconds from the start to the first byte and to 50 / 90 / 100 % of them, the bytes, the
        rate from the first to the last, and the seconds the disk was busy in between."""
        if self.stat is None:
            return None
        self._stop.set()
        self._thread.join()
        (t0, base), (_, last) = self.samples[0], self.samples[-1]
        total = last[self.key] - base[self.key]

        def at(fraction: float) -> tuple[float, dict[str, int]]:
            return next((t - t0, c) for t, c in self.samples if c[self.key] - base[self.key] >= fraction * total)

        (first, c_first), (done, c_done) = at(1e-4), at(1.0)
        return {"bytes": total, "first_s": first, "half_s": at(0.5)[0], "ninety_s": at(0.9)[0], "done_s": done,
                "gbs_while_busy": total / max(done - first, 1e-9) / 1e9,
                "busy_s": (c_done["busy_ms"] - c_first["busy_ms"]) / 1000}

    def window(self, start: float, end: float) -> dict | None:
        """What the disk did from ``start`` to ``end`` (time.time()): bytes read, written and
        discarded, and the seconds it was busy."""
        inside = [c for t, c in self.samples if start <= t <= end]
        if len(inside) < 2:
            return None
        a, b = inside[0], inside[-1]
        return {"read": b["read"] - a["read"], "written": b["written"] - a["written"],
                "discarded": b["discarded"] - a["discarded"], "busy_s": (b["busy_ms"] - a["busy_ms"]) / 1000}


def kernel_tree(kernel_id: str) -> list[psutil.Process]:
    """The kernel's process tree: its namespace holder and what runs under it, else (a kernel
    without one) the process whose command line names the kernel and its children."""
    root = kernel_holder(kernel_id) or next(
        (p for p in psutil.process_iter(["cmdline"]) if kernel_id in " ".join(p.info["cmdline"] or [])), None)
    return [root, *root.children(recursive=True)] if root else []


def kernel_holder(kernel_id: str) -> psutil.Process | None:
    """The ``unshare`` that holds the kernel's namespace. Found by name before any command line
    is read: a lazily restored kernel's would wait for its memory."""
    for p in psutil.process_iter(["name"]):
        try:
            if p.info["name"] == "unshare" and kernel_id in " ".join(p.cmdline()):
                return p
        except psutil.Error:  # one that ended meanwhile (an earlier holder, after a suspend)
            continue
    return None


def kernel_main_pid(kernel_id: str) -> int | None:
    """The kernel's own process: the deepest Python process under its holder."""
    holder = kernel_holder(kernel_id)
    if holder is None:
        return None
    below = holder.children(recursive=True)
    parent = {p.pid: p.ppid() for p in below}
    pythons = [p.pid for p in below if p.name().startswith("python")]
    return max(pythons, key=lambda pid: _depth(pid, parent)) if pythons else None


def _depth(pid: int, parent: dict[int, int]) -> int:
    n = 0
    while pid in parent:
        pid, n = parent[pid], n + 1
    return n


def kernel_huge_pages(kernel_id: str) -> int:
    """Bytes of the kernel tree's anonymous memory in transparent huge pages (CRIU restores in
    4 KiB pages)."""
    return sum(_anon_huge_pages(p.pid) for p in kernel_tree(kernel_id))


def _anon_huge_pages(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            return next((int(line.split()[1]) << 10 for line in f if line.startswith("AnonHugePages:")), 0)
    except OSError:
        return 0


def idle_cpu(kernel_id: str, seconds: float) -> dict:
    """CPU seconds the kernel's process tree used while idle for ``seconds`` (before its idle
    collection starts), and its busiest threads: after a restore nothing should spin."""
    def sample() -> dict[tuple[int, int], tuple[str, float]]:
        out = {}
        for p in kernel_tree(kernel_id):
            try:
                for t in p.threads():
                    comm = Path(f"/proc/{p.pid}/task/{t.id}/comm").read_text().strip()
                    out[(p.pid, t.id)] = (comm, t.user_time + t.system_time)
            except (psutil.Error, OSError):
                continue
        return out

    before = sample()
    time.sleep(seconds)
    deltas = sorted(((cpu - before.get(key, ("", 0.0))[1], comm, key[1]) for key, (comm, cpu) in sample().items()),
                    reverse=True)
    return {"cpu_s": round(sum(d for d, _, _ in deltas), 3), "threads": len(deltas),
            "busiest": [(comm, tid, round(d, 3)) for d, comm, tid in deltas[:3]]}


def kernel_rss(kernel_id: str) -> int:
    """Host memory of the kernel's process tree."""
    return sum(p.memory_info().rss for p in kernel_tree(kernel_id))


def drop_from_memory(store: Path) -> float:
    """Evict the whole store from the page cache, as after a reboot; returns what stayed resident."""
    files = [p for p in store.rglob("*") if p.is_file()]
    evict(files)
    return resident_fraction(files)


def gpucr_rounds(server: Server, kind: str, rounds: int, cold: bool, gap: float,
                 cells_before: int) -> tuple[list[dict], float, dict, dict | None]:
    setup, cell = code(kind)
    kid, ws = server.kernel("w2.ipynb")
    t0 = time.perf_counter()
    run_cell(ws, setup)
    reference = run_cell(ws, cell)
    cold_start = time.perf_counter() - t0
    # what the CPUs did during each cell: is a slower cell after a restore short of CPU, or slower on it?
    watch_cells = CellWatch(lambda: kernel_main_pid(kid))
    warm_before: list[float] = []  # the cell in the kernel as started, several times: how much it varies on this machine
    cpu_before = []
    for _ in range(cells_before):
        t0, timing = time.perf_counter(), {}
        run_cell(ws, cell, timing)
        warm_before.append(time.perf_counter() - t0)
        cpu_before.append(watch_cells.window(timing["started_at"], timing["replied_at"]))
    rows = []
    for i in range(rounds):
        # the user goes idle: background work after a cell or a restore has this long (the first
        # 1.5 s, before the idle collection, show whether anything spins)
        idle = idle_cpu(kid, min(gap, 1.5))
        time.sleep(max(0.0, gap - 1.5))
        rss, huge_before = kernel_rss(kid), kernel_huge_pages(kid)
        watch = GpuFreeWatch() if kind == "gpu" else None
        disk = DiskWatch(server.store) if cold else None
        t0 = time.perf_counter()
        st = server.rest(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        suspend_s = time.perf_counter() - t0
        gpu_free = watch.stop() if watch else None
        disk_writes = disk.stop() if disk else None
        live = (st.get("trim") or {}).get("live_bytes", 0) + rss
        resident = drop_from_memory(server.store) if cold else None
        reading = DiskWatch(server.store, reads=True) if cold else None
        t0, sent_at, first = time.perf_counter(), time.time(), {}
        digest = run_cell(ws, cell, first)
        resume_s = time.perf_counter() - t0
        disk_reads = reading.stop() if reading else None
        if disk_reads and "started_at" in first:  # the disk while the first cell ran
            disk_reads["during_cell"] = reading.window(first["started_at"], first["replied_at"])
        restored = server.rest(f"api/gpucr/kernels/{kid}")
        # where the time outside the restore and the cell went (one clock: all on this machine)
        rt = restored["timings"]
        split = {"to_restored": restored["restored_at"] - sent_at - rt.get("total", 0.0),
                 # of which the server's own steps before and after the engine's restore
                 "server_before": rt.get("server_before", 0.0), "server_after": rt.get("server_after", 0.0),
                 "engine_other": rt.get("engine_other", 0.0),
                 "restored_to_started": first["started_at"] - restored["restored_at"],
                 "replied_to_client": sent_at + resume_s - first["replied_at"]} if "started_at" in first else None
        t0, warm = time.perf_counter(), {}
        warm_digest = run_cell(ws, cell, warm)
        warm_s = time.perf_counter() - t0
        cpu = {"first_cell": watch_cells.window(first["started_at"], first["replied_at"]) if "started_at" in first else None,
               "warm_cell": watch_cells.window(warm["started_at"], warm["replied_at"])}
        huge_after = kernel_huge_pages(kid)
        offloaded = ((st.get("trim") or {}).get("offload") or {}).get("bytes", 0)  # tensors written beside the image
        rows.append({"round": i + 1, "gpu_free_s": gpu_free, "suspend_s": suspend_s,
                     "image_bytes": st["checkpoint"]["size"] + offloaded, "offloaded_bytes": offloaded,
                     "live_bytes": live, "resume_first_result_s": resume_s,
                     "first_cell_in_kernel_s": first.get("kernel_s"), "warm_cell_s": warm_s,
                     "same_result": digest == warm_digest == reference, "timings": st["timings"], "trim": st.get("trim"),
                     "huge_pages_before": huge_before, "huge_pages_after": huge_after, "resident_before_resume": resident,
                     "lazy_restore": (server.store / "procs" / kid / ".pages").exists(),
                     "restore_timings": restored["timings"], "page_daemon_log": _page_daemon_log(server.store),
                     "disk_writes": disk_writes, "disk_reads": disk_reads, "idle_before_suspend": idle, "rest_split": split, "cpu_during": cpu})
    watch_cells.stop()
    moved = None
    if kind == "gpu":
        try:
            moved = fidelity_round(server, kid, ws, cell, reference)
        except Exception as e:  # keep the rounds' figures
            moved = {"error": str(e)[-2000:]}
    ws.close()
    server.rest(f"api/kernels/{kid}", "DELETE")
    return rows, cold_start, {"seconds": warm_before, "cpu_during": cpu_before}, moved


def _page_daemon_log(store: Path) -> list[str]:
    """What the restore's page daemon said (how much it copied in, how fast), newest checkpoint first."""
    logs = sorted(store.glob("checkpoints/*/lazy-pages.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    return logs[0].read_text().splitlines()[-4:] if logs else []


def fidelity_round(server: Server, kid: str, ws: websocket.WebSocket, cell: str, reference: str) -> dict:
    """Suspend, restore onto the other GPU if there is one, else the same (REST resume with
    ``gpu``), then compare bit for bit."""
    run_cell(ws, GPU_FIDELITY_SETUP)
    before = json.loads(run_cell(ws, GPU_FIDELITY_CELL))
    pid_gpus = {g.index: g.uuid for g in gpus.list_gpus() if g.processes}
    server.rest(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
    machine = gpus.list_gpus()
    target = next((g for g in machine if g.index not in pid_gpus), None) or next(g for g in machine if g.index in pid_gpus)
    t0 = time.perf_counter()
    server.rest(f"api/gpucr/kernels/{kid}/resume", "POST", {"gpu": str(target.index)})
    digest = run_cell(ws, cell)
    resume_s = time.perf_counter() - t0
    after = json.loads(run_cell(ws, GPU_FIDELITY_CELL))
    now_on = [g.uuid for g in gpus.list_gpus() if g.processes]
    return {"from": pid_gpus, "to": target.uuid, "other_gpu": target.index not in pid_gpus, "nvml_now": now_on,
            "resume_and_cell_s": resume_s,
            "tokens_identical": digest == reference,
            **{f"{k}_identical": before[k] == after[k] for k in ("params", "kv", "optimizer")},
            "torch_uuid_before": before["torch_uuid"], "torch_uuid_after": after["torch_uuid"],
            "driver_uuid_before": before["driver_uuid"], "driver_uuid_after": after["driver_uuid"]}


RAW_AGENT = """
import json, socket, sys
{setup}
def run_cell():
    import io, contextlib
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        exec(compile({cell!r}, "cell", "exec"), globals())
    return buf.getvalue().strip()
server = socket.socket(); server.bind(("127.0.0.1", 0)); server.listen()
print(json.dumps({{"port": server.getsockname()[1], "digest": run_cell()}}), flush=True)
while True:
    conn, _ = server.accept()
    conn.sendall(json.dumps({{"digest": run_cell()}}).encode() + b"\\n"); conn.close()
"""


def ask(port: int) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=600) as s:
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def raw_round(store: Path, kind: str) -> dict:
    """The same workload in a plain process, through the bare driver API and CRIU commands."""
    setup, cell = code(kind)
    images, log = store / "raw-images", store / "raw.out"
    images.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", RAW_AGENT.format(setup=setup, cell=cell)], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not log.read_text().startswith("{"):
        time.sleep(0.2)
    hello = json.loads(log.read_text().splitlines()[0])
    gpu_free, suspend_s = raw_path.checkpoint(proc, images, kind == "gpu")
    t0 = time.perf_counter()
    raw_path.restore(proc.pid, images, kind == "gpu")
    digest = ask(hello["port"])["digest"]
    resume_s = time.perf_counter() - t0
    size = dir_size(images)
    subprocess.run(["kill", "-9", str(proc.pid)], check=False)
    shutil.rmtree(images, ignore_errors=True)
    return {"gpu_free_s": gpu_free, "suspend_s": suspend_s, "image_bytes": size, "resume_first_result_s": resume_s,
            "same_result": digest == hello["digest"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["gpu", "cpu"], default="gpu")
    ap.add_argument("--store", default=None, help="checkpoint store (default: a temporary directory)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--no-raw", action="store_true")
    ap.add_argument("--gap", type=float, default=0.0, help="seconds between the last cell and each suspend "
                    "(an idle user; gpucr_hooks collects garbage after 2 s)")
    ap.add_argument("--cold", action="store_true", help="evict the store from the page cache before each resume, "
                    "and measure the store's disk bandwidth in the same run")
    ap.add_argument("--eager", action="store_true", help="restore all memory before the kernel runs (GPUCR.lazy_restore off)")
    ap.add_argument("--cells-before", type=int, default=3, help="times the cell runs before the first suspend")
    ap.add_argument("--json-out")
    args = ap.parse_args()
    store = Path(args.store or tempfile.mkdtemp(prefix="gpucr-w2-"))
    store.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpucr-w2-root-"))
    cuda.unavailable_reason()
    server = Server(work, store / "gpucr", work / "server.log", ("--GPUCR.lazy_restore=False",) if args.eager else ())
    try:
        rows, cold, warm_before, moved = gpucr_rounds(server, args.kind, args.rounds, args.cold, args.gap,
                                                        max(1, args.cells_before))
    finally:
        server.stop()
    raw = None if args.no_raw else raw_round(store, args.kind)
    disk = disk_bandwidth(store, 4.0) if args.cold else None
    fmt = "{:8} {:>10} {:>10} {:>12} {:>12} {:>12} {:>9} {:>6}"
    print(fmt.format("path", "gpu free s", "suspend s", "image MiB", "live MiB", "resume+cell", "warm s", "same"))
    for r in rows:
        print(fmt.format(f"gpucr {r['round']}", _s(r["gpu_free_s"]), _s(r["suspend_s"]), r["image_bytes"] >> 20,
                         r["live_bytes"] >> 20, _s(r["resume_first_result_s"]), _s(r["warm_cell_s"]), r["same_result"]))
    if raw:
        print(fmt.format("raw", _s(raw["gpu_free_s"]), _s(raw["suspend_s"]), raw["image_bytes"] >> 20, "-",
                         _s(raw["resume_first_result_s"]), "-", raw["same_result"]))
    for r in rows:
        for step, key, total in (("suspend", "disk_writes", "suspend_s"), ("resume", "disk_reads", "resume_first_result_s")):
            if w := r[key]:
                print(f"round {r['round']}: the {step}'s {w['bytes'] / 1e9:.2f} GB moved from {w['first_s']:.2f} s to "
                      f"{w['done_s']:.2f} s ({w['gbs_while_busy']:.2f} GB/s, busy {w['busy_s']:.2f} s in between; half at "
                      f"{w['half_s']:.2f} s, 90 % at {w['ninety_s']:.2f} s) of the {r[total]:.2f} s {step}")
            if w and (c := w.get("during_cell")):
                print(f"round {r['round']}: during the first cell the disk read {c['read'] / 1e6:.0f} MB, wrote "
                      f"{c['written'] / 1e6:.0f} MB, discarded {c['discarded'] / 1e6:.0f} MB, busy {c['busy_s']:.2f} s")
    for r in rows:
        idle = r["idle_before_suspend"]
        print(f"round {r['round']}: the idle kernel before the suspend used {idle['cpu_s']:.2f} s of CPU in "
              f"{min(args.gap, 1.5):.1f} s ({idle['threads']} threads; busiest {idle['busiest']})")
    for r in rows:  # where the suspend went: the kernel's offload, then the checkpointer's steps
        t, offload = r["timings"], ((r["trim"] or {}).get("offload") or {})
        print(f"round {r['round']}: suspend {r['suspend_s']:.2f} s: the kernel's offload {offload.get('seconds', 0):.2f} s, "
              + ", ".join(f"{k.replace('_', ' ')} {v:.3f} s" for k, v in t.items() if k != "total")
              + f" (checkpointer {t.get('total', 0):.2f} s)")
    for r in rows:  # where resume + cell went: the server's restore, the cell in the kernel, the rest (HTTP, websocket)
        restore_s, cell_s = r["restore_timings"].get("total", 0.0), r["first_cell_in_kernel_s"] or 0.0
        split = r["rest_split"] or {}
        print(f"round {r['round']}: restore {restore_s:.2f} s + the cell in the kernel {cell_s:.2f} s "
              f"+ the rest {r['resume_first_result_s'] - restore_s - cell_s:.2f} s ("
              + ", ".join(f"{k.replace('_', ' ')} {v:.3f} s" for k, v in split.items()) + ")")
    best = min(r["resume_first_result_s"] for r in rows)
    print(f"cold start (fresh kernel: setup + cell) {cold:.2f} s; cold start / resume {cold / best:.1f}x; "
          f"the cell before any suspend {' / '.join(f'{t:.2f}' for t in warm_before['seconds'])} s")
    for label, window in [*((f"cell {i + 1} before any suspend", w) for i, w in enumerate(warm_before["cpu_during"])),
                          *((f"round {r['round']}: {k.replace('_', ' ')}", w) for r in rows for k, w in r["cpu_during"].items())]:
        if window:
            print(f"{label}: {window['wall_s']:.2f} s (from {window['late_s']:.2f} s in), its main thread on a CPU {window['main_thread_cpu_s']:.2f} s "
                  f"(preempted {window['main_thread_preempted']}x, page faults minor / major {window['main_thread_faults']}); "
                  f"other busy cores {window['other_busy_cores']}, "
                  f"steal {window['steal_s']:.2f} s, iowait {window['iowait_s']:.2f} s; busiest {window['top']}"
                  + (f"; GPU {window['gpu_util_pct']} % busy, SM clock {window['sm_mhz_min']}-{window['sm_mhz_mean']} MHz "
                     "(lowest-mean)" if "gpu_util_pct" in window else ""))
    if moved:
        print(f"restored onto the {'other' if moved.get('other_gpu') else 'same'} GPU: {json.dumps(moved)}")
    if disk:
        print(f"store disk: write + fsync {disk['write_gbs']:.2f} GB/s, cold read {disk['read_gbs']:.2f} GB/s (8 threads)")
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(), "cpus": os.cpu_count(),
              "kind": args.kind, "store": str(store), "restore": "eager" if args.eager else "lazy",
              "gpus": [g.name for g in gpus.list_gpus()], "driver": gpus.driver_version(),
              "gap_s": args.gap, "rounds": rows, "raw": raw, "cold_start_s": cold, "cells_before": warm_before, "moved": moved, "disk": disk}
    print(json.dumps(result, indent=2, default=str))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2, default=str))
    shutil.rmtree(work, ignore_errors=True)  # the server's log; kept when the bench failed
    if not args.store:
        shutil.rmtree(store, ignore_errors=True)


def _s(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


if __name__ == "__main__":
    main()

"""Checkpoint/restore of a notebook's state: the gpucr snapshot engine against session pickling
(dill) and Kishu, on the same states executed in real ipykernels.

    python bench/bench_snapshot.py [--array-mb 200] [--model-mb 64] [--states arrays,model,unkeepable]
                                   [--methods snapshot,dill,kishu] [--server-rounds N [--warm-wait S]]
                                   [--json-out FILE] [--keep DIR]

At the defaults a run takes about 2.5 minutes on 2 cores (results: docs/dev/benchmarks-snapshot.md).

States (cells run with history, as a notebook would):
  arrays      NumPy arrays of ``--array-mb`` MB in all + a pandas DataFrame
  model       a PyTorch CPU MLP of ``--model-mb`` MB of parameters + Adam after a few steps
  unkeepable  ``model`` + a generator, an open file (written to) and a lock

Methods, each restoring into a fresh kernel (its start is not counted):
  snapshot    ``jupyter_gpucr.server.kernel_rpc.save`` in the kernel, ``load`` in a fresh one
  dill        ``dill.dump_module(path)`` run in the kernel, ``dill.load_module(path)`` in a fresh one
  kishu       Kishu (``kishu.init_kishu``) commits after every cell: its per-cell overhead is the cell
              time with Kishu minus the same cell without; restore is ``_kishu.checkout(head)`` in a
              fresh kernel; size is the notebook's ``.kishudb``. Kishu runs headless in its own test
              mode (``ENV_KISHU_TEST_MODE``: no notebook-file saving through a frontend) and is told
              the notebook path by ``TEST_NOTEBOOK_PATH`` (there is no server session to ask).

After each restore a probe fingerprints every variable (array hashes, model and optimizer tensors,
whether the optimizer still holds the model's parameters, a file's position and size on disk, a
generator's state) and compares it with the original kernel: "lost" names are missing, "changed"
names are present but differ. Restore times include importing numpy/pandas/torch in the fresh kernel.

dill and kishu are needed by this benchmark only (not dependencies of jupyter-gpucr):

    .venv/bin/pip install dill kishu

A method whose package is missing is reported as failed with the import error.

``--server-rounds N``: the ``model`` state's restore through a real jupyter server with gpucr (``--methods ""``
runs only this): N rounds each of a suspend with the snapshot engine followed at once by the cell (*cold*: the
restore starts a fresh kernel), of a suspend after which the notebook is opened again and the cell runs
``--warm-wait`` seconds later (*warm*: the kernel was started when it was opened, ``c.GPUCR.warm_start_timeout_s``),
and, where CRIU runs, of the whole-process engine (*criu*). Per round: the suspend, the server's restore
(``timings.total``), its start and load, and the cell's answer from sending it; per snapshot restore, the load's
steps in the kernel. ``--w2``: the kernel holds W2 instead (``bench/w2_workload.py``: a 2.7 B-parameter model
on cuda:0 and its KV cache; a GPU machine) and the cell generates W2's tokens. On the H200 machine, with the
store in memory as W2's other figures (``--keep`` is the working directory; remove it after)::

    python3 bench/bench_snapshot.py --methods "" --w2 --server-rounds 2 --keep /dev/shm/gpucr-snapshot-w2
"""
from __future__ import annotations

import argparse
import ast
import asyncio
import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jupyter_client.manager import AsyncKernelManager  # noqa: E402

from jupyter_gpucr.server import kernel_rpc as snapshot  # noqa: E402

HOOKS_DIR = Path(__file__).resolve().parents[1] / "kernel_hooks"
METHODS = ("snapshot", "dill", "kishu")
STATES = ("arrays", "model", "unkeepable")
CELL_TIMEOUT = 600.0
# the cell of the server rounds: reads the model and the losses, changes nothing
SERVER_CELL = "print(round(sum(float(p.detach().double().sum()) for p in model.parameters()), 3), len(losses))"

# ---- notebook states ---------------------------------------------------------------------------

ARRAYS = [
    "import numpy as np, pandas as pd",
    "rng = np.random.default_rng(0)",
    # 3/4 of the bytes in float64, 1/4 in float32
    ("a = rng.standard_normal(int({array_mb} * 2**20 * 3 / 4 / 8))\n"
     "b = rng.standard_normal(int({array_mb} * 2**20 / 4 / 4), dtype=np.float32)"),
    ("n = 300_000\n"
     "df = pd.DataFrame({{'id': np.arange(n), 'x': rng.random(n), 'y': rng.integers(0, 100, n),\n"
     "                   'cat': pd.Categorical(rng.choice(['red', 'green', 'blue'], n)),\n"
     "                   's': [f'row{{i}}' for i in range(n)]}})"),
    "stats = df.groupby('cat', observed=True)['x'].mean().to_dict()",
    "a[:1000] *= 2  # touches a large array",
    "counter = 1  # touches nothing large",
]

MODEL = [
    "import torch\ntorch.manual_seed(0)\ntorch.set_num_threads(2)",
    # three hidden layers of width h: about 3*h*h parameters (float32)
    ("h = int(({model_mb} * 2**20 / 4 / 3) ** 0.5)\n"
     "model = torch.nn.Sequential(torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, h),\n"
     "                            torch.nn.ReLU(), torch.nn.Linear(h, h), torch.nn.ReLU(), torch.nn.Linear(h, 10))\n"
     "opt = torch.optim.Adam(model.parameters(), lr=1e-3)\n"
     "xb, yb = torch.randn(64, h), torch.randint(0, 10, (64,))"),
    ("def train_step():\n"
     "    opt.zero_grad()\n"
     "    loss = torch.nn.functional.cross_entropy(model(xb), yb)\n"
     "    loss.backward()\n"
     "    opt.step()\n"
     "    return loss.item()"),
    "losses = [train_step() for _ in range(3)]",
    "losses.append(train_step())  # touches the model and the optimizer",
    "counter = 1  # touches nothing large",
]

UNKEEPABLE = MODEL + [
    "import threading\nlock = threading.Lock()",
    "log = open({log!r}, 'w')\nlog.write('epoch 1\\n')\nlog.flush()",
    "gen = (i * i for i in range(10))\nnext(gen)",
]

# Runs in the kernel (through runpy, so it binds no name there): a JSON fingerprint per variable.
PROBE = r'''
import hashlib, inspect, io, json, os, sys, types

def _hash(buffer):
    try:
        import xxhash
        return xxhash.xxh3_64_hexdigest(buffer)
    except ImportError:
        return hashlib.blake2b(buffer, digest_size=8).hexdigest()

def _array(np, value):
    return f"{value.dtype}{list(value.shape)}:{_hash(np.ascontiguousarray(value).reshape(-1).view(np.uint8))}"

def _tensor(np, value):
    return _array(np, value.detach().cpu().contiguous().numpy())

def fingerprint(value, params):
    np, pd, torch = (sys.modules.get(m) for m in ("numpy", "pandas", "torch"))
    if isinstance(value, types.ModuleType):
        return value.__name__
    if np is not None and isinstance(value, np.ndarray):
        return _array(np, value)
    if pd is not None and isinstance(value, pd.DataFrame):
        return f"{[str(t) for t in value.dtypes]}:{int(pd.util.hash_pandas_object(value).sum())}"
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor(np, value)
    if torch is not None and isinstance(value, torch.nn.Module):
        return ";".join(f"{k}={_tensor(np, v)}" for k, v in value.state_dict().items())
    if torch is not None and isinstance(value, torch.optim.Optimizer):
        state = value.state_dict()
        tensors = ";".join(f"{i}.{k}={_tensor(np, v) if torch.is_tensor(v) else v}"
                           for i, s in sorted(state["state"].items()) for k, v in sorted(s.items()))
        shared = all(id(p) in params for g in value.param_groups for p in g["params"])
        return f"shares the model's parameters={shared};{tensors}"
    if isinstance(value, types.GeneratorType):
        local = {k: repr(v) for k, v in inspect.getgeneratorlocals(value).items() if not k.startswith(".")}
        return f"generator {inspect.getgeneratorstate(value)} {local}"
    if isinstance(value, io.IOBase):
        closed = value.closed
        where = "closed" if closed else f"position {value.tell()}"
        name = getattr(value, "name", "?")
        size = os.path.getsize(name) if isinstance(name, str) and os.path.exists(name) else None
        return f"{type(value).__name__} mode={getattr(value, 'mode', '?')} {where}, {size} bytes on disk"
    if type(value).__name__ == "lock":
        return f"lock locked={value.locked()}"
    if isinstance(value, types.FunctionType):
        return f"function {value.__qualname__}:{_hash(value.__code__.co_code)}"
    if isinstance(value, (int, float, str, bool, list, tuple, dict)):
        return _hash(repr(value).encode())
    return type(value).__qualname__

def probe():
    from IPython import get_ipython
    from gpucr_hooks.namespace import type_name, user_variables
    variables = {n: v for n, v in user_variables(get_ipython()).items() if not n.startswith("_")}
    torch = sys.modules.get("torch")
    params = set()
    if torch is not None:
        for v in variables.values():
            if isinstance(v, torch.nn.Module):
                params.update(id(p) for p in v.parameters())
    return json.dumps({n: {"type": type_name(v), "fp": fingerprint(v, params)} for n, v in variables.items()})
'''

# ---- kernels -------------------------------------------------------------------------------------


class CellError(Exception):
    def __init__(self, content: dict[str, Any]) -> None:
        self.ename = content.get("ename", "Error")
        self.evalue = content.get("evalue", "")
        super().__init__(f"{self.ename}: {self.evalue}")


def kernel_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HOOKS_DIR), os.environ.get("PYTHONPATH")]))
    return env


@contextlib.asynccontextmanager
async def kernel(env: dict[str, str], cwd: Path) -> AsyncIterator[tuple[Any, float]]:
    """A fresh ipykernel and the seconds it took to start; shut down on exit."""
    t0 = time.perf_counter()
    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel(env=env, cwd=str(cwd))
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=120)
        yield client, time.perf_counter() - t0
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


async def execute(client: Any, code: str, *, silent: bool = False,
                  user_expressions: dict[str, str] | None = None) -> tuple[float, dict[str, Any]]:
    """Run code (a notebook cell unless ``silent``); its wall time and reply content."""
    t0 = time.perf_counter()
    reply = await client.execute_interactive(code, silent=silent, store_history=not silent,
                                             user_expressions=user_expressions or {},
                                             output_hook=lambda msg: None, timeout=CELL_TIMEOUT)
    elapsed = time.perf_counter() - t0
    content = reply["content"]
    if content["status"] != "ok":
        raise CellError(content)
    return elapsed, content


async def evaluate(client: Any, expression: str) -> Any:
    """Evaluate an expression silently in the kernel; its value (a literal) back here."""
    _, content = await execute(client, "", silent=True, user_expressions={"r": expression})
    result = content["user_expressions"]["r"]
    if result["status"] != "ok":
        raise CellError(result)
    return ast.literal_eval(result["data"]["text/plain"])


async def probe(client: Any, probe_file: Path) -> dict[str, dict[str, str]]:
    return json.loads(await evaluate(client, f"__import__('runpy').run_path({str(probe_file)!r})['probe']()"))


def compare(original: dict[str, dict[str, str]], restored: dict[str, dict[str, str]]) -> dict[str, Any]:
    lost = [n for n in original if n not in restored]
    changed = {n: {"before": original[n]["fp"], "after": restored[n]["fp"]}
               for n in original if n in restored and restored[n]["fp"] != original[n]["fp"]}
    return {"lost": lost, "changed": changed, "identical": [n for n in original if n in restored and n not in changed]}


def dir_size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


async def build(client: Any, cells: list[str]) -> list[float]:
    return [(await execute(client, cell))[0] for cell in cells]


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, CellError) else f"{type(exc).__name__}: {exc}"


# ---- methods --------------------------------------------------------------------------------------


async def snapshot_method(original: Any, work: Path, env: dict[str, str], before: dict, probe_file: Path) -> dict:
    target = work / "snapshot"
    t0 = time.perf_counter()
    saved = await snapshot.save(original, target, timeout=CELL_TIMEOUT)
    save_s = time.perf_counter() - t0
    result: dict[str, Any] = {"checkpoint_s": save_s, "bytes": dir_size(target),
                              "reported_lost": {i["name"]: i["reason"] for i in saved["lost"]}}
    async with kernel(env, work) as (fresh, start_s):
        t0 = time.perf_counter()
        loaded = await snapshot.load(fresh, target, timeout=CELL_TIMEOUT)
        result["restore_s"] = time.perf_counter() - t0
        result["fresh_kernel_start_s"] = start_s
        result["warnings"] = loaded["warnings"]
        result.update(compare(before, await probe(fresh, probe_file)))
    return result


async def dill_method(original: Any, work: Path, env: dict[str, str], before: dict, probe_file: Path) -> dict:
    target = work / "session.pkl"
    try:
        save_s, _ = await execute(original, f"__import__('dill').dump_module({str(target)!r})", silent=True)
    except CellError as exc:
        return {"failed": f"dill.dump_module raised {error_text(exc)}", "bytes": None}
    result: dict[str, Any] = {"checkpoint_s": save_s, "bytes": dir_size(target)}
    async with kernel(env, work) as (fresh, start_s):
        try:
            result["restore_s"], _ = await execute(fresh, f"__import__('dill').load_module({str(target)!r})", silent=True)
        except CellError as exc:
            return {**result, "failed": f"dill.load_module raised {error_text(exc)}"}
        result["fresh_kernel_start_s"] = start_s
        result.update(compare(before, await probe(fresh, probe_file)))
    return result


KISHU_INIT = "__import__('kishu').init_kishu({path!r})"
KISHU_PLAN = """[type(a).__name__ + ': ' + (a.cell_code if hasattr(a, 'cell_code') else
    ', '.join(sorted(n for vs in getattr(a, 'variable_snapshots', ()) for n in vs.name)))
    for _, a in sorted(_kishu._cr_planner.generate_incremental_restore_plan(_kishu.database_path(), {head!r}).actions.items(),
                       key=lambda kv: kv[0])]"""


async def kishu_method(cells: list[str], plain_cell_s: list[float], work: Path, probe_file: Path) -> dict:
    notebook = work / "kishu" / "notebook.ipynb"
    notebook.parent.mkdir()
    notebook.write_text(json.dumps({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    env = kernel_env({"TEST_NOTEBOOK_PATH": str(notebook), "ENV_KISHU_TEST_MODE": "1",
                      "KISHU_PATH_ROOT": str(notebook.parent)})
    result: dict[str, Any] = {}
    async with kernel(env, work) as (original, _):
        try:
            result["init_s"], _ = await execute(original, KISHU_INIT.format(path=str(notebook)), silent=True)
        except CellError as exc:
            return {"failed": f"kishu.init_kishu raised {error_text(exc)}", "bytes": None}
        try:
            cell_s = await build(original, cells)
        except CellError as exc:
            return {"failed": f"a cell failed under Kishu: {error_text(exc)}", "bytes": None}
        before = await probe(original, probe_file)
        head = await evaluate(original, "_kishu._kishu_branch.get_head().commit_id")
    # the first cell (imports) is left out: Kishu has imported numpy and pandas itself already
    overhead = [k - p for k, p in zip(cell_s, plain_cell_s)][1:]
    result.update({"cell_s": cell_s, "cell_overhead_s": overhead, "checkpoint_s": sum(overhead),
                   "max_cell_overhead_s": max(overhead),
                   "bytes": sum(dir_size(f) for f in notebook.parent.glob("notebook.kishudb*")), "head": head})
    async with kernel(env, work) as (fresh, start_s):
        # not in restore_s: a Kishu user loads Kishu when the kernel starts, before any checkout
        result["fresh_init_s"], _ = await execute(fresh, KISHU_INIT.format(path=str(notebook)), silent=True)
        result["restore_plan"] = await evaluate(fresh, KISHU_PLAN.format(head=head))
        try:
            result["restore_s"], _ = await execute(fresh, f"_kishu.checkout({head!r})", silent=True)
        except CellError as exc:
            return {**result, "failed": f"_kishu.checkout raised {error_text(exc)}"}
        result["fresh_kernel_start_s"] = start_s
        result.update(compare(before, await probe(fresh, probe_file)))
    return result


# ---- through a server -------------------------------------------------------------------------------


async def server_rounds(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    """The ``model`` state's restores through a real server: cold, warm and criu rounds (module docstring)."""
    from tests.kernel_ws import execute as run_cell
    from tests.server.test_server_lifecycle import RealServer

    work = root / "server"
    work.mkdir()
    if args.w2:
        from bench.w2_workload import GPU_CELL, GPU_SETUP
        cells, check = [GPU_SETUP], GPU_CELL
    else:
        cells, check = state_cells("model", args, work / "train.log"), SERVER_CELL
    server: Any = RealServer(work, work / "store", work / "server.log", "--GPUCR.engine=snapshot",
                             "--GPUCR.warm_start_timeout_s=600")
    out: dict[str, Any] = {"rounds": [], "log": str(work / "server.log")}
    try:
        await server.wait_ready(120)
        session = await server.request("api/sessions", "POST", {"path": "model.ipynb", "type": "notebook",
                                                                "name": "model.ipynb", "kernel": {"name": "python3"}})
        kid = session["kernel"]["id"]
        ws = await server.ws(kid)
        for cell in cells:
            await run_cell(ws, cell, timeout=CELL_TIMEOUT)
        _, expected, _ = await run_cell(ws, check, timeout=CELL_TIMEOUT)
        out["cell_output"] = expected.strip()
        for mode in ("cold", "warm", "criu"):
            for i in range(args.server_rounds):
                print(f"  [server] {mode} {i + 1}", flush=True)
                try:
                    t0 = time.perf_counter()
                    st = await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST",
                                              {"engine": "criu" if mode == "criu" else "snapshot"})
                    suspend_s = time.perf_counter() - t0
                except Exception as exc:  # no CRIU here: the other modes' figures stand
                    out["rounds"].append({"mode": mode, "round": i + 1, "failed": error_text(exc)[:500]})
                    break
                if mode == "warm":  # the notebook is opened again, and the user reads it a moment
                    ws.close()
                    ws = await server.ws(kid)
                    await asyncio.sleep(args.warm_wait)
                t0 = time.perf_counter()
                _, answer, _ = await run_cell(ws, check, timeout=CELL_TIMEOUT)
                cell_s = time.perf_counter() - t0
                restored = await _running(server, kid)
                out["rounds"].append({"mode": mode, "round": i + 1, "suspend_s": suspend_s, "resume_and_cell_s": cell_s,
                                      "checkpoint_bytes": st["checkpoint"]["size"], "timings": restored["timings"],
                                      "same": answer == expected})
        ws.close()
    finally:
        server.sigterm()
    return out


async def _running(server: Any, kid: str) -> dict[str, Any]:
    """The kernel's state once it is running (its cell may answer a moment before)."""
    for _ in range(100):
        st = await server.get(f"api/gpucr/kernels/{kid}")
        if st["state"] == "running":
            return st
        await asyncio.sleep(0.05)
    raise RuntimeError(f"kernel {kid} is {st['state']} after its cell answered")


def server_table(server: dict[str, Any]) -> str:
    lines = [f"{'mode':<6} {'round':>5} {'suspend s':>9} {'restore s':>9} {'start s':>8} {'load s':>7} "
             f"{'resume+cell s':>13} {'MiB':>8}  same", "-" * 80]
    steps = []
    for r in server["rounds"]:
        if "failed" in r:
            lines.append(f"{r['mode']:<6} {r['round']:>5}  FAILED: {r['failed']}")
            continue
        t = r["timings"]
        lines.append(f"{r['mode']:<6} {r['round']:>5} {fmt_s(r.get('suspend_s')):>9} {fmt_s(t.get('total')):>9} "
                     f"{fmt_s(t.get('kernel_start')):>8} {fmt_s(t.get('load')):>7} {fmt_s(r['resume_and_cell_s']):>13} "
                     f"{fmt_mb(r['checkpoint_bytes'])}  {r['same']}{'  (warm_start)' if t.get('warm_start') else ''}")
        if "in_kernel_total_s" in t:
            steps.append(f"{r['mode']} {r['round']}: in the kernel {t['in_kernel_total_s']:.2f} s: modules "
                         f"{t['in_kernel_modules_s']:.2f} s, unpickling {t['in_kernel_unpickle_s']:.2f} s"
                         + (f" (of it waiting for tensor bytes {t['in_kernel_storage_wait_s']:.2f} s); "
                            f"{t['in_kernel_storage_bytes'] / 2**20:.0f} MiB of tensors: allocated in "
                            f"{t['in_kernel_storage_setup_s']:.2f} s (creating CUDA contexts where none was), "
                            f"all read {t['in_kernel_storage_in_s']:.2f} s after"
                            if "in_kernel_storage_bytes" in t else ""))
    lines.append("start: the snapshot restore's process start (warm: what it still waited for the warm kernel); "
                 "load: in the kernel, with a fresh kernel's own start and imports")
    return "\n".join(lines + steps)


# ---- driver ---------------------------------------------------------------------------------------


def state_cells(state: str, args: argparse.Namespace, log: Path) -> list[str]:
    cells = {"arrays": ARRAYS, "model": MODEL, "unkeepable": UNKEEPABLE}[state]
    return [c.format(array_mb=args.array_mb, model_mb=args.model_mb, log=str(log)) for c in cells]


async def run_state(state: str, args: argparse.Namespace, root: Path, probe_file: Path) -> dict:
    work = root / state
    work.mkdir()
    env = kernel_env()
    cells = state_cells(state, args, work / "train-plain.log")
    out: dict[str, Any] = {"cells": cells, "methods": {}}
    async with kernel(env, work) as (original, start_s):
        out["kernel_start_s"] = start_s
        out["cell_s"] = await build(original, cells)
        before = await probe(original, probe_file)
        out["variables"] = {n: v["type"] for n, v in before.items()}
        if "snapshot" in args.methods:
            print(f"  [{state}] snapshot", flush=True)
            out["methods"]["snapshot"] = await guarded(snapshot_method(original, work, env, before, probe_file))
        if "dill" in args.methods:
            print(f"  [{state}] dill", flush=True)
            out["methods"]["dill"] = await guarded(dill_method(original, work, env, before, probe_file))
    if "kishu" in args.methods:
        print(f"  [{state}] kishu", flush=True)
        kishu_cells = state_cells(state, args, work / "train-kishu.log")
        out["methods"]["kishu"] = await guarded(kishu_method(kishu_cells, out["cell_s"], work, probe_file))
    return out


async def guarded(coroutine: Any) -> dict:
    """A method that breaks the benchmark itself (not the kernel's error) is reported as failed."""
    try:
        return await coroutine
    except Exception as exc:  # reported, so that the other methods still run
        return {"failed": f"benchmark error: {error_text(exc)}", "bytes": None}


def fmt_s(value: float | None) -> str:
    return "-" if value is None else f"{value:7.2f}"


def fmt_mb(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:8.1f}"


def table(results: dict[str, Any]) -> str:
    lines = [f"{'state':<11} {'method':<10} {'ckpt s':>7} {'restore s':>9} {'MiB':>8}  lost / changed / failed",
             "-" * 100]
    for state, out in results["states"].items():
        for method, r in out["methods"].items():
            if "failed" in r and "restore_s" not in r:
                note = "FAILED: " + r["failed"]
            else:
                parts = []
                if r.get("failed"):
                    parts.append("FAILED: " + r["failed"])
                parts.append("lost: " + (", ".join(r.get("lost", [])) or "nothing"))
                if r.get("changed"):
                    parts.append("changed: " + ", ".join(r["changed"]))
                reran = [a for a in r.get("restore_plan", []) if a.startswith("RerunCell")]
                if reran:
                    parts.append(f"re-ran {len(reran)} cells")
                note = "; ".join(parts)
            ckpt = r.get("checkpoint_s")
            label = f"{fmt_s(ckpt)}*" if method == "kishu" and ckpt is not None else f"{fmt_s(ckpt)} "
            lines.append(f"{state:<11} {method:<10} {label:>8}{fmt_s(r.get('restore_s')):>9} {fmt_mb(r.get('bytes'))}  {note}")
    lines.append("* kishu: no separate checkpoint; the sum over the cells after the imports of (cell time with "
                 "Kishu - without); MiB: the .kishudb, every commit")
    return "\n".join(lines)


def details(results: dict[str, Any]) -> str:
    lines = []
    for state, out in results["states"].items():
        lines.append(f"[{state}] cells without Kishu (s): {' '.join(f'{t:.2f}' for t in out['cell_s'])}")
        k = out["methods"].get("kishu", {})
        if "cell_s" in k:
            lines.append(f"[{state}] cells with Kishu    (s): {' '.join(f'{t:.2f}' for t in k['cell_s'])}")
            lines.append(f"[{state}] Kishu adds (s), from cell 2: {' '.join(f'{t:+.2f}' for t in k['cell_overhead_s'])}")
        if k.get("restore_plan"):
            lines.append(f"[{state}] kishu restore plan: {k['restore_plan']}")
        for method, r in out["methods"].items():
            for name, change in r.get("changed", {}).items():
                lines.append(f"[{state}] {method}: {name} was {change['before'][:90]!r}, is {change['after'][:90]!r}")
            if r.get("reported_lost"):
                lines.append(f"[{state}] {method} reported lost: {r['reported_lost']}")
    return "\n".join(lines)


async def main(args: argparse.Namespace) -> dict[str, Any]:
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="gpucr-bench-snapshot-"))
    root.mkdir(parents=True, exist_ok=True)
    probe_file = root / "probe.py"
    probe_file.write_text(PROBE)
    versions = {}
    for package in ("numpy", "pandas", "torch", "dill", "kishu", "cloudpickle", "ipykernel"):
        try:
            versions[package] = __import__(package).__version__
        except Exception as exc:  # a missing package is recorded, its method fails with the reason
            versions[package] = f"not importable: {type(exc).__name__}: {exc}"
    results: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "machine": platform.node(),
        "platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
        "versions": versions, "command": " ".join([_executable(), *sys.argv]),
        "array_mb": args.array_mb, "model_mb": args.model_mb, "loadavg_start": os.getloadavg()[0], "states": {},
    }
    t0 = time.perf_counter()
    try:
        for state in args.states if args.methods else []:
            print(f"state {state}", flush=True)
            results["states"][state] = await run_state(state, args, root, probe_file)
        if args.server_rounds:
            print("through a server", flush=True)
            results["server"] = await server_rounds(args, root)
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    results["total_s"] = time.perf_counter() - t0
    results["loadavg_end"] = os.getloadavg()[0]  # other work on the machine skews the figures
    return results


def _executable() -> str:
    relative = os.path.relpath(sys.executable)
    return relative if not relative.startswith("..") else sys.executable


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--array-mb", type=float, default=200.0, help="MB of NumPy arrays in the 'arrays' state")
    ap.add_argument("--model-mb", type=float, default=64.0, help="MB of MLP parameters in the model states")
    ap.add_argument("--states", default=",".join(STATES), help=f"comma-separated subset of {','.join(STATES)}")
    ap.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    ap.add_argument("--server-rounds", type=int, default=0,
                    help="rounds of the model state's restore through a real server per mode (cold, warm, criu)")
    ap.add_argument("--w2", action="store_true",
                    help="the server rounds hold W2 (a 2.7 B-parameter model on cuda:0) instead of the model state")
    ap.add_argument("--warm-wait", type=float, default=15.0,
                    help="seconds between opening the notebook and running the cell in the warm rounds")
    ap.add_argument("--json-out", help="also write the results as JSON to this file")
    ap.add_argument("--keep", help="work in this directory and keep the checkpoints (default: a temp dir, removed)")
    args = ap.parse_args(argv)
    args.states = [s for s in args.states.split(",") if s]
    args.methods = [m for m in args.methods.split(",") if m]
    for value, known in ((args.states, STATES), (args.methods, METHODS)):
        if unknown := set(value) - set(known):
            ap.error(f"unknown: {', '.join(sorted(unknown))} (known: {', '.join(known)})")
    return args


if __name__ == "__main__":
    arguments = parse_args()
    results = asyncio.run(main(arguments))
    print()
    if results["states"]:
        print(table(results))
        print()
        print(details(results))
        print()
    if "server" in results:
        print(server_table(results["server"]))
        print()
    print(json.dumps(results, indent=1))
    if arguments.json_out:
        Path(arguments.json_out).write_text(json.dumps(results, indent=1))

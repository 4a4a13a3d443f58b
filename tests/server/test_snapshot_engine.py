"""The snapshot engine end to end: real ipykernels started by jupyter_client, no mocks.

Each test drives kernels through ``jupyter_gpucr.server.kernel_rpc`` exactly as the server
does. Tests marked ``gpu`` need PyTorch with CUDA in this environment and are skipped
without it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import stat
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest
from gpucr_hooks.devicemap import DeviceMap
from gpucr_hooks.idle import IDLE_S
from jupyter_client.manager import AsyncKernelManager

from jupyter_gpucr.server import kernel_rpc as snapshot

pytestmark = pytest.mark.timeout(180)

HOOKS_DIR = Path(__file__).resolve().parents[2] / "kernel_hooks"
KERNEL_ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(HOOKS_DIR), os.environ.get("PYTHONPATH")])),
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",  # JAX, where a test uses it, takes only what it needs
}

# A notebook's cells: data, a model with an optimizer that has taken steps, code defined in
# the notebook, and what cannot be kept: a generator, a dict holding it, a lock.
NOTEBOOK = [
    "import numpy as np, pandas as pd, torch",
    ("rng = np.random.default_rng(0)\n"
     "arr = rng.standard_normal((300, 40))\n"
     "df = pd.DataFrame({'n': np.arange(50), 'x': rng.random(50), 's': [f'row{i}' for i in range(50)]})"),
    ("torch.manual_seed(0)\n"
     "model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))\n"
     "opt = torch.optim.Adam(model.parameters(), lr=0.01)\n"
     "xb, yb = torch.randn(64, 8), torch.randn(64, 1)"),
    ("def train_step():\n"
     "    opt.zero_grad()\n"
     "    loss = torch.nn.functional.mse_loss(model(xb), yb)\n"
     "    loss.backward()\n"
     "    opt.step()\n"
     "    return loss.item()"),
    "losses = [train_step() for _ in range(3)]",
    ("class Accumulator:\n"
     "    def __init__(self):\n"
     "        self.items = []\n"
     "    def add(self, v):\n"
     "        self.items.append(scale * v)\n"
     "        return self\n"
     "scale = 2\n"
     "acc = Accumulator().add(1).add(2)"),
    ("gen = (i * i for i in range(10))\nnext(gen)\nholder = {'gen': gen, 'n': 1}\n"
     "lock = __import__('threading').Lock()"),
    "arr.shape",
]

# Prints a fingerprint of the state; run in both kernels, outside the saved namespace.
FINGERPRINT = """(lambda hashlib, json: print(json.dumps({
    "arr": hashlib.sha256(arr.tobytes()).hexdigest(),
    "df": int(pd.util.hash_pandas_object(df).sum()), "df_dtypes": [str(t) for t in df.dtypes],
    "params": [hashlib.sha256(p.detach().numpy().tobytes()).hexdigest() for p in model.parameters()],
    "opt_state": [[k, hashlib.sha256(v.numpy().tobytes()).hexdigest()]
                  for s in opt.state.values() for k, v in sorted(s.items())],
    "shared": all(a is b for a, b in zip(opt.param_groups[0]["params"], model.parameters())),
    "losses": losses, "acc": acc.items, "acc_type": type(acc) is Accumulator,
})))(__import__("hashlib"), __import__("json"))"""

STEP = """(lambda hashlib, json: print(json.dumps({"loss": train_step(),
    "params": [hashlib.sha256(p.detach().numpy().tobytes()).hexdigest() for p in model.parameters()]})))(
    __import__("hashlib"), __import__("json"))"""


def run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)


@contextlib.asynccontextmanager
async def kernel() -> AsyncIterator[Any]:
    """A fresh ipykernel that can import gpucr_hooks; shut down on exit."""
    manager = AsyncKernelManager(kernel_name="python3")
    await manager.start_kernel(env=KERNEL_ENV)
    client = manager.client()
    client.start_channels()
    try:
        await client.wait_for_ready(timeout=60)
        yield client
    finally:
        client.stop_channels()
        await manager.shutdown_kernel(now=True)


async def execute(client: Any, code: str) -> tuple[str, int]:
    """Run a cell as the notebook would (with history); return its stdout and execution count."""
    out: list[str] = []

    def collect(msg: dict[str, Any]) -> None:
        if msg["msg_type"] == "stream":
            out.append(msg["content"]["text"])

    reply = await client.execute_interactive(code, store_history=True, output_hook=collect, timeout=60)
    content = reply["content"]
    assert content["status"] == "ok", "\n".join(content.get("traceback", []))
    return "".join(out), content["execution_count"]


async def execute_json(client: Any, code: str) -> Any:
    return json.loads((await execute(client, code))[0])


def test_round_trip_into_a_fresh_kernel(tmp_path: Path) -> None:
    target = tmp_path / "snap"

    async def scenario() -> None:
        async with kernel() as original:
            for cell in NOTEBOOK:
                _, count = await execute(original, cell)
            saved = await snapshot.save(original, target)
            before = await execute_json(original, FINGERPRINT)
            expected_step = await execute_json(original, STEP)  # the step the fresh kernel must repeat

        assert saved["path"] == str(target) and saved["bytes"] > 300 * 40 * 8  # arr alone
        assert {"np", "pd", "torch", "arr", "df", "model", "opt", "train_step", "Accumulator", "acc",
                "scale", "losses", "rng", "xb", "yb"} <= set(saved["kept"])
        lost = {item["name"]: item for item in saved["lost"]}
        assert set(lost) == {"gen", "holder", "lock"}
        assert lost["gen"]["type"] == "generator" and "generator" in lost["gen"]["reason"]
        assert lost["holder"] == {"name": "holder", "type": "dict",
                                  "reason": "refers to 'gen' (generator), which cannot be kept"}
        assert "lock" in lost["lock"]["reason"]
        assert stat.S_IMODE(target.stat().st_mode) == 0o700
        for f in target.rglob("*"):
            assert stat.S_IMODE(f.stat().st_mode) == (0o700 if f.is_dir() else 0o600), f
        manifest = json.loads((target / "manifest.json").read_text())
        assert manifest["kept"] == saved["kept"] and set(manifest["devices"]) == {"cpu"}
        assert not [p for p in tmp_path.iterdir() if p.name != "snap"], "staging directory left behind"

        async with kernel() as fresh:
            loaded = await snapshot.load(fresh, target)
            assert set(loaded["restored"]) == set(saved["kept"])
            assert loaded["lost"] == saved["lost"]
            assert loaded["warnings"] == []
            assert await execute_json(fresh, FINGERPRINT) == before
            assert await execute_json(fresh, STEP) == expected_step  # bit-identical parameters
            # In, Out and the execution count continue where the original kernel stopped
            text, number = await execute(fresh, 'print(__import__("json").dumps([In[1], '
                                         f'In[{count}], list(Out[{count}]), "gen" in globals()]))')
            assert number == count + 3  # after FINGERPRINT and STEP
            assert json.loads(text) == [NOTEBOOK[0], NOTEBOOK[-1], [300, 40], False]
            # functions and classes defined in the notebook see its live namespace, as before
            text, _ = await execute(fresh, "scale = 5\nprint(acc.add(1).items)")
            assert text == "[2, 4, 5]\n"

    run(scenario())


def test_what_cannot_be_loaded_is_reported_and_the_rest_loads(tmp_path: Path) -> None:
    """A module that is gone in the fresh kernel: its name and an object of its class are lost."""
    (tmp_path / "gone_tomorrow.py").write_text("class Thing:\n    pass\n")
    target = tmp_path / "snap"

    async def scenario() -> None:
        async with kernel() as original:
            await execute(original, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\n"
                                    "import gone_tomorrow\nthing = gone_tomorrow.Thing()\nx = [1, 2]")
            saved = await snapshot.save(original, target)
        assert saved["lost"] == [] and {"gone_tomorrow", "thing", "x", "sys"} <= set(saved["kept"])
        (tmp_path / "gone_tomorrow.py").unlink()
        async with kernel() as fresh:
            loaded = await snapshot.load(fresh, target)
            lost = {item["name"]: item["reason"] for item in loaded["lost"]}
            assert set(lost) == {"gone_tomorrow", "thing"}
            assert "No module named 'gone_tomorrow'" in lost["gone_tomorrow"]
            assert lost["thing"].startswith("could not be loaded: ModuleNotFoundError")
            assert set(loaded["restored"]) == {"sys", "x"}
            text, _ = await execute(fresh, "print(x, 'thing' in globals())")
            assert text == "[1, 2] False\n"

    run(scenario())


def test_a_fresh_kernel_imports_what_the_load_needs_ahead_and_binds_nothing(tmp_path: Path) -> None:
    """``prepare_load`` (a kernel started ahead of its restore): the packages, the modules bound to
    names and the modules of the saved values' types are imported, no name is bound and no cell
    counted; a module that is gone is reported, and the load after it works as in any fresh kernel."""
    (tmp_path / "gone_tomorrow.py").write_text("class Thing:\n    pass\n")
    target = tmp_path / "snap"

    async def scenario() -> None:
        async with kernel() as original:
            await execute(original, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport gone_tomorrow\n"
                                    "import numpy as np, torch\nmodel = torch.nn.Sequential(torch.nn.Linear(2, 1))\n"
                                    "del torch")
            saved = await snapshot.save(original, target)
        (tmp_path / "gone_tomorrow.py").unlink()
        async with kernel() as fresh:
            text, count = await execute(fresh, "print(sorted(m for m in ('numpy', 'torch') if m in __import__('sys').modules))")
            assert text == "[]\n"
            report = await snapshot.prepare_load(fresh, target, gpu=True)  # its tensors are on the CPU: no GPU readied
            assert {"numpy", "torch", "sys", "torch.nn.modules.container"} <= set(report["imported"]), report
            assert report["gpus"] == []
            assert [f["name"] for f in report["failed"]] == ["gone_tomorrow"]
            assert "No module named 'gone_tomorrow'" in report["failed"][0]["reason"]
            text, after = await execute(fresh, "print(sorted(m for m in ('numpy', 'torch') if m in __import__('sys').modules),"
                                               " [n for n in ('np', 'model', 'sys', 'torch') if n in globals()])")
            assert text == "['numpy', 'torch'] []\n" and after == count + 1
            loaded = await snapshot.load(fresh, target)
            assert set(loaded["restored"]) == set(saved["kept"]) - {"gone_tomorrow"}
            text, _ = await execute(fresh, "print(tuple(model(__import__('torch').zeros(1, 2)).shape))")
            assert "(1, 1)" in text.splitlines()  # and IPython's note that this test's own cells took the numbers

    run(scenario())


# Tensors whose storages span several of the reads ahead (16 MiB each; the last one partial), one
# storage shared by two tensors, a parameter with a gradient, and many small ones.
TENSORS = ("import torch\ntorch.manual_seed(0)\n"
           "big = torch.randn((10 << 20) + 3)\n"
           "half = big[1::2]\n"
           "ints = torch.randint(-9, 9, (3, 5 << 20), dtype=torch.int16)\n"
           "layer = torch.nn.Linear(64, 32)\n"
           "layer(torch.ones(2, 64)).sum().backward()\n"
           "small = [torch.full((k,), float(k)) for k in range(40)]")
TENSOR_FINGERPRINT = """(lambda hashlib, json: print(json.dumps({
    n: hashlib.sha256(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest()
    for n, t in [("big", big), ("half", half), ("ints", ints), ("weight", layer.weight), ("grad", layer.weight.grad),
                 *((f"small{k}", t) for k, t in enumerate(small))]} | {
    "shared": half.untyped_storage().data_ptr() == big.untyped_storage().data_ptr()})))(
    __import__("hashlib"), __import__("json"))"""


def test_tensors_read_ahead_come_back_bit_for_bit_as_one_at_a_time(tmp_path: Path) -> None:
    """The storages are read ahead of the unpickler (several threads, large reads) and equal the
    saved ones bit for bit, as a snapshot written before its table said what each array is loads
    them one at a time, when the unpickler meets them."""
    target, older = tmp_path / "snap", tmp_path / "older"

    async def scenario() -> None:
        async with kernel() as original:
            await execute(original, TENSORS)
            saved = await snapshot.save(original, target)
            before = await execute_json(original, TENSOR_FINGERPRINT)
        assert saved["lost"] == [] and before["shared"] is True
        manifest = json.loads((target / "manifest.json").read_text())
        storages = [b for b in manifest["blobs"] if b is not None and b[2:] == ["torch", "cpu"]]
        assert len(storages) == 46 and sum(b[1] for b in storages) > 70 << 20  # with the layer's and its gradients
        shutil.copytree(target, older)
        manifest["blobs"] = [b if b is None else b[:2] for b in manifest["blobs"]]
        (older / "manifest.json").write_text(json.dumps(manifest))

        async with kernel() as fresh:
            loaded = await snapshot.load(fresh, target)
            assert loaded["lost"] == [] and loaded["warnings"] == []
            assert loaded["timings"]["storage_bytes"] == sum(b[1] for b in storages)  # all of them read ahead
            assert 0 <= loaded["timings"]["storage_in_s"] <= loaded["timings"]["total_s"]
            assert await execute_json(fresh, TENSOR_FINGERPRINT) == before
        async with kernel() as fresh:
            loaded = await snapshot.load(fresh, older)
            assert loaded["lost"] == [] and "storage_bytes" not in loaded["timings"]
            assert await execute_json(fresh, TENSOR_FINGERPRINT) == before

    run(scenario())


def test_prepare_suspend_collects_garbage_and_reports_memory() -> None:
    async def scenario() -> None:
        async with kernel() as client:
            # 256 MiB kept alive only by a reference cycle (automatic collection off, so that
            # it is still there): freed by prepare_suspend's gc.collect()
            await execute(client, "import gc, numpy as np\n"
                                  "gc.disable()\n"
                                  "class Node: pass\n"
                                  "a, b = Node(), Node()\n"
                                  "a.other, b.other, a.data = b, a, np.ones(32 << 20)\n"
                                  "del a, b")
            report = await snapshot.prepare_suspend(client)
            assert report["gc_collected"] >= 2
            assert report["rss_before"] - report["rss_after"] > 200 << 20
            # no GPU library initialised here: nothing reserved, nothing trimmed, no warnings
            assert report["per_device"] == [] and report["libraries"] == [] and report["warnings"] == []
            assert report["live_bytes"] == report["reserved_before"] == report["reserved_after"] == 0
            await execute(client, "gc.enable()")  # the kernel still works

    run(scenario())


def test_garbage_is_collected_while_the_kernel_is_idle_so_a_suspend_need_not() -> None:
    """With gpucr_hooks loaded as an IPython extension (the gpucr provisioner does that), a full
    collection runs once the kernel has been idle a while; a suspend right after a cell still
    collects what that cell left."""
    cycle = ("class Node: pass\n"
             "a, b = Node(), Node()\n"
             "a.other, b.other, a.data = b, a, np.ones(32 << 20)\n"
             "del a, b")

    async def rss(client: Any) -> int:
        text, _ = await execute(client, "print(int(open('/proc/self/statm').read().split()[1]) * 4096)")
        return int(text)

    async def scenario() -> None:
        async with kernel() as client:
            await execute(client, "%load_ext gpucr_hooks")
            await execute(client, "import gc, numpy as np\ngc.disable()\n" + cycle)
            before = await rss(client)  # the garbage's 256 MiB are still held
            await asyncio.sleep(IDLE_S + 1.5)
            assert before - await rss(client) > 200 << 20, "the idle kernel did not collect"
            await asyncio.sleep(IDLE_S + 1.5)  # the rss cell above was a cell: let the kernel be idle again
            report = await snapshot.prepare_suspend(client)
            assert report["gc_collected"] is None and report["gc_s"] < 0.05  # nothing could have formed since
            await execute(client, cycle)
            report = await snapshot.prepare_suspend(client)  # right after a cell: it collects
            assert report["gc_collected"] >= 2 and report["rss_before"] - report["rss_after"] > 200 << 20

    run(scenario())


def test_save_to_an_invalid_path_fails_clearly_and_the_kernel_keeps_running(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    occupied = tmp_path / "occupied"
    occupied.mkdir()
    (occupied / "keep.txt").write_text("mine")

    async def scenario() -> None:
        async with kernel() as client:
            await execute(client, "x = 41")
            with pytest.raises(snapshot.SnapshotError) as failure:
                await snapshot.save(client, blocker / "snap")
            assert "snapshot_save failed in the kernel: FileExistsError" in str(failure.value)
            assert str(blocker) in str(failure.value)
            assert "Traceback" in failure.value.kernel_traceback or "File " in failure.value.kernel_traceback
            with pytest.raises(snapshot.SnapshotError, match="already exists and is not an empty directory"):
                await snapshot.save(client, occupied)
            text, _ = await execute(client, "print(x + 1)")
            assert text == "42\n"

    run(scenario())
    assert blocker.read_text() == "not a directory"
    assert [p.name for p in occupied.iterdir()] == ["keep.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "occupied"]  # no staging left


def test_device_map() -> None:
    to_one = DeviceMap("cuda:1")
    assert [to_one.resolve("cuda:0", 2), to_one.resolve("cuda:3", 2), to_one.resolve("cpu", 2)] == [
        "cuda:1", "cuda:1", "cpu"]
    assert to_one.warnings == []
    mapped = DeviceMap({"cuda:0": "cuda:1", "cuda:1": "cuda:0"})
    assert [mapped.resolve("cuda:0", 2), mapped.resolve("cuda:1", 2)] == ["cuda:1", "cuda:0"]
    same = DeviceMap(None)
    assert [same.resolve("cuda:1", 2), same.resolve("cuda:1", 1), same.resolve("cuda:0", 0)] == [
        "cuda:1", "cuda:0", "cpu"]
    assert same.warnings == [
        "cuda:1 does not exist (1 GPU(s)): arrays saved on cuda:1 were loaded on cuda:0",
        "CUDA is not available: arrays saved on cuda:0 were loaded on the CPU",
    ]


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


GPU_NOTEBOOK = [
    "import torch",
    ("torch.manual_seed(0)\n"
     "model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 8))\n"
     "model = model.to('cuda:0')\n"
     "opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)\n"
     "xb, yb = torch.randn(128, 256, device='cuda:0'), torch.randn(128, 8, device='cuda:0')"),
    ("def train_step():\n"
     "    opt.zero_grad()\n"
     "    torch.nn.functional.mse_loss(model(xb), yb).backward()\n"
     "    opt.step()"),
    "for _ in range(3): train_step()",
]
GPU_STEP = """(lambda hashlib, json: (train_step(), print(json.dumps({
    "devices": sorted({str(p.device) for p in model.parameters()} | {str(v.device) for s in opt.state.values()
                       for v in s.values()}),
    "params": [hashlib.sha256(p.detach().cpu().numpy().tobytes()).hexdigest() for p in model.parameters()],
}))))(__import__("hashlib"), __import__("json"))"""


@pytest.mark.gpu
@pytest.mark.gpu2
def test_model_saved_on_cuda0_restores_onto_cuda1(tmp_path: Path) -> None:
    if _cuda_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    target = tmp_path / "snap"

    async def scenario() -> None:
        async with kernel() as original:
            for cell in GPU_NOTEBOOK:
                await execute(original, cell)
            saved = await snapshot.save(original, target)
            expected = await execute_json(original, GPU_STEP)
        assert expected["devices"] == ["cuda:0"] and saved["lost"] == []
        assert set(json.loads((target / "manifest.json").read_text())["devices"]) == {"cuda:0"}
        async with kernel() as fresh:
            loaded = await snapshot.load(fresh, target, device="cuda:1")
            assert loaded["warnings"] == [] and loaded["lost"] == []
            moved = await execute_json(fresh, GPU_STEP)
            assert moved["devices"] == ["cuda:1"]
            assert moved["params"] == expected["params"]  # same step, bit for bit, on the other GPU

    run(scenario())


@pytest.mark.gpu
def test_prepare_suspend_releases_cached_gpu_memory() -> None:
    if _cuda_count() < 1:
        pytest.skip("needs a CUDA GPU")

    async def scenario() -> None:
        async with kernel() as client:
            await execute(client, "import torch\n"
                                  "keep = torch.ones(64 << 20, device='cuda:0')\n"  # 256 MiB live
                                  "tmp = torch.empty(1 << 30, dtype=torch.uint8, device='cuda:0')\n"
                                  "del tmp")  # 1 GiB freed but cached by the allocator
            report = await snapshot.prepare_suspend(client)
            assert report["libraries"] == ["torch"]
            row = report["per_device"][0]
            assert row["device"] == "cuda:0" and row["library"] == "torch"
            assert row["reserved_before"] - row["reserved_after"] >= 1 << 30
            assert row["allocated_before"] == row["allocated_after"] == report["live_bytes"] == 256 << 20
            assert report["reserved_after"] >= report["live_bytes"]

    run(scenario())


@pytest.mark.gpu
def test_cupy_and_jax_arrays_round_trip(tmp_path: Path) -> None:
    if _cuda_count() < 1:
        pytest.skip("needs a CUDA GPU")
    pytest.importorskip("cupy")
    pytest.importorskip("jax")
    target = tmp_path / "snap"
    code = ("import cupy, jax, jax.numpy as jnp, numpy as np\n"
            "c = cupy.arange(1 << 20, dtype=cupy.float32).reshape(1024, 1024) * 0.5\n"
            "j = jnp.arange(1000, dtype=jnp.float32) * 2\n")
    check = ('print(__import__("json").dumps([type(c).__module__.split(".")[0], c.device.id, float(c.sum()),'
             ' type(j).__module__.split(".")[0], float(j.sum())]))')

    async def scenario() -> None:
        async with kernel() as original:
            await execute(original, code)
            saved = await snapshot.save(original, target)
            expected = await execute_json(original, check)
        assert {"c", "j"} <= set(saved["kept"]) and saved["lost"] == []
        async with kernel() as fresh:
            loaded = await snapshot.load(fresh, target)
            assert loaded["warnings"] == []
            assert await execute_json(fresh, check) == expected

    run(scenario())

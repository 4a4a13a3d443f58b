"""The gpucr provisioner behaves like jupyter_client's own where users can tell: a kernel that
cannot start fails at once and says why, interrupts reach the kernel's child processes, and a
shutdown ends the kernel's whole process tree quickly. Real jupyter_client, real kernels."""
from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from jupyter_client import AsyncKernelClient, AsyncKernelManager
from jupyter_client.kernelspec import KernelSpecManager

from jupyter_gpucr.core.errors import EngineError
from jupyter_gpucr.server.provisioner import GPUCRProvisioner

pytestmark = pytest.mark.timeout(120)

# A kernel that fails at start must be reported within this (jupyter_client's own fails at once).
FAIL_FAST_S = 5.0
# Shutdown of a kernel whose children do not exit on their own; the graceful part alone may take
# jupyter_client's shutdown_wait_time (5 s by default).
SHUTDOWN_S = 8.0


def needs_root() -> None:
    """Kernels run in their own PID namespace (unshare), which needs root here."""
    if os.geteuid() != 0:
        if os.environ.get("CI"):
            pytest.fail("the gpucr provisioner needs root (PID namespaces)")
        pytest.skip("the gpucr provisioner needs root (PID namespaces)")


@pytest.fixture
def kernel_specs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KernelSpecManager:
    """A python kernelspec that names the gpucr provisioner, and a private store."""
    needs_root()
    monkeypatch.setenv("GPUCR_STORE", str(tmp_path / "store"))
    spec_dir = tmp_path / "kernels" / "gpucr-python"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (gpucr)", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "gpucr-provisioner"}},
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])


def manager(kernel_specs: KernelSpecManager, argv: list[str] | None = None) -> AsyncKernelManager:
    km = AsyncKernelManager(kernel_name="gpucr-python", kernel_spec_manager=kernel_specs)
    if argv is not None:
        km.kernel_spec.argv = argv
    return km


@asynccontextmanager
async def running_kernel(kernel_specs: KernelSpecManager) -> AsyncIterator[tuple[AsyncKernelManager, AsyncKernelClient]]:
    km = manager(kernel_specs)
    await km.start_kernel()
    assert isinstance(km.provisioner, GPUCRProvisioner)
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        yield km, kc
    finally:
        kc.stop_channels()
        if km.has_kernel:
            await km.shutdown_kernel(now=True)


async def evaluate(kc: AsyncKernelClient, code: str, expression: str) -> Any:
    """Run ``code`` and return ``expression`` evaluated afterwards (through user_expressions)."""
    msg_id = kc.execute(code, user_expressions={"value": expression})
    while True:
        reply = await kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    content = reply["content"]
    assert content["status"] == "ok", content
    value = content["user_expressions"]["value"]
    assert value["status"] == "ok", value
    return eval(value["data"]["text/plain"])  # a repr of ints, lists or None


def process_tree(root: int) -> list[psutil.Process]:
    proc = psutil.Process(root)
    return [proc, *proc.children(recursive=True)]


def survivors(procs: list[psutil.Process]) -> list[str]:
    """Those of ``procs`` still in /proc (is_running() compares the start time: no PID reuse)."""
    left = []
    for p in procs:
        if Path(f"/proc/{p.pid}").exists() and p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
            left.append(f"{p.pid} {' '.join(p.cmdline())}")
    return left


@pytest.mark.parametrize("case", ["missing command", "missing working directory"])
async def test_kernel_that_dies_at_start_fails_fast_and_says_why(kernel_specs, tmp_path, case):
    if case == "missing command":
        km = manager(kernel_specs, [str(tmp_path / "no-such-python"), "-m", "ipykernel_launcher", "-f", "{connection_file}"])
        kwargs: dict[str, Any] = {}
        expected = ["no-such-python", "could not be started", "No such file or directory"]
    else:
        km = manager(kernel_specs)
        kwargs = {"cwd": str(tmp_path / "gone")}
        expected = ["ipykernel_launcher", "could not be started", f"working directory '{tmp_path / 'gone'}'"]
    t0 = time.monotonic()
    with pytest.raises(EngineError) as failed:
        await km.start_kernel(**kwargs)
    elapsed = time.monotonic() - t0
    assert elapsed < FAIL_FAST_S, f"the failure took {elapsed:.1f} s to notice"
    for part in expected:
        assert part in failed.value.message, failed.value.message
    assert failed.value.hint


async def test_interrupt_reaches_the_kernels_child_processes(kernel_specs):
    async with running_kernel(kernel_specs) as (km, kc):
        await _interrupt_reaches_child(km, kc)


async def _interrupt_reaches_child(km: AsyncKernelManager, kc: AsyncKernelClient) -> None:
    start = ("import signal, subprocess, sys\n"
             "child = subprocess.Popen([sys.executable, '-c', "
             "'import signal, time; signal.signal(signal.SIGINT, signal.SIG_DFL); print(flush=True); time.sleep(60)'],"
             " stdout=subprocess.PIPE)\n"
             "child.stdout.readline()")  # the child's SIGINT handler is in place once it printed
    assert await evaluate(kc, start, "child.poll()") is None
    await km.interrupt_kernel()
    deadline = time.monotonic() + 10
    code = None
    while code is None and time.monotonic() < deadline:
        code = await evaluate(kc, "", "child.poll()")
    assert code == -2, "the kernel's child process did not get the interrupt (SIGINT)"
    assert await km.is_alive()


@pytest.mark.parametrize("now", [False, True], ids=["graceful", "now"])
async def test_shutdown_ends_the_kernels_whole_tree_quickly(kernel_specs, now):
    async with running_kernel(kernel_specs) as (km, kc):
        await _shutdown_ends_tree(km, kc, now)


async def _shutdown_ends_tree(km: AsyncKernelManager, kc: AsyncKernelClient, now: bool) -> None:
    code = ("import multiprocessing, subprocess\n"
            "pool = multiprocessing.Pool(2)\n"
            "squares = pool.map(abs, range(8))\n"
            # a grandchild in a session of its own: no process-group signal reaches it
            "orphan = subprocess.Popen(['setsid', 'sleep', '600'])")
    await evaluate(kc, code, "len(squares)")
    procs = process_tree(km.provisioner.pid)
    assert len(procs) >= 6, [p.cmdline() for p in procs]  # unshare, init, kernel, 2 workers, setsid/sleep
    kc.stop_channels()
    t0 = time.monotonic()
    await km.shutdown_kernel(now=now)
    elapsed = time.monotonic() - t0
    assert elapsed < SHUTDOWN_S, f"shutdown took {elapsed:.1f} s"
    assert not km.has_kernel
    assert survivors(procs) == []


async def test_ipython_kernels_get_the_hooks_as_an_extension(kernel_specs):
    """The gpucr provisioner loads gpucr_hooks into IPython kernels, whose garbage is then
    collected between cells rather than during a suspend."""
    async with running_kernel(kernel_specs) as (_km, kc):
        loaded = await evaluate(kc, "", "sorted(get_ipython().extension_manager.loaded)")
        assert "gpucr_hooks" in loaded
        assert await evaluate(kc, "import sys", "'gpucr_hooks' in sys.modules and 'gpucr_hooks' not in globals()")

"""``gpucr checkpoint`` of a kernel that a jupyter_client program runs through the gpucr provisioner
(issue 47, item 3): the program's run goes on untouched, and the kernel never outlives its owner.

Real parts: ``jupyter nbconvert --execute`` with a kernelspec that names ``gpucr-provisioner``, a cell
that runs while the real ``gpucr`` CLI checkpoints its kernel, then ``gpucr restore`` once
nbconvert has ended."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import psutil
import pytest

from jupyter_gpucr.core.storage.store import Store
from tests.conftest import criu_or_skip

pytestmark = pytest.mark.timeout(120)

# How long the cell waits for the test to let it finish (it normally waits for one checkpoint).
CELL_WAIT_S = 60


def cli(*args: str, store: Path, criu: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(store), "--criu", criu, *args],
                          capture_output=True, text=True, timeout=60)


def kernel_processes(kernel_id: str) -> list[str]:
    """Processes of the kernel still alive: its connection file, which holds its id, is on its command line."""
    left = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(p.info["cmdline"] or [])
        if kernel_id in cmdline and p.info["status"] != psutil.STATUS_ZOMBIE:
            left.append(f"{p.info['pid']} {cmdline}")
    return left


def test_cli_checkpoint_during_a_cell_leaves_the_run_and_restore_refuses_an_ownerless_kernel(tmp_path, monkeypatch):
    criu = criu_or_skip()
    store = tmp_path / "store"
    monkeypatch.setenv("GPUCR_STORE", str(store))
    # the kernelspec, found by nbconvert as any user's would be (JUPYTER_PATH)
    spec_dir = tmp_path / "jupyter" / "kernels" / "gpucr-python"
    spec_dir.mkdir(parents=True)
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python (gpucr)", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "gpucr-provisioner"}},
    }))
    monkeypatch.setenv("JUPYTER_PATH", str(tmp_path / "jupyter"))
    started, go = tmp_path / "cell-started", tmp_path / "go"
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = sum(range(1000))"),
        nbformat.v4.new_code_cell(
            "import time\nfrom pathlib import Path\n"
            f"Path({str(started)!r}).write_text('1')\n"
            f"deadline = time.monotonic() + {CELL_WAIT_S}\n"
            f"while not Path({str(go)!r}).exists() and time.monotonic() < deadline:\n"
            "    time.sleep(0.05)\n"
            f"print('cell done', x, Path({str(go)!r}).exists())"),
        nbformat.v4.new_code_cell("print('after', x + 1)"),
    ]
    path = tmp_path / "long.ipynb"
    nbformat.write(nb, path)

    nbconvert = subprocess.Popen(
        [sys.executable, "-m", "nbconvert", "--to", "notebook", "--execute", str(path), "--output", "out.ipynb",
         "--ExecutePreprocessor.kernel_name=gpucr-python", "--ExecutePreprocessor.timeout=120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    kernel_id = ""
    try:
        deadline = time.monotonic() + 60
        while not started.exists():
            assert nbconvert.poll() is None, nbconvert.communicate()[0]
            assert time.monotonic() < deadline, "the long cell never started"
            time.sleep(0.05)
        [kernel_id] = Store(store).proc_names()

        checkpoint = cli("checkpoint", kernel_id, store=store, criu=criu)
        assert checkpoint.returncode == 0, checkpoint.stderr
        assert "left running" in checkpoint.stdout and "nbconvert" in checkpoint.stdout, checkpoint.stdout
        assert nbconvert.poll() is None, "nbconvert ended during the checkpoint: " + nbconvert.communicate()[0]
        go.write_text("1")
        out, _ = nbconvert.communicate(timeout=60)
    finally:
        go.write_text("1")
        if nbconvert.poll() is None:
            nbconvert.kill()
            nbconvert.wait()
    assert nbconvert.returncode == 0, out
    assert "DeadKernelError" not in out
    executed = nbformat.read(tmp_path / "out.ipynb", as_version=4)
    texts = ["".join(o.get("text", "") for o in cell.outputs) for cell in executed.cells]
    assert texts == ["", "cell done 499500 True\n", "after 499501\n"]

    # nbconvert shut its kernel down: nothing of it runs, and its checkpoint is not brought back to run unowned
    assert kernel_processes(kernel_id) == []
    assert Store(store).latest(kernel_id) is not None
    restore = cli("restore", kernel_id, store=store, criu=criu)
    assert restore.returncode == 1
    assert "no client" in restore.stderr and "has ended" in restore.stderr, restore.stderr
    assert kernel_processes(kernel_id) == []
    listed = cli("ls", store=store, criu=criu)
    assert "owner: ended" in listed.stdout, listed.stdout

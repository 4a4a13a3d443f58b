"""Outputs are untouched: a notebook executed by nbclient (what agent frameworks and
CI pipelines read) gives exactly the same outputs, and the same saved .ipynb, whether or not its
kernel went through a real CRIU suspend and restore between two cells."""
from __future__ import annotations

import copy

import nbformat
import pytest
from jupyter_client.manager import AsyncKernelManager
from nbclient import NotebookClient

from jupyter_gpucr.core.process.procs import is_alive
from tests.conftest import criu_or_skip

pytestmark = pytest.mark.timeout(180)

CELLS = [
    "import numpy as np\nx = 42\na = np.arange(1_000_000)",
    "print(x, int(a.sum()))",
    "import sys\nprint('to stderr', file=sys.stderr)\nx += 1\nx",
    "from IPython.display import HTML\nHTML('<b>%d</b>' % x)",
    "raise ValueError('expected')",
]
SUSPEND_BEFORE = 1  # between the first and the second cell


def notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    return nb


async def run(nb: nbformat.NotebookNode, suspend: bool) -> nbformat.NotebookNode:
    km = AsyncKernelManager(kernel_name="python3")
    km.kernel_spec.metadata["kernel_provisioner"] = {"provisioner_name": "gpucr-provisioner"}
    client = NotebookClient(nb, km=km, allow_errors=True, timeout=60)
    try:
        async with client.async_setup_kernel():
            for index, cell in enumerate(nb.cells):
                if suspend and index == SUSPEND_BEFORE:
                    checkpointer = km.provisioner.checkpointer
                    checkpointer.checkpoint(km.kernel_id, reason="test")
                    running = checkpointer.restore(km.kernel_id, detach=False)
                    km.provisioner.adopt(running.started)
                await client.async_execute_cell(cell, index)
    finally:  # nbclient leaves a kernel manager it was given running
        pid = km.provisioner.kernel_pid if km.provisioner else None
        await km.shutdown_kernel(now=True)
        assert not is_alive(pid), "the kernel must be gone after its shutdown"
    return nb


def strip_volatile(nb: nbformat.NotebookNode) -> str:
    """The saved file minus what differs between any two runs (execution metadata timing)."""
    for cell in nb.cells:
        cell.metadata.pop("execution", None)
    return nbformat.writes(nb)


async def test_a_suspend_between_cells_changes_no_output(tmp_path, monkeypatch):
    criu_or_skip()
    monkeypatch.setenv("GPUCR_STORE", str(tmp_path / "store"))
    nb = notebook()
    plain = await run(copy.deepcopy(nb), suspend=False)
    suspended = await run(copy.deepcopy(nb), suspend=True)
    assert [c.outputs for c in suspended.cells] == [c.outputs for c in plain.cells]
    assert strip_volatile(suspended) == strip_volatile(plain)
    assert plain.cells[1].outputs[0]["text"] == "42 499999500000\n"
    assert [c.execution_count for c in suspended.cells] == [1, 2, 3, 4, 5]

"""The doctor's report on a healthy CPU machine whose store has little disk (a 300 MiB tmpfs): as
``gpucr doctor`` prints it and as the server's ``GET /api/gpucr/doctor`` (JupyterLab's "What works on
this server") gives it. Without a GPU the driver line is information, a VM's free page reporting a
tuning note, 300 MiB free is said in MiB: none of them a failure, so the report is ok."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyter_gpucr.core.gpu import gpus
from jupyter_gpucr.core.hostmemory import free_page_reporting
from tests.conftest import criu_or_skip
from tests.server.test_server import fetch_json

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[Path]:
    """A store on a 300 MiB tmpfs of its own."""
    criu_or_skip()
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300M", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount / "store"
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def jp_server_config(small_store: Path) -> dict:
    return {"ServerApp": {"jpserver_extensions": {"jupyter_gpucr": True}}, "GPUCR": {"store": str(small_store)}}


def assert_healthy_cpu_report(rep: dict, store: Path) -> None:
    checks = {c["name"]: c for c in rep["checks"]}
    assert {c["severity"] for c in rep["checks"]} <= {"ok", "note"}, [c for c in rep["checks"] if c["severity"] == "fail"]
    assert rep["ok"] is True and rep["failing"] == 0, rep
    disk = checks["store disk"]
    assert re.fullmatch(rf"(29\d|300) MiB free in {re.escape(str(store))}", disk["detail"]), disk
    assert disk["severity"] == "note" and "GPUCR_STORE" in disk["fix"], disk
    if gpus.driver_version() is None:
        driver = checks["nvidia driver"]
        assert driver["severity"] == "note" and driver["fix"] == "", driver
        assert "CPU processes are checkpointed as usual" in driver["detail"], driver
    if free_page_reporting():
        assert checks["freed memory"]["severity"] == "note", checks["freed memory"]


def test_gpucr_doctor_on_a_healthy_cpu_machine_fails_nothing(small_store):
    out = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(small_store), "--json", "doctor"],
                         capture_output=True, text=True, timeout=60, env={**os.environ, "JUPYTER_RUNTIME_DIR": str(small_store.parent)})
    assert out.returncode == 0, out.stdout + out.stderr
    assert_healthy_cpu_report(json.loads(out.stdout), small_store)

    text = subprocess.run([sys.executable, "-m", "jupyter_gpucr.cli.main", "--store", str(small_store), "doctor"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "JUPYTER_RUNTIME_DIR": str(small_store.parent)}).stdout
    assert not [line for line in text.splitlines() if line.startswith("NO ")], text
    assert "fix:" not in text, text  # notes carry advice ("note:"), never a fix
    disk = next(line for line in text.splitlines() if line.startswith("--  store disk"))
    assert " MiB free in " in disk, text


async def test_the_servers_report_fails_nothing_on_a_healthy_cpu_machine(jp_fetch, small_store):
    rep = await fetch_json(jp_fetch, "api", "gpucr", "doctor")
    assert_healthy_cpu_report(rep, small_store)

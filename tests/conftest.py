"""Shared fixtures: a real CRIU, a private store per test, and helpers to talk to test agents."""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import psutil
import pytest

from jupyter_gpucr.core.criu.commands import find_criu

AGENTS = Path(__file__).parent / "agents"

pytest_plugins = ["pytest_jupyter.jupyter_server"]


def gone(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet counts); race-free against its reaping."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def criu_or_skip() -> str:
    """CRIU must exist in CI (the setup installs it); elsewhere tests skip with the reason."""
    path = find_criu()
    if path and os.geteuid() == 0:
        return path
    reason = "CRIU 4.2+ and root are needed (run scripts/setup.sh as root)"
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def _fresh_provisioner_factory():
    """The provisioner factory is a process-wide singleton: a server test's default (the gpucr
    provisioner) must not leak into tests that start plain jupyter_client kernels."""
    yield
    from jupyter_client.provisioning import KernelProvisionerFactory

    KernelProvisionerFactory.clear_instance()


@pytest.fixture
def criu_path() -> str:
    return criu_or_skip()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


def wait_for_line(path: Path, timeout: float = 60) -> dict:
    """First JSON line a test agent prints on stdout (its port and initial checksum)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                if line.startswith("{"):
                    return json.loads(line)
        time.sleep(0.05)
    raise TimeoutError(f"agent printed nothing to {path}: {path.read_text() if path.exists() else 'missing'}")


def ask(port: int, timeout: float = 30) -> dict:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        data = b""
        while not data.endswith(b"\n"):
            chunk = s.recv(4096)
            if not chunk:
                break
            data += chunk
    return json.loads(data)


def agent_command(name: str, *args: str) -> list[str]:
    return [sys.executable, str(AGENTS / name), *args]

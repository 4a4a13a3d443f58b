"""Turns gpucr on for jupyter_server's own tests: every server they start loads the
``jupyter_gpucr`` extension (its kernel managers, websocket class and the gpucr provisioner).

The tests override ``jp_server_config`` per module, so the extension is added where every
server is made, in ``jp_configurable_serverapp``, on top of whatever config (and argv) the test gave.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from traitlets.config import Config

pytest_plugins = ["jupyter_server.pytest_plugin"]


# gpucr refuses to run beside another kernel manager class (it would not see the kernels); tests
# parametrized over jupyter_server's own manager classes run with gpucr's, a subclass of the async one.
GPUCR_MANAGER = "jupyter_gpucr.server.kernelmanager.GPUCRMappingKernelManager"
STOCK_MANAGERS = {
    f"jupyter_server.services.kernels.kernelmanager.{name}" for name in ("MappingKernelManager", "AsyncMappingKernelManager")
}


# Tests whose meaning gpucr changes on purpose, skipped with the reason (docs/dev/peer-suites.md lists them).
DIFFERENCES = {
    r"tests/services/kernels/test_cull\.py::test_cull_(idle|connected)\[.*\]":
        "culling suspends an idle kernel to disk instead of shutting it down: it stays listed under its id",
    r"tests/services/sessions/test_api\.py::.*\[jp_server_config[23]\]":
        "these configurations replace the server's kernel manager with NewPortsMappingKernelManager; gpucr refuses to "
        "run beside another kernel manager class (the server exits with a clear error) because it could not see the kernels",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        reason = next((why for pattern, why in DIFFERENCES.items() if re.fullmatch(pattern, item.nodeid)), None)
        if reason:
            item.add_marker(pytest.mark.skip(reason=f"gpucr: {reason}"))


def with_gpucr(config: Any) -> Any:
    """``config`` (a dict or Config) with the gpucr extension enabled, changed in place."""
    server = config.setdefault("ServerApp", {})
    server.setdefault("jpserver_extensions", {})["jupyter_gpucr"] = True
    if server.get("kernel_manager_class") in STOCK_MANAGERS:
        server["kernel_manager_class"] = GPUCR_MANAGER
    return config


def argv_with_gpucr(argv: list[str]) -> list[str]:
    option = "--ServerApp.kernel_manager_class="
    return [f"{option}{GPUCR_MANAGER}" if a.startswith(option) and a[len(option):] in STOCK_MANAGERS else a for a in argv]


@pytest.fixture
def jp_configurable_serverapp(jp_configurable_serverapp: Callable[..., Any], jp_server_config: Any) -> Callable[..., Any]:
    with_gpucr(jp_server_config)

    def make(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("config") is not None:
            kwargs["config"] = with_gpucr(Config(kwargs["config"]))
        if kwargs.get("argv"):
            kwargs["argv"] = argv_with_gpucr(kwargs["argv"])
        return jp_configurable_serverapp(*args, **kwargs)

    return make

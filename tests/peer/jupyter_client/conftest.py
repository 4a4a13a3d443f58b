"""Turns gpucr on for jupyter_client's own tests: the gpucr provisioner is the default.

jupyter_client reads the default provisioner's name from ``JUPYTER_DEFAULT_PROVISIONER_NAME``
whenever the (singleton) factory is created, so it also holds for tests that recreate it.
``test_provisioning`` replaces the entry-point registry with a fixed map; gpucr is added to
that map, as if installed, so kernelspecs without a provisioner still get the gpucr one.
"""
from __future__ import annotations

import pytest

pytest_plugins = ["pytest_jupyter", "pytest_jupyter.jupyter_client"]

GPUCR = "gpucr-provisioner"
GPUCR_ENTRY_POINT = "jupyter_gpucr.server.provisioner:GPUCRProvisioner"


@pytest.fixture(autouse=True)
def gpucr_default_provisioner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JUPYTER_DEFAULT_PROVISIONER_NAME", GPUCR)


@pytest.fixture(autouse=True)
def gpucr_in_mocked_registry(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    provisioning = request.module.__name__ == "tests.test_provisioning"
    if provisioning:
        monkeypatch.setitem(request.module.initial_provisioner_map, GPUCR, GPUCR_ENTRY_POINT)

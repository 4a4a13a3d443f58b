"""Turns gpucr on for jupyter_server's own tests: every server they start loads the
``jupyter_gpucr`` extension (its kernel managers, websocket class and the gpucr provisioner).

The tests override ``jp_server_config`` per module, so the extension is added where every
server is made, in ``jp_configurable_serverapp``, on top of whatever config the test gave.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from traitlets.config import Config

pytest_plugins = ["jupyter_server.pytest_plugin"]


def with_gpucr(config: Any) -> Any:
    """``config`` (a dict or Config) with the gpucr extension enabled, changed in place."""
    config.setdefault("ServerApp", {}).setdefault("jpserver_extensions", {})["jupyter_gpucr"] = True
    return config


@pytest.fixture
def jp_configurable_serverapp(jp_configurable_serverapp: Callable[..., Any], jp_server_config: Any) -> Callable[..., Any]:
    with_gpucr(jp_server_config)

    def make(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("config") is not None:
            kwargs["config"] = with_gpucr(Config(kwargs["config"]))
        return jp_configurable_serverapp(*args, **kwargs)

    return make

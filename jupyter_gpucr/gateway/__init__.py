"""gpucr for Jupyter Kernel Gateway: ``jupyter kernelgateway --KernelGatewayApp.api=jupyter_gpucr.gateway``.

Kernel Gateway is not a jupyter_server application and loads no server extension; it loads an
API module (a "personality"). This one is Kernel Gateway's own websocket personality with
gpucr's REST API, kernel manager, websocket connections, idle suspension, suspend on stop and
relist on start added, as the server extension adds them to a jupyter server.
"""
from __future__ import annotations

from typing import Any

from .manager import GatewayKernelManager
from .personality import GPUCRPersonality

__all__ = ["GPUCRPersonality", "GatewayKernelManager", "create_personality"]


def create_personality(*args: Any, **kwargs: Any) -> GPUCRPersonality:
    """Kernel Gateway's entry point of an API module."""
    return GPUCRPersonality(*args, **kwargs)

"""gpucr's kernel managers combined with Kernel Gateway's: seed notebooks, ``force_kernel_name``
and the ``KERNEL_GATEWAY`` environment of kernels keep working."""
from __future__ import annotations

from kernel_gateway.services.kernels.manager import KernelGatewayIOLoopKernelManager, SeedingMappingKernelManager
from traitlets import default

from ..server.kernelmanager import GPUCRKernelManager, GPUCRMappingKernelManager


class GatewayKernel(GPUCRKernelManager, KernelGatewayIOLoopKernelManager):
    """One kernel: gpucr's suspend-aware manager launching the way Kernel Gateway launches."""


class GatewayKernelManager(GPUCRMappingKernelManager, SeedingMappingKernelManager):
    """The gateway's mapping kernel manager: gpucr's, seeding kernels as Kernel Gateway's does."""

    @default("kernel_manager_class")
    def _default_kernel_manager_class(self) -> str:
        return f"{GatewayKernel.__module__}.{GatewayKernel.__name__}"

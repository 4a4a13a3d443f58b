"""The peer run means something only if the kernels really ran under gpucr: check it."""
from __future__ import annotations

import os

from jupyter_client.manager import start_new_async_kernel

from jupyter_gpucr.core.process.procs import in_own_pidns
from jupyter_gpucr.server.provisioner import GPUCRProvisioner


async def test_kernels_run_under_the_gpucr_provisioner(jp_environ: None) -> None:
    km, kc = await start_new_async_kernel()
    try:
        assert isinstance(km.provisioner, GPUCRProvisioner)
        assert km.provisioner.kernel_pid and in_own_pidns(km.provisioner.kernel_pid)
        assert km.provisioner.kernel_pid != os.getpid()
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)

"""The peer run means something only if the server really ran gpucr: check it."""
from __future__ import annotations

import json

from jupyter_gpucr.core.process.procs import in_own_pidns
from jupyter_gpucr.server.kernelmanager import GPUCRMappingKernelManager
from jupyter_gpucr.server.provisioner import GPUCRProvisioner


async def test_server_kernels_run_under_gpucr(jp_fetch, jp_serverapp) -> None:
    assert isinstance(jp_serverapp.kernel_manager, GPUCRMappingKernelManager)
    r = await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "python3"}))
    kernel_id = json.loads(r.body)["id"]
    provisioner = jp_serverapp.kernel_manager.get_kernel(kernel_id).provisioner
    assert isinstance(provisioner, GPUCRProvisioner)
    assert provisioner.kernel_pid and in_own_pidns(provisioner.kernel_pid)
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")

"""A GPU kernel suspended into S3 through the real server, SeaweedFS as the store (started as
bench/s3_server.py does; ``WEED``, default /tmp/weed where scripts/gpu-run.sh puts it with
S3_W2): its offloaded tensors go to the store beside the dump, not after the commit. Runs on the
H200 machine (docs/dev/gpu-tests.md); skips without a GPU or the weed binary."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from jupyter_gpucr.core.gpu import cuda, gpus
from tests.agent_servers import Served, kill_all
from tests.kernel_ws import execute

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import s3_server  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(900)]
WEED = os.environ.get("WEED", "/tmp/weed")
BESIDE = re.compile(r"(\d+) MiB of them sent while CRIU wrote them, (\d+) MiB more by the upload beside the dump")


async def test_offloaded_tensors_go_to_the_store_beside_the_dump(tmp_path):
    if not gpus.list_gpus() or cuda.unavailable_reason() or not Path(WEED).is_file():
        pytest.skip(f"needs an NVIDIA GPU with the CUDA checkpoint API and SeaweedFS's weed at {WEED}")
    pytest.importorskip("s3fs", reason="s3fs is installed on the H200 machine with S3_W2 (scripts/s3-carry.sh)")
    home = tmp_path / "home"
    with s3_server.seaweedfs(WEED, tmp_path / "s3-data", tmp_path / "weed.log") as s3:
        server = Served("server", home, f"s3://{s3.bucket}/gpu", f"--GPUCR.cache_dir={tmp_path / 'cache'}", env=s3.env)
        try:
            await server.wait_ready()
            kid = await server.start_kernel()
            ws = await server.ws(kid)
            await execute(ws, "import torch\nkeep = torch.rand(2**30 // 4, device='cuda')", timeout=300)
            ws.close()
            await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await server.wait_state(kid, "suspended", timeout=600)
            st = await server.request(f"api/gpucr/kernels/{kid}")
            assert not st.get("error") and st["trim"]["offload"]["bytes"] >= 1 << 30, st
            during, after = map(int, BESIDE.search(server.log.read_text()).groups())  # MiB, each rounded down
            assert (during + after + 2) << 20 >= st["trim"]["offload"]["bytes"] + st["checkpoint"]["size"], (during, after)
            assert server.stop() == 0
        finally:
            kill_all([server], home)

"""Kernels that move between nodes through object storage (moto's S3 server on localhost), real
jupyter servers with their own cache directories: a node that cannot run the whole-process
image restores the kernel's saved variables instead (c.GPUCR.portable_fallback), saying why."""
from __future__ import annotations

import asyncio
import json
import time

import pytest

from jupyter_gpucr.core.objectstore import ObjectStore
from tests.agent_servers import Served, kill_leftovers
from tests.conftest import criu_or_skip
from tests.cpuinfo import missing_here, with_feature
from tests.kernel_ws import execute
from tests.s3 import BUCKET, aws_env, environ, moto_server

pytestmark = pytest.mark.timeout(300)

CELL = "import numpy as np\nx = np.arange(1_000_000, dtype=np.int64)\nword = 'kept'"
CHECK = "print(int(x.sum()), word)"
EXPECTED = f"{sum(range(1_000_000))} kept"


async def wait_listed(server: Served, kernel_id: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while kernel_id not in [k["id"] for k in await server.request("api/kernels")]:
        assert time.monotonic() < deadline, f"kernel {kernel_id} was never listed"
        await asyncio.sleep(0.2)


def made_on_a_richer_cpu(store: ObjectStore, kernel_id: str, word: int, bit: int) -> None:
    """The one fake (no second machine here): the checkpoint in the store says it was made in
    another boot under another kernel, on a CPU with one instruction feature more than this one."""
    cid = max((c for c in store.names(kernel_id) if c != "lease.json"),
              key=lambda c: (store.read_json(f"{kernel_id}/{c}/complete.json") or {}).get("created", 0))
    base = f"{kernel_id}/{cid}"
    image = with_feature(store.fs.cat_file(store.path(f"{base}/checkpoint/host/cpuinfo.img")), word, bit)
    store.fs.pipe_file(store.path(f"{base}/checkpoint/host/cpuinfo.img"), image)
    manifest = json.loads(store.fs.cat_file(store.path(f"{base}/checkpoint/manifest.json")))
    manifest["host"].update(boot_id="another-node", kernel="5.4.0-other")
    store.fs.pipe_file(store.path(f"{base}/checkpoint/manifest.json"), json.dumps(manifest).encode())
    complete = store.read_json(f"{base}/complete.json") or {}
    complete["manifest"] = manifest
    complete["objects"].update({"checkpoint/host/cpuinfo.img": len(image),
                                "checkpoint/manifest.json": len(json.dumps(manifest).encode())})
    store.write_json(f"{base}/complete.json", complete)


async def test_a_node_that_cannot_run_the_image_restores_the_saved_variables(tmp_path):
    criu = criu_or_skip()
    word, bit, feature = missing_here(criu, tmp_path)
    home, url = tmp_path / "home", f"s3://{BUCKET}/portable"
    servers: list[Served] = []
    with moto_server(tmp_path / "moto.log") as endpoint:
        env = aws_env(endpoint)
        try:
            a = Served("server", home, url, f"--GPUCR.cache_dir={tmp_path / 'cache-a'}", "--GPUCR.portable_fallback=True",
                       env=env)
            servers.append(a)
            await a.wait_ready()
            session = await a.request("api/sessions", "POST", {"path": "move.ipynb", "type": "notebook",
                                                                "name": "move.ipynb", "kernel": {"name": "python3"}})
            kid = session["kernel"]["id"]
            ws = await a.ws(kid)
            await execute(ws, CELL)
            ws.close()
            await a.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await a.wait_state(kid, "suspended", timeout=120)
            st = await a.request(f"api/gpucr/kernels/{kid}")
            assert st["engine"] == "criu", st
            assert a.stop() == 0
            with environ(env):
                made_on_a_richer_cpu(ObjectStore(url, user=None), kid, word, bit)

            b = Served("server", home, url, f"--GPUCR.cache_dir={tmp_path / 'cache-b'}", env=env)
            servers.append(b)
            await b.wait_ready()
            await wait_listed(b, kid)
            ws = await b.ws(kid)
            _, out, _ = await execute(ws, CHECK)
            ws.close()
            assert out.strip().splitlines()[-1] == EXPECTED
            st = await b.request(f"api/gpucr/kernels/{kid}")
            assert st["state"] == "running" and st["engine"] == "snapshot", st
            assert f"lacks {feature}, which the checkpoint's node" in st["engine_reason"], st["engine_reason"]
            assert "ran Linux 5.4.0-other" in st["engine_reason"]
            assert st["warnings"][0].startswith("Restored from the variables saved at the suspend, not the whole process")
            assert b.stop() == 0
        finally:
            for s in servers:
                if s.proc.poll() is None:
                    s.proc.kill()
                    s.proc.wait()
            kill_leftovers(home)

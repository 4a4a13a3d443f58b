"""Kernels that move between nodes through object storage (moto's S3 server on localhost), real
jupyter servers with their own cache directories: a node that cannot run the whole-process
image restores the kernel's saved variables instead (c.GPUCR.portable_fallback), saying why; a
lost node's lease expires."""
from __future__ import annotations

import asyncio
import json
import platform
import time

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from tests.agent_servers import Served, kernel_processes, kill_all
from tests.conftest import criu_or_skip
from tests.cpuinfo import missing_here, with_feature
from tests.kernel_ws import execute
from tests.s3 import BUCKET, aws_env, environ, moto_server
from tests.server.test_objectstore_server import CELL, CHECK, EXPECTED, wait_listed

pytestmark = pytest.mark.timeout(300)

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
            assert out.strip() == EXPECTED
            st = await b.request(f"api/gpucr/kernels/{kid}")
            assert st["state"] == "running" and st["engine"] == "snapshot", st
            assert f"lacks {feature}, which the checkpoint's node" in st["engine_reason"], st["engine_reason"]
            assert "ran Linux 5.4.0-other" in st["engine_reason"]
            assert st["warnings"][0].startswith("Restored from the variables saved at the suspend, not the whole process")
            assert b.stop() == 0
        finally:
            kill_all(servers, home)


async def test_a_lost_nodes_lease_expires_and_another_node_takes_the_kernel_over(tmp_path):
    """Node A runs the kernel and renews its lease; node B is refused while A lives, even once the
    timeout has passed since A took the lease; A killed -9 (the node lost), B takes the lease over
    once its heartbeat is older than c.GPUCR.lease_timeout_s and restores the last checkpoint."""
    criu_or_skip()
    home, url, timeout = tmp_path / "home", f"s3://{BUCKET}/leases", 3.0
    servers: list[Served] = []
    with moto_server(tmp_path / "moto.log") as endpoint:
        env = aws_env(endpoint)

        def node(cache: str) -> Served:
            servers.append(Served("server", home, url, f"--GPUCR.cache_dir={tmp_path / cache}",
                                  f"--GPUCR.lease_timeout_s={timeout}", env=env))
            return servers[-1]

        try:
            a = node("cache-a")
            await a.wait_ready()
            kid = await a.start_kernel()
            ws = await a.ws(kid)
            await execute(ws, CELL)
            await a.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await a.wait_state(kid, "suspended", timeout=120)  # durable in the store
            _, out, _ = await execute(ws, "word = 'changed on A'\n" + CHECK)  # restored on A: A holds the lease
            ws.close()
            assert await a.state(kid) == "running"

            b = node("cache-b")
            await b.wait_ready()
            await wait_listed(b, kid)
            await asyncio.sleep(timeout + 1)  # A's lease is older than the timeout, its heartbeat is not
            with pytest.raises(HTTPClientError) as refused:
                await b.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
            a_node = f"{platform.node()}:{tmp_path / 'cache-a'}"
            assert refused.value.code == 409 and f"is running on {a_node}" in str(refused.value)
            assert "lease expires" in str(refused.value)

            a.proc.kill()  # the node is lost, with the kernel it ran: nobody renews its lease
            a.proc.wait()
            for p in kernel_processes(kid):
                p.kill()
            deadline = time.monotonic() + 4 * timeout
            while True:
                try:
                    await b.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
                    break
                except HTTPClientError as e:
                    assert e.code == 409 and time.monotonic() < deadline, str(e)
                    await asyncio.sleep(0.5)
            ws = await b.ws(kid)
            _, out, _ = await execute(ws, CHECK)
            ws.close()
            assert out.strip() == EXPECTED, "the last durable checkpoint, not what A did after it"
            st = await b.request(f"api/gpucr/kernels/{kid}")
            assert st["warnings"][0].startswith(f"Taken over from {a_node}, which stopped renewing its lease"), st
            with environ(env):
                lease = ObjectStore(url, user=None).read_json(f"{kid}/lease.json")
            assert lease is not None and lease["node"].endswith("cache-b")
            assert b.stop() == 0
        finally:
            kill_all(servers, home)

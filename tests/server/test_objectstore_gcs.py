"""A kernel suspended into gs:// (fake-gcs-server on localhost, :mod:`tests.gcs`) by a real jupyter
server, restored by another node with its own cache, and refused to a third while it runs there."""
from __future__ import annotations

import platform
import shutil

import pytest
from tornado.httpclient import HTTPClientError

from tests.agent_servers import Served, kill_all
from tests.conftest import criu_or_skip
from tests.gcs import BUCKET, OPTIONS, gcs_env, gcs_server
from tests.kernel_ws import execute
from tests.server.test_objectstore_server import CELL, CHECK, EXPECTED, wait_listed

pytestmark = pytest.mark.timeout(240)


async def test_suspended_to_gcs_restored_on_another_node_and_refused_to_a_third(tmp_path):
    criu_or_skip()
    home, url = tmp_path / "home", f"gs://{BUCKET}/kernels"
    servers: list[Served] = []
    with gcs_server(tmp_path / "gcs") as endpoint:

        def node(cache: str) -> Served:
            servers.append(Served("server", home, url, f"--GPUCR.cache_dir={tmp_path / cache}",
                                  f"--GPUCR.store_options={OPTIONS!r}", env=gcs_env(endpoint)))
            return servers[-1]

        try:
            a = node("cache-a")
            await a.wait_ready()
            kid = await a.start_kernel()
            ws = await a.ws(kid)
            await execute(ws, CELL)
            ws.close()
            await a.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await a.wait_state(kid, "suspended", timeout=120)
            assert a.stop() == 0
            shutil.rmtree(tmp_path / "cache-a")  # node A and its disk are gone

            b, c = node("cache-b"), node("cache-c")
            await b.wait_ready()
            await c.wait_ready()
            await wait_listed(b, kid)
            ws = await b.ws(kid)
            _, out, _ = await execute(ws, CHECK)
            ws.close()
            assert out.strip() == EXPECTED and await b.state(kid) == "running"

            await wait_listed(c, kid)
            with pytest.raises(HTTPClientError) as refused:  # c lists it too, but may not run it while b does
                await c.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
            assert refused.value.code == 409
            assert f"is running on {platform.node()}:{tmp_path / 'cache-b'}" in str(refused.value)
            assert await c.state(kid) == "suspended"
        finally:
            kill_all(servers, home)

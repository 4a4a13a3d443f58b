"""What the bucket holds, seen from real jupyter servers on moto's S3 server: each user's kernels
only under that user's prefix, a damaged object named at the restore, retention applied to the
prefix after each upload, and a kernel shut down taking its objects with it."""
from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from tests.agent_servers import Served, kill_all
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute
from tests.s3 import BUCKET, aws_env, environ, moto_server
from tests.server.test_objectstore_server import CELL, CHECK, EXPECTED, wait_listed

pytestmark = pytest.mark.timeout(180)


class Nodes:
    """Servers of one test, each with its own cache (a node), on one store."""

    def __init__(self, tmp_path: Path, url: str, env: dict[str, str]) -> None:
        self.tmp_path, self.url, self.env = tmp_path, url, env
        self.servers: list[Served] = []

    def start(self, cache: str, *options: str, user: str | None = None) -> Served:
        env = {**self.env, "JUPYTERHUB_USER": user} if user else self.env
        self.servers.append(Served("server", self.tmp_path / f"home-{user or 'me'}", self.url,
                                   f"--GPUCR.cache_dir={self.tmp_path / cache}", *options, env=env))
        return self.servers[-1]

    def store(self, user: str | None = None) -> ObjectStore:
        return ObjectStore(self.url, user=user)


@contextlib.contextmanager
def nodes_on_s3(tmp_path: Path, prefix: str) -> Iterator[Nodes]:
    """moto's S3 server, its variables set here too (to look into the bucket), and the servers
    started meanwhile, killed at the end with what they left."""
    with moto_server(tmp_path / "moto.log") as endpoint, environ(aws_env(endpoint)):
        nodes = Nodes(tmp_path, f"s3://{BUCKET}/{prefix}", aws_env(endpoint))
        try:
            yield nodes
        finally:
            kill_all(nodes.servers, tmp_path)


def checkpoints(store: ObjectStore) -> dict[str, list[str]]:
    """Each kernel in the store and the checkpoints it has there, durable or not, by their folders."""
    found: dict[str, set[str]] = {}
    for key in store.sizes(""):
        parts = key.split("/")
        if len(parts) > 2:
            found.setdefault(parts[0], set()).add(parts[1])
    return {name: sorted(ids) for name, ids in found.items()}


async def suspend_durably(server: Served, kernel_id: str) -> None:
    await server.request(f"api/gpucr/kernels/{kernel_id}/suspend", "POST", {})
    await server.wait_state(kernel_id, "suspended", timeout=120)


async def run_cell(server: Served, kernel_id: str, code: str) -> str:
    ws = await server.ws(kernel_id)
    try:
        _, out, _ = await execute(ws, code)
    finally:
        ws.close()
    return out.strip()


async def test_another_users_server_neither_lists_nor_restores_the_kernels(tmp_path):
    criu_or_skip()
    with nodes_on_s3(tmp_path, "users") as nodes:
        a = nodes.start("cache-a", user="alice")
        await a.wait_ready()
        kid = await a.start_kernel()
        await run_cell(a, kid, CELL)
        await suspend_durably(a, kid)
        assert a.stop() == 0
        assert list(checkpoints(nodes.store("alice"))) == [kid] and checkpoints(nodes.store("bob")) == {}

        b, a2 = nodes.start("cache-b", user="bob"), nodes.start("cache-a2", user="alice")
        await asyncio.gather(b.wait_ready(), a2.wait_ready())
        await wait_listed(a2, kid)
        assert await b.request("api/kernels") == []
        with pytest.raises(HTTPClientError) as refused:
            await b.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
        assert refused.value.code == 404 and f"No kernel {kid}." in str(refused.value)
        assert checkpoints(nodes.store("bob")) == {}, "bob's server wrote nothing, not even a lease"

        assert await run_cell(a2, kid, CHECK) == EXPECTED


async def test_a_damaged_object_is_named_and_the_kernel_stays_suspended(tmp_path):
    criu_or_skip()
    with nodes_on_s3(tmp_path, "damaged") as nodes:
        a = nodes.start("cache-a")
        await a.wait_ready()
        kid = await a.start_kernel()
        await run_cell(a, kid, CELL)
        await suspend_durably(a, kid)
        assert a.stop() == 0

        store = nodes.store()
        [cid] = checkpoints(store)[kid]
        images = {k: n for k, n in store.sizes(f"{kid}/{cid}").items() if k.startswith("checkpoint/images/pages-")}
        damaged = f"{kid}/{cid}/{max(images, key=lambda k: images[k])}"  # the most memory: the arange
        data = bytearray(store.fs.cat_file(store.path(damaged)))
        data[len(data) // 2:len(data) // 2 + 64] = bytes(b ^ 0xFF for b in data[len(data) // 2:len(data) // 2 + 64])
        store.fs.pipe_file(store.path(damaged), bytes(data))

        b = nodes.start("cache-b")
        await b.wait_ready()
        await wait_listed(b, kid)
        with pytest.raises(HTTPClientError) as failed:
            await b.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
        said = str(failed.value)
        assert failed.value.code == 422, said
        assert f"{store!r}/{damaged}" in said and "The checkpoint in the store is damaged" in said, said
        assert await b.state(kid) == "suspended"
        assert kid in [k["id"] for k in await b.request("api/kernels")]


async def test_retention_keeps_only_what_its_rules_keep_in_the_bucket(tmp_path):
    """keep_last 3 would keep all three checkpoints; max_bucket_bytes (1 byte) deletes the older
    one of the first kernel and nothing else: the newest of each kernel is its only way back."""
    criu_or_skip()
    with nodes_on_s3(tmp_path, "retention") as nodes:
        a = nodes.start("cache-a", "--GPUCR.keep_last=3", "--GPUCR.max_bucket_bytes=1")
        await a.wait_ready()
        first, second = await a.start_kernel(), await a.start_kernel()
        await asyncio.gather(run_cell(a, first, CELL), run_cell(a, second, CELL))
        await suspend_durably(a, first)
        store = nodes.store()
        [older] = checkpoints(store)[first]
        assert await run_cell(a, first, "word = 'newer'") == ""  # restored on this node
        await suspend_durably(a, first)
        await suspend_durably(a, second)

        kept = checkpoints(store)
        assert sorted(kept) == sorted([first, second]) and older not in kept[first], kept
        assert [len(ids) for ids in kept.values()] == [1, 1], kept
        log = a.log.read_text()
        assert f"deleted checkpoint {older} of kernel {first} from {store!r}" in log
        assert "over max_bucket_bytes (1)" in log
        assert f"the user's prefix {store!r} holds" in log  # still over: what is left is never deleted
        assert a.stop() == 0

        b = nodes.start("cache-b")
        await b.wait_ready()
        await asyncio.gather(wait_listed(b, first), wait_listed(b, second))
        assert await run_cell(b, first, CHECK) == EXPECTED.replace("kept", "newer")
        assert await run_cell(b, second, CHECK) == EXPECTED


async def test_a_kernel_shut_down_takes_its_objects_with_it(tmp_path):
    """Shut down while its upload is under way, or deleted with its last checkpoint: nothing of
    the kernel is left in the bucket for another node to list."""
    criu_or_skip()
    with nodes_on_s3(tmp_path, "shutdown") as nodes:
        a = nodes.start("cache-a")
        await a.wait_ready()
        uploading, deleted = await a.start_kernel(), await a.start_kernel()
        await asyncio.gather(run_cell(a, uploading, CELL), run_cell(a, deleted, CELL))
        await suspend_durably(a, deleted)
        store = nodes.store()
        [cid] = checkpoints(store)[deleted]

        st = await a.request(f"api/gpucr/kernels/{uploading}/suspend", "POST", {})
        assert st["state"] == "uploading", st
        await a.request(f"api/kernels/{uploading}", "DELETE")
        await a.request(f"api/gpucr/checkpoints/{cid}", "DELETE")
        deadline = time.monotonic() + 60
        while not all(f"kernel {k} was shut down: its objects are deleted" in a.log.read_text()
                      for k in (uploading, deleted)):
            assert time.monotonic() < deadline, a.log.read_text()[-3000:]
            await asyncio.sleep(0.2)
        log = a.log.read_text()  # its upload ended (its files went to the trash meanwhile) before the deletion
        assert f"kernel {uploading} is in {store!r}" in log or f"kernel {uploading} was shut down while it was uploading" in log
        assert checkpoints(store) == {}

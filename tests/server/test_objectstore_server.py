"""Kernels suspended into object storage (moto's S3 server on localhost) by real jupyter servers,
each with its own node-local cache directory, as on the nodes of a JupyterHub on Kubernetes;
encrypted with the operator's key, and restored after the operator rotated it."""
from __future__ import annotations

import asyncio
import os
import platform
import secrets
import shutil
import time
from pathlib import Path

import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpucr.core.objectstore.bucket import ObjectStore
from jupyter_gpucr.core.objectstore.sealing import load_key
from jupyter_gpucr.core.objectstore.transfer import completed
from tests.agent_servers import Served, kill_all
from tests.conftest import criu_or_skip
from tests.kernel_ws import execute, saved_history
from tests.s3 import BUCKET, aws_env, environ, free_port, moto_server

pytestmark = pytest.mark.timeout(300)

CELL = "import numpy as np\nx = np.arange(1_000_000, dtype=np.int64)\nword = 'kept'"
CHECK = "print(int(x.sum()), word)"
EXPECTED = f"{sum(range(1_000_000))} kept"


class Nodes:
    """Starts this user's servers as if on other nodes: each with a cache directory of its own, all
    on the store ``url``; each one started is added to ``servers`` (for ``kill_all``)."""

    def __init__(self, servers: list[Served], home: Path, url: str, tmp_path: Path, env: dict[str, str]) -> None:
        self.servers, self.home, self.url, self.tmp_path, self.env = servers, home, url, tmp_path, env

    def __call__(self, cache: str, *options: str, **extra: str) -> Served:
        self.servers.append(Served("server", self.home, self.url, f"--GPUCR.cache_dir={self.tmp_path / cache}",
                                   *options, env={**self.env, **extra}))
        return self.servers[-1]


async def wait_listed(server: Served, kernel_id: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while kernel_id not in [k["id"] for k in await server.request("api/kernels")]:
        assert time.monotonic() < deadline, f"kernel {kernel_id} was never listed"
        await asyncio.sleep(0.2)


async def test_suspended_to_s3_killed_mid_upload_restored_on_another_node(tmp_path):
    criu_or_skip()
    home = tmp_path / "home"  # the user's persistent home, the same on every node
    url = f"s3://{BUCKET}/kernels"
    servers: list[Served] = []
    with moto_server(tmp_path / "moto.log") as endpoint:
        env = aws_env(endpoint)
        node = Nodes(servers, home, url, tmp_path, env)

        try:
            a = node("cache-a")
            await a.wait_ready()
            session = await a.request("api/sessions", "POST", {"path": "keep.ipynb", "type": "notebook",
                                                                "name": "keep.ipynb", "kernel": {"name": "python3"}})
            kid = session["kernel"]["id"]
            ws = await a.ws(kid)
            await execute(ws, CELL)
            ws.close()
            st = await a.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            assert st["state"] == "uploading", st  # the GPU is free, the store does not have all of it yet
            with environ(env):
                store = ObjectStore(url, user=None)
                uploading = [k for k in store.sizes(kid) if k.endswith("uploading.json")]
                a.proc.kill()  # kill -9 mid-upload
                a.proc.wait()
                assert uploading and not [k for k in store.sizes(kid) if k.endswith("complete.json")]

            a2 = node("cache-a")  # the same node starts again: it redoes the upload from its local copy
            await a2.wait_ready()
            await wait_listed(a2, kid)
            await a2.wait_state(kid, "suspended", timeout=120)
            shutil.rmtree(tmp_path / "cache-a")  # that node's disk is gone (its server stays, to be refused below)

            b = node("cache-b")
            await b.wait_ready()
            await wait_listed(b, kid)
            assert await b.state(kid) == "suspended"
            assert [s["path"] for s in await b.request("api/sessions")] == ["keep.ipynb"]
            ws = await b.ws(kid)
            _, out, _ = await execute(ws, CHECK)
            ws.close()
            assert out.strip() == EXPECTED
            # its history goes on in its folder on this node (SQLite would not write through the old path)
            assert CHECK in await saved_history(tmp_path / "cache-b" / "procs" / kid / "history.sqlite", CHECK)
            assert await b.state(kid) == "running"

            b_node = f"{platform.node()}:{tmp_path / 'cache-b'}"
            with pytest.raises(HTTPClientError) as refused:  # node a still lists it, but may not run it while b does
                await a2.request(f"api/gpucr/kernels/{kid}/resume", "POST", {})
            assert refused.value.code == 409 and f"is running on {b_node}" in str(refused.value)
            assert await a2.state(kid) == "suspended"
            assert a2.stop() == 0

            seen = len(b.log.read_bytes())
            assert b.stop() == 0  # SIGTERM: suspended and uploaded before the server exits
            assert "1 kernel(s) are on disk for the next start" in b.log.read_bytes()[seen:].decode()
            with environ(env):
                newest = max((store.read_json(f"{kid}/{cid}/complete.json") or {"created": 0} for cid in store.names(kid)
                              if cid != "lease.json"), key=lambda c: c["created"])
                assert newest["node"].endswith("cache-b") and store.read_json(f"{kid}/lease.json") is None
        finally:
            kill_all(servers, home)


async def test_store_down_leaves_the_kernel_running(tmp_path):
    criu_or_skip()
    home = tmp_path / "home"
    server = Served("server", home, f"s3://{BUCKET}/kernels", f"--GPUCR.cache_dir={tmp_path / 'cache'}",
                    env=aws_env(f"http://127.0.0.1:{free_port()}"))
    try:
        await server.wait_ready()
        kid = await server.start_kernel()
        ws = await server.ws(kid)
        await execute(ws, "y = 41")
        with pytest.raises(HTTPClientError) as failed:
            await server.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
        assert failed.value.code == 503
        assert f"s3://{BUCKET}/kernels" in str(failed.value) and "could not be used" in str(failed.value)
        _, out, _ = await execute(ws, "print(y + 1)")
        assert out.strip() == "42" and await server.state(kid) == "running"
        ws.close()
    finally:
        kill_all([server], home)


async def test_kernel_sealed_with_the_operators_key_is_restored_on_another_node(tmp_path):
    """A key file open to others stops the server; with the key, nothing the kernel holds is in
    the store's bytes, and another node with the same key (from the environment) lists and restores it."""
    criu_or_skip()
    home, url = tmp_path / "home", f"s3://{BUCKET}/sealed-kernels"
    key = tmp_path / "gpucr.key"
    key.write_bytes(os.urandom(32))
    token = secrets.token_hex(16)
    servers: list[Served] = []
    with moto_server(tmp_path / "moto.log") as endpoint:
        env = aws_env(endpoint)
        node = Nodes(servers, home, url, tmp_path, env)

        try:
            key.chmod(0o644)
            refused = node("cache-a", f"--GPUCR.encryption_key_file={key}")
            assert refused.proc.wait(60) != 0
            assert f"{key} is open to other users (mode 0644). chmod 600 {key}" in refused.log.read_text()
            key.chmod(0o600)

            a = node("cache-a", f"--GPUCR.encryption_key_file={key}")
            await a.wait_ready()
            kid = await a.start_kernel()
            ws = await a.ws(kid)
            await execute(ws, f"secret = '{token}'[::-1]")
            ws.close()
            await a.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await a.wait_state(kid, "suspended", timeout=120)
            assert a.stop() == 0
            with environ(env):
                store = ObjectStore(url, user=None)
                stored = {p: store.fs.cat_file(p) for p in store.fs.find(store.root)}
            assert [p for p, data in stored.items() if p.endswith(".img")], "the images are in the store"
            assert [p for p, data in stored.items() if token.encode() in data or token[::-1].encode() in data] == []

            b = node("cache-b", GPUCR_ENCRYPTION_KEY_FILE=str(key))
            await b.wait_ready()
            await wait_listed(b, kid)
            ws = await b.ws(kid)
            _, out, _ = await execute(ws, "print(secret[::-1])")
            ws.close()
            assert out.strip() == token
        finally:
            kill_all(servers, home)


async def wait_logged(server: Served, text: str, timeout: float = 60) -> str:
    """The server's log once it holds ``text``."""
    deadline = time.monotonic() + timeout
    while text not in (log := server.log.read_text()):
        assert time.monotonic() < deadline, f"never logged {text!r}: {log[-3000:]}"
        await asyncio.sleep(0.2)
    return log


async def test_kernel_suspended_before_a_key_rotation_restores_and_is_sealed_again_with_the_new_key(tmp_path):
    """K1 seals a kernel; a server with only K2 does not list it and names K1's id; a previous key
    file open to others stops the server; a server with K2 and K1 as its previous key restores it,
    its next checkpoint is sealed with K2 and the K1 one goes; the log says when K1 can be removed."""
    criu_or_skip()
    home, url = tmp_path / "home", f"s3://{BUCKET}/rotated-kernels"
    k1, k2 = tmp_path / "k1.key", tmp_path / "k2.key"
    for path in (k1, k2):
        path.write_bytes(os.urandom(32))
        path.chmod(0o600)
    k1_id, k2_id = load_key(k1).id, load_key(k2).id
    servers: list[Served] = []
    with moto_server(tmp_path / "moto.log") as endpoint:
        env = aws_env(endpoint)
        node = Nodes(servers, home, url, tmp_path, env)

        def sealed_with() -> list[str]:
            with environ(env):
                store = ObjectStore(url, user=None)
                return [c["encryption"]["key_id"] for c in completed(store, kid)]

        try:
            a = node("cache-a", f"--GPUCR.encryption_key_file={k1}")
            await a.wait_ready()
            kid = await a.start_kernel()
            ws = await a.ws(kid)
            await execute(ws, "answer = 6 * 7")
            ws.close()
            await a.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await a.wait_state(kid, "suspended", timeout=120)
            assert a.stop() == 0 and sealed_with() == [k1_id]

            only_k2 = node("cache-b", f"--GPUCR.encryption_key_file={k2}")
            log = await wait_logged(only_k2, f"kernel {kid} in")
            assert f"is encrypted with another key (id {k1_id}); this server's key ({k2}) has id {k2_id}." in log
            assert kid not in [k["id"] for k in await only_k2.request("api/kernels")]
            assert only_k2.stop() == 0

            k1.chmod(0o644)
            refused = node("cache-c", f"--GPUCR.encryption_key_file={k2}", GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES=str(k1))
            assert refused.proc.wait(60) != 0
            assert f"{k1} is open to other users (mode 0644). chmod 600 {k1}" in refused.log.read_text()
            k1.chmod(0o600)

            rotated = node("cache-c", f"--GPUCR.encryption_key_file={k2}", GPUCR_PREVIOUS_ENCRYPTION_KEY_FILES=str(k1))
            await rotated.wait_ready()
            await wait_listed(rotated, kid)
            log = rotated.log.read_text()
            assert f"1 checkpoint(s) in s3://{BUCKET}/rotated-kernels/" in log
            assert f"sealed with the previous encryption key {k1_id} ({k1}); keep it" in log
            ws = await rotated.ws(kid)
            _, out, _ = await execute(ws, "print(answer)")
            ws.close()
            assert out.strip() == "42"
            await rotated.request(f"api/gpucr/kernels/{kid}/suspend", "POST", {})
            await rotated.wait_state(kid, "suspended", timeout=120)
            assert sealed_with() == [k2_id], "sealed with the current key; the checkpoint sealed with K1 is gone"
            assert rotated.stop() == 0

            again = node("cache-c", f"--GPUCR.encryption_key_file={k2}", f"--GPUCR.previous_encryption_key_files={k1}")
            log = await wait_logged(again, f"0 checkpoints in s3://{BUCKET}/rotated-kernels/")
            assert f"the previous encryption key {k1_id} ({k1}); it can be removed" in log
        finally:
            kill_all(servers, home)

"""A real S3 server for the object storage tests: moto's server mode on localhost (the HTTP S3 API
that s3fs tests itself against), a bucket in it, and the ``AWS_*`` variables that point at it."""
from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

BUCKET = "gpucr-checkpoints"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(proc: subprocess.Popen, port: int, log: Path, timeout: float = 30) -> None:
    """Return once ``proc`` (a server the test started) accepts connections on ``port``; fail with
    the end of its ``log`` if it exits or is not there within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)


def aws_env(endpoint: str) -> dict[str, str]:
    """What a pod or a user's shell would set: keys, region and the endpoint of an S3-compatible store."""
    return {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint}


@contextlib.contextmanager
def moto_server(log: Path) -> Iterator[str]:
    """Start ``moto_server`` on a free port with an empty bucket; yield its endpoint URL; stop it."""
    pytest.importorskip("moto.server", reason="moto[server] is installed by scripts/setup.sh")
    boto3 = pytest.importorskip("boto3")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        wait_listening(proc, port, log)
        env = aws_env(endpoint)
        boto3.client("s3", endpoint_url=endpoint, region_name=env["AWS_DEFAULT_REGION"],
                     aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
                     aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"]).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def environ(values: dict[str, str]) -> Iterator[None]:
    """These variables set in this process for the block (the code under test reads them as a server would)."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

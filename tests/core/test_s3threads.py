"""The plain botocore client that sends upload parts must reach the same store, as the same
user, as s3fs does; where it cannot match s3fs's settings, s3fs keeps sending them."""
from __future__ import annotations

import pytest

pytest.importorskip("s3fs")

from jupyter_gpucr.core.objectstore import s3threads  # noqa: E402
from jupyter_gpucr.core.objectstore.bucket import ObjectStore  # noqa: E402


def test_settings_come_from_store_options():
    store = ObjectStore("s3://bucket/prefix", {"endpoint_url": "http://127.0.0.1:9", "key": "AK", "secret": "SK"})
    client = s3threads.threaded_client(store.fs, 32)
    assert client.meta.endpoint_url == "http://127.0.0.1:9"
    assert client._request_signer._credentials.access_key == "AK"
    assert client._client_config.max_pool_connections == 32


def test_endpoint_and_credentials_from_the_environment(monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:8")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    client = s3threads.threaded_client(ObjectStore("s3://bucket/prefix").fs, 16)
    assert client.meta.endpoint_url == "http://127.0.0.1:8"
    assert client._request_signer._credentials.access_key == "ENVKEY"


def test_a_session_passed_in_keeps_s3fs_sending():
    import aiobotocore.session

    store = ObjectStore("s3://bucket/prefix", {"session": aiobotocore.session.AioSession()})
    assert s3threads.threaded_client(store.fs, 16) is None

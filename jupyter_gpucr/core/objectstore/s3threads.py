"""A plain botocore S3 client beside s3fs's, for the calls that carry a part's bytes.

s3fs runs every call on one asyncio loop thread, so the per-byte work of a request (its SigV4
payload hash, its CRC32 checksum, copying the body) is done by that one thread for every part in
flight. On the H200 machine, against a local SeaweedFS that took 663 MB/s from boto3's 16 threads,
gpucr's uploads through s3fs reached 273 MB/s, its one loop thread busy all along
(``bench/bench_store_raw.py``). botocore's own clients are thread-safe: built from the same
settings as s3fs's (credentials, endpoint, profile, config, ``s3_additional_kwargs``), one client
lets each upload thread do its part's work itself.
"""
from __future__ import annotations

from typing import Any

_CREDENTIALS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")


def threaded_client(fs: Any, connections: int) -> Any | None:
    """A botocore S3 client with the settings of the s3fs filesystem ``fs`` and a pool of
    ``connections``; None where it cannot match them (a session object passed in, an
    aiobotocore-only option): the caller then goes through s3fs."""
    if not getattr(fs, "_session_is_owned", True):  # the caller's own session: its credentials are not ours to copy
        return None
    try:
        import botocore.session
        from botocore import UNSIGNED
        from botocore.config import Config

        client_kwargs = dict(fs.client_kwargs)
        init = {"aws_access_key_id": fs.key, "aws_secret_access_key": fs.secret,
                "aws_session_token": fs.token, "endpoint_url": fs.endpoint_url}
        init = {k: v for k, v in init.items() if v is not None and v != client_kwargs.get(k)}
        if "use_ssl" not in client_kwargs:
            init["use_ssl"] = fs.use_ssl
        config = {**fs._prepare_config_kwargs(), "max_pool_connections": connections}
        if fs.anon:
            for name in _CREDENTIALS:
                init.pop(name, None)
                client_kwargs.pop(name, None)
            config["signature_version"] = UNSIGNED
        session = botocore.session.Session(**fs.kwargs)  # the profile, as s3fs's AioSession gets it
        return session.create_client("s3", config=Config(**config), **init, **client_kwargs)
    except Exception:  # noqa: BLE001 - an option only aiobotocore knows: s3fs keeps doing it all
        return None


def upload_part(client: Any, fs: Any, bucket: str, key: str, upload_id: str, number: int, body: bytes) -> str:
    """Send one part of a multipart upload with ``client``; its ETag. Errors come out as s3fs's
    would (a refused key as PermissionError, a missing bucket as FileNotFoundError)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    extra = {k: v for k, v in fs.s3_additional_kwargs.items() if k in _upload_part_parameters(client)}
    try:
        reply = client.upload_part(Bucket=bucket, Key=key, UploadId=upload_id, PartNumber=number, Body=body, **extra)
    except ClientError as e:
        raise translate_boto_error(e) from e
    return reply["ETag"]


def _upload_part_parameters(client: Any) -> set[str]:
    return set(client.meta.service_model.operation_model("UploadPart").input_shape.members)

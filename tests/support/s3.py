"""An S3-compatible bucket on loopback: moto's real S3 HTTP server (boto3 speaks to it as to
AWS), for recordings copied to a bucket."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import boto3  # type: ignore[import-untyped]
from moto.server import ThreadedMotoServer

BUCKET = "hotline-recordings"
ACCESS_KEY_ID = "test-access-key-id"
SECRET = "test-secret-key-never-logged-9f3b"


def bucket_client(url: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=url,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET,
    )


@contextmanager
def fake_s3(bucket: str = BUCKET) -> Iterator[str]:
    """moto's S3 server on a free loopback port, with `bucket` made; yields its URL."""
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    bucket_client(url).create_bucket(Bucket=bucket)
    try:
        yield url
    finally:
        server.stop()

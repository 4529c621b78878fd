"""A real S3 API for tests: moto's server on a free loopback port, and a client for it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tests.support.servers import free_port

# moto accepts any credentials; these are what the clients and CFT_S3_* settings send.
ACCESS_KEY, SECRET_KEY, REGION = "test-key", "test-secret", "us-east-1"


@contextmanager
def moto_server() -> Iterator[str]:
    """Start moto's S3 server; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


def client(endpoint: str) -> Any:
    """A boto3 S3 client of the server at endpoint."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
    )


def settings_env(endpoint: str) -> dict[str, str]:
    """The CFT_S3_* variables that point cft at the server."""
    return {
        "CFT_S3_ENDPOINT_URL": endpoint,
        "CFT_S3_ACCESS_KEY_ID": ACCESS_KEY,
        "CFT_S3_SECRET_ACCESS_KEY": SECRET_KEY,
        "CFT_S3_REGION": REGION,
    }

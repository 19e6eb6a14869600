"""A local S3 endpoint for tests and benchmarks: moto's HTTP server on 127.0.0.1, dummy credentials.

``with local_s3() as endpoint:`` starts ``moto.server.ThreadedMotoServer`` on a free port of 127.0.0.1,
points this process's environment (inherited by child processes) at it — ``AWS_ENDPOINT_URL``, dummy
keys, no config or credentials files, no instance metadata lookups, no proxy for 127.0.0.1 — and
restores the environment and stops the server on exit, whatever happened. Nothing else is contacted.
Needs ``moto[server]`` (in the ``dev`` extra).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

ENV = {
    "AWS_ACCESS_KEY_ID": "shardkit-test",
    "AWS_SECRET_ACCESS_KEY": "shardkit-test",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}


@contextlib.contextmanager
def local_s3() -> Iterator[str]:
    """Yield the endpoint URL (``http://127.0.0.1:PORT``) of a fresh in-memory S3 server."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    saved = {k: os.environ.get(k) for k in [*ENV, "AWS_ENDPOINT_URL", "AWS_PROFILE", "AWS_SESSION_TOKEN"]}
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        os.environ.update(ENV)
        os.environ["AWS_ENDPOINT_URL"] = endpoint
        os.environ.pop("AWS_PROFILE", None)
        os.environ.pop("AWS_SESSION_TOKEN", None)
        yield endpoint
    finally:
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        with contextlib.suppress(ImportError):  # drop cached s3fs clients bound to the stopped server
            from s3fs import S3FileSystem

            S3FileSystem.clear_instance_cache()


def make_bucket(name: str) -> None:
    """Create bucket ``name`` on the endpoint in ``AWS_ENDPOINT_URL``."""
    import boto3

    boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]).create_bucket(Bucket=name)

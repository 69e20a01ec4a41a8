"""Shared pytest fixtures."""

from __future__ import annotations

import os
import socket

import pytest


@pytest.fixture(scope="session")
def s3_server():
    """A real S3-compatible server (moto) on 127.0.0.1; yields its endpoint URL.

    Credentials and ``AWS_ENDPOINT_URL`` are set in the environment for the session, so
    s3fs/boto clients created by the code under test talk to it without extra options.
    """
    from moto.server import ThreadedMotoServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": endpoint}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

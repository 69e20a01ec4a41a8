"""Shared pytest fixtures, and how the suite is spread over pytest-xdist workers (``-n 2``)."""

from __future__ import annotations

import os
import socket

import pytest

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # Each worker gets one core's share: torch's and BLAS's thread pools sized for the whole
    # machine would fight the other worker's (set before anything imports torch or numpy).
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(_var, "1")


def _module_scoped(item: pytest.Item) -> bool:
    """Whether the test uses a fixture built once per module (or class, or package)."""
    info = getattr(item, "_fixtureinfo", None)
    return bool(info) and any(
        defs and defs[-1].scope in ("module", "class", "package") for defs in info.name2fixturedefs.values()
    )


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Keep a module's tests on one worker when they share a module-scoped fixture, and start
    the slow tests (and those groups) first.

    Under ``--dist loadgroup`` each xdist_group runs on one worker, in collection order; a
    module-scoped fixture (a Ray instance, a trained run) is then built once, not once per worker
    and again each time the worker comes back to that module. Slow tests go first (stably: the
    order inside a module is kept) so that no 100-second test starts while the other worker
    idles at the end (run with ``--no-loadscope-reorder``, as pyproject's addopts do).
    """

    def module(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    grouped = {module(item) for item in items if _module_scoped(item)}
    for item in items:
        if module(item) in grouped:
            item.add_marker(pytest.mark.xdist_group(module(item)))

    def later(item: pytest.Item) -> bool:  # a group is one unit as long as its whole module: it starts early too
        return module(item) not in grouped and item.get_closest_marker("slow") is None

    items.sort(key=later)


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
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }
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

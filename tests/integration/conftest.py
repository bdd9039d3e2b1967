"""Integration fixtures: one real, tiny vLLM server per test session, and load to put on it.

The server comes from `devtools.server` (its own venv, random-weight 2-layer Llama); the first
run on a fresh machine builds that venv (about 1.5 min), later runs reuse it.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from devtools.live_window import SERVER_ENV
from devtools.loadgen import BackgroundLoad
from devtools.loadgen import background_load as _background_load
from devtools.server import VllmServer


@pytest.fixture(scope="session")
def vllm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    """A started vLLM server, stopped (whole process tree) at the end of the session even when
    tests fail. Its log is kept in the session's temporary folder."""
    server = VllmServer(
        log_path=Path(tmp_path_factory.mktemp("vllm")) / "server.log",
        # vLLM's "Avg prompt throughput" line every 2 s, with milliseconds: a snapshot's window
        # holds several to compare with (test_live_snapshot.py, devtools/live_window.py).
        extra_env=SERVER_ENV,
    )
    server.start()  # stops what it started if it fails
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts; all killed afterwards, even when the test fails."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(timeout=10)
        if p.stdout:
            p.stdout.close()


@pytest.fixture
def background_load() -> Callable[..., AbstractContextManager[BackgroundLoad]]:
    """`with background_load(server.base_url, "decode-heavy", 8.0) as load: ...`; after the
    block `load.result` holds the LoadResult (the thread is joined on exit)."""
    return _background_load


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Any test that uses the real server is an integration test, marked or not."""
    for item in items:
        if "vllm_server" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.integration)

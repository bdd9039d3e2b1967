"""`aggregate s3://bucket/prefix` against a real S3 API server on loopback (moto's server, in a
thread of this process): the uploader's layout of two hosts' recorded snapshots, listed and
read through s3fs, the stacks read by DuckDB through the registered filesystem (its httpfs
extension is never loaded). The same report as from the local folders."""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.fleet.report import aggregate
from sidecar.fleet.source import load_fleet
from tests.fleet_layout import FLAME, OTHER_PORT, copy, two_hosts, upload

moto_server = pytest.importorskip("moto.server", reason="moto (the S3 API server) not installed")
pytest.importorskip("s3fs", reason="s3fs (fsspec's S3 driver) not installed")

pytestmark = pytest.mark.integration


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A bucket on a loopback S3 server; credentials and endpoint through the standard
    environment chain, as an operator gives them."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                            "AWS_DEFAULT_REGION": "us-east-1",
                            "AWS_ENDPOINT_URL": f"http://{host}:{port}"}.items():  # fmt: skip
            monkeypatch.setenv(name, value)
        import fsspec

        fs = fsspec.filesystem("s3", skip_instance_cache=True)
        bucket = f"fleet-{uuid.uuid4().hex[:12]}"  # moto's store outlives a server in-process
        fs.mkdir(bucket)
        yield f"s3://{bucket}/vllm-sidecar"
    finally:
        server.stop()


def test_aggregate_reads_s3_as_it_reads_the_folders(
    tmp_path: Path, s3: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import fsspec

    sources = two_hosts(tmp_path)
    copy(FLAME, tmp_path / "out-a" / "host-a", name="20261201T141110Z")
    seen: list[str] = []
    local = aggregate(load_fleet([str(s) for s in sources], seen.append), None, None, seen.append)
    upload(sources, s3, rows_for="host-a", fs=fsspec.filesystem("s3", skip_instance_cache=True))
    notes: list[str] = []
    remote = aggregate(load_fleet([s3], notes.append), None, None, notes.append)
    # per deployment partition: host-b's steady windows and its prefill-heavy deployment's
    rebuilt = sorted(n.split(" rows rebuilt")[0] for n in notes if "rows rebuilt" in n)
    assert rebuilt == ["host-b/tiny@59399: 5", f"host-b/{OTHER_PORT}: 3"]
    assert [d.key for d in remote.deployments] == [d.key for d in local.deployments]
    for role, shares in local.fleet.shares.items():
        assert remote.fleet.shares[role] == pytest.approx(shares, abs=1e-12)
    assert [(o.host, o.deployment) for o in remote.outliers.outliers] == [("host-b", OTHER_PORT)]
    assert remote.frames == local.frames and remote.stacks == (1, 14)
    assert main(["aggregate", s3, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["fleet"]["windows"] == 14


def test_an_empty_prefix_names_the_fix(s3: str) -> None:
    assert main(["aggregate", f"{s3}/nothing-here"]) == 3


def test_a_missing_bucket_names_the_fix(s3: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["aggregate", "s3://no-such-bucket-here/vllm-sidecar"]) == 3
    assert "The specified bucket does not exist): check the bucket" in capsys.readouterr().err


def test_an_unreachable_store_names_the_fix(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1",
                        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    assert main(["aggregate", "s3://fleet/vllm-sidecar"]) == 3
    err = capsys.readouterr().err
    assert "cannot list s3://fleet/vllm-sidecar" in err and "AWS_ENDPOINT_URL" in err

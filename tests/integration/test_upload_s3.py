"""Uploads against a real S3 API server on loopback: moto in server mode (`python -m
moto.server`), a subprocess on a free port, killed and restarted by the tests; s3fs and
botocore as in production (sidecar/store/objectstore.py). The snapshot folders are real ones from
tests/fixtures (tests/upload_store.py); what arrived is read back with boto3 and DuckDB, not
through the code under test."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import duckdb
import pytest
import s3fs

from sidecar.config.settings import Config, UploadConfig
from sidecar.daemon.parts import open_uploader
from sidecar.store.folders import SnapshotStore
from sidecar.store.objectstore import FsspecStore, open_object_store, probe
from sidecar.store.upload import MARKERS_DIR, ROW_NAME, Uploader, UploadStatus, UploadThread
from tests.moto_server import BUCKET, MotoServer
from tests.upload_store import HOST, folder_files, real_output

pytestmark = pytest.mark.integration


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials from the environment, as the AWS chain gives them; no files, no IMDS."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AWS_PROFILE", raising=False)


@pytest.fixture
def moto(tmp_path: Path, aws_env: None) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path / "moto.log")
    server.start()
    try:
        yield server
    finally:
        server.kill()


def upload_config(moto: MotoServer, **kw: Any) -> UploadConfig:
    return UploadConfig(url=f"s3://{BUCKET}/fleet", endpoint_url=moto.url, timeout_s=5, **kw)


def expected(store: SnapshotStore, names: list[str]) -> dict[str, int]:
    """The objects `names` must have become (bucket key -> size of the local file)."""
    out = {}
    for name in names:
        marker = json.loads((store.dir / MARKERS_DIR / f"{name}.json").read_text())
        prefix = marker["url"].removeprefix(f"s3://{BUCKET}/")  # the folder's own, not the
        # destination's (markers name both since issue 26, item 10)
        out.update({f"{prefix}{rel}": size for rel, size in folder_files(store, name).items()})
    return out


def complete(objects: Mapping[str, int]) -> Counter[str]:
    """Snapshot names with their row in the bucket (the row is put last): name -> count."""
    return Counter(k.rsplit("/", 2)[-2] for k in objects if k.endswith("/" + ROW_NAME))


def test_every_folder_arrives_under_hive_partitions_and_duckdb_prunes_by_them(
    tmp_path: Path, moto: MotoServer
) -> None:
    store = real_output(tmp_path / "out")
    uploads = open_uploader(Config(upload=upload_config(moto)), store)
    assert uploads is not None
    assert uploads.uploader.drain() == 12
    names = [e.name for e in store.snapshots()]
    objects = moto.objects()
    assert complete(objects) == Counter({n: 1 for n in names})
    exp = expected(store, names)
    assert {k: objects.get(k) for k in exp} == exp
    assert all(k.startswith(f"fleet/host={HOST}/deployment=") for k in objects)
    # the partitions as a query engine reads them: DuckDB over s3fs, pruning by deployment
    con = duckdb.connect()
    con.register_filesystem(s3fs.S3FileSystem(client_kwargs={"endpoint_url": moto.url}))
    rows = con.sql(
        f"select deployment, cast(date as varchar), count(*) from read_parquet("
        f"'s3://{BUCKET}/fleet/host={HOST}/deployment=tiny@59399/*/*/{ROW_NAME}', "
        f"hive_partitioning=true) group by all"
    ).fetchall()
    assert rows == [("tiny@59399", "2026-12-01", 10)]


class KillMidUpload(FsspecStore):
    """The real s3fs store; before put number `at`, the bucket is listed (what the server's
    first life holds) and the server process is killed: that put and what follows fail."""

    def __init__(self, real: FsspecStore, server: MotoServer, at: int) -> None:
        super().__init__(real.fs, real.root, real.url)
        self.server, self.at, self.puts = server, at, 0
        self.first_life: dict[str, int] | None = None

    def put(self, local: Path, key: str) -> None:
        self.puts += 1
        if self.puts == self.at:
            self.first_life = self.server.objects()
            self.server.kill()
        super().put(local, key)


def test_the_store_going_away_mid_upload_delays_uploads_and_loses_nothing(
    tmp_path: Path, moto: MotoServer
) -> None:
    store = real_output(tmp_path / "out")
    config = upload_config(moto, backoff_s=0.2, backoff_max_s=1.0, retries=0)
    # two flame folders (three files and the row each), then the third folder's summary.json:
    # the kill comes before its row, mid-folder
    remote = KillMidUpload(open_object_store(config), moto, at=4 + 4 + 2)
    uploader = Uploader(store, remote, config.backoff_s, config.backoff_max_s)
    store.set_hold(uploader.held)
    statuses: list[UploadStatus] = []
    failed, drained = threading.Event(), threading.Event()

    def heard(status: UploadStatus) -> None:
        statuses.append(status)
        if status.failures_total >= 2:
            failed.set()  # two tries failed: the thread is backing off, not stuck
        if status.backlog == 0:
            drained.set()

    uploader.on_change = heard
    thread = UploadThread(uploader, poll_s=3600)
    thread.start()
    try:
        assert failed.wait(60), statuses[-3:]
        names = [e.name for e in store.snapshots()]
        confirmed_in_first_life = sorted(p.stem for p in (store.dir / MARKERS_DIR).glob("*.json"))
        assert confirmed_in_first_life == names[:2]
        assert [e.name for e in store.snapshots()] == names  # nothing deleted locally
        assert not drained.is_set()
        moto.start()  # back, empty (moto keeps its state in memory): the bucket made again
        thread.wake()
        assert drained.wait(60), statuses[-3:]
    finally:
        thread.stop()
    assert remote.first_life is not None
    first, second = complete(remote.first_life), complete(moto.objects())
    # each folder arrived once: the two confirmed before the kill in the first life only, the
    # cut third one and the rest in the second, whole; none in both
    assert first == Counter({n: 1 for n in names[:2]})
    assert second == Counter({n: 1 for n in names[2:]})
    exp = expected(store, names[2:])
    second_life = moto.objects()
    assert {k: second_life.get(k) for k in exp} == exp
    cut = [k.rsplit("/", 1)[-1] for k in remote.first_life if f"/{names[2]}/" in k]
    assert cut == ["summary.json"]  # the cut folder's first object reached the first life
    assert len(list((store.dir / MARKERS_DIR).glob("*.json"))) == 12
    assert [e.name for e in store.snapshots()] == names
    last = statuses[-1]
    assert last.backlog == 0 and last.uploaded_total == 12 and last.failures_total >= 2
    assert last.last_success_wall is not None and last.failing is None


def test_doctor_reaches_the_bucket_and_names_what_is_wrong(
    moto: MotoServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    found = probe(upload_config(moto))
    assert found.ok and "credentials from env" in found.detail
    missing = probe(UploadConfig(url="s3://no-such-bucket/p", endpoint_url=moto.url))
    assert not missing.ok and "no-such-bucket" in missing.detail and "bucket name" in missing.fix
    moto.kill()
    down = probe(upload_config(moto, retries=0))
    assert not down.ok and "endpoint_url" in down.fix


def test_the_daemon_uploads_its_windows_and_a_restart_finishes_what_its_stop_cut(
    tmp_path: Path, moto: MotoServer
) -> None:
    """The daemon's real parts (store, uploads) as `run` builds them, its windows from the fake
    collector of the daemon's unit tests (no vLLM here), its clock fake: the windows are written
    faster than the upload thread, in real time, sends them: the test lets it confirm one
    folder between windows, and the stop cuts the backlog."""
    from dataclasses import replace

    from sidecar.config.settings import OutputConfig
    from sidecar.daemon.loop import Daemon
    from sidecar.daemon.parts import Builders
    from sidecar.sampling.pyspy import SubprocessPySpy
    from tests.unit.daemon.test_daemon_loop import CONFIG, INTERVAL, T0, World, deployment, rules

    output = OutputConfig(dir=tmp_path / "out", retention_days=3650,
                          baseline_retention_days=3650, min_free_mb=0)  # fmt: skip
    config = replace(CONFIG, output=output, upload=upload_config(moto))
    world = World()
    world.start(deployment(100))
    make = Builders(rules=rules, py_spy=lambda path: SubprocessPySpy.find(sys.executable),
                    gpu=lambda enabled: None)  # fmt: skip
    d = Daemon(config, environ={}, clock=world.time.clock, wall_clock=world.time.wall,
               wait=world.wait, builders=make, find_target=world.find, alive=world.alive,
               make_collector=world.collector)  # fmt: skip
    world.daemon = d

    def first_upload_confirmed() -> None:  # in real time: the thread's first folder
        deadline = time.monotonic() + 30
        while (status := d.state.view.upload) is None or status.uploaded_total < 1:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)

    world.time.at(T0 + INTERVAL + 30, first_upload_confirmed)  # between windows 2 and 3
    world.stop_at(T0 + 3 * INTERVAL + 30)
    d.serve()
    store = d.parts.store
    assert isinstance(store, SnapshotStore)
    names = [e.name for e in store.snapshots()]
    status = d.state.view.upload
    assert len(names) == 4 and status is not None and status.uploaded_total >= 1
    assert status.failures_total == 0
    # a restart: what the stop left drains; every window arrives once, all still on disk
    again = open_uploader(config, SnapshotStore(output.dir, store.host, store.retention))
    assert again is not None
    again.uploader.drain()
    assert complete(moto.objects()) == Counter({n: 1 for n in names})
    assert [e.name for e in store.snapshots()] == names

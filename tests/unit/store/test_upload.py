"""Uploads to object storage (sidecar/store/upload.py) over fsspec's in-memory filesystem, a real
fsspec implementation; real snapshot folders from tests/fixtures (tests/upload_store.py). The
outages are a seam around that filesystem that refuses, as a store that is down does."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import fsspec
import pyarrow.parquet as pq
import pytest

from sidecar.config.load import load_config
from sidecar.config.settings import UploadConfig
from sidecar.errors import ConfigError
from sidecar.exporter import ExporterState, SidecarCollector
from sidecar.store.folders import Retention, SnapshotStore
from sidecar.store.layout import SnapshotKind
from sidecar.store.objectstore import FsspecStore, probe
from sidecar.store.trend_table import COMPACT_EVERY, TrendTable
from sidecar.store.upload import (
    MARKERS_DIR,
    ROW_NAME,
    Uploader,
    UploadStatus,
    UploadThread,
    partition_prefix,
    stop_all,
)
from tests.upload_store import HOST, folder_files, real_output

DEPLOYED = "deployment=tiny@59399/date=2026-12-01"


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Remote(FsspecStore):
    """fsspec's memory filesystem under a fresh root; records each put; `down` refuses puts
    (and listings) as a store that went away does; `short` stores one byte less."""

    def __init__(self) -> None:
        root = f"/bucket-{uuid.uuid4().hex[:8]}/profiles"
        super().__init__(fsspec.filesystem("memory"), root, "s3://bucket/profiles")
        self.puts: list[str] = []
        self.down = self.short = False
        self.fail_after: int | None = None  # refuse every put after this many

    def put(self, local: Path, key: str) -> None:
        if self.down or (self.fail_after is not None and len(self.puts) >= self.fail_after):
            raise ConnectionRefusedError(111, "Connection refused")
        data = local.read_bytes()
        self.fs.pipe_file(f"{self.root}/{key}", data[:-1] if self.short else data)
        self.puts.append(key)

    def sizes(self, prefix: str) -> Mapping[str, int]:
        if self.down:
            raise ConnectionRefusedError(111, "Connection refused")
        return super().sizes(prefix)

    def folders(self) -> Counter[str]:
        """Complete remote folders (with their row, put last): prefix -> how many."""
        return Counter(k.rsplit("/", 1)[0] for k in self.sizes("") if k.endswith(ROW_NAME))


def write_empty(store: SnapshotStore, now: float) -> tuple[str, ...]:
    """A snapshot of an empty window written at NOW; the folders retention deleted for it."""
    from sidecar.records.window import Window
    from sidecar.window.snapshot import build_snapshot
    from tests.unit.store.test_store import classifier

    window = Window(started_at=now, duration_s=8.0, rate_hz=5.0, stacks=(), samples=0,
                    errors=0, sampler_cpu_s=0.0, segments=1)  # fmt: skip
    return store.write(
        build_snapshot(window, (), classifier(), host=HOST), SnapshotKind.SNAPSHOT
    ).deleted


@pytest.fixture
def store(tmp_path: Path) -> SnapshotStore:
    return real_output(tmp_path / "out")


def uploader(store: SnapshotStore, remote: Remote, clock: Clock | None = None) -> Uploader:
    return Uploader(store, remote, backoff_s=5, backoff_max_s=40, clock=clock or Clock(),
                    wall_clock=lambda: 1_800_000_000.0)  # fmt: skip


# ---------------------------------------------------------------- layout, confirmation


def test_each_folder_lands_under_host_deployment_date_with_its_row_last(
    store: SnapshotStore,
) -> None:
    remote = Remote()
    up = uploader(store, remote)
    assert up.drain() == 12
    names = [e.name for e in store.snapshots()]
    keys = remote.sizes("")
    for name in names:
        deployment = "deployment=unknown" if name < "20261201T1444" else "deployment=tiny@59399"
        prefix = f"host={HOST}/{deployment}/date=2026-12-01/{name}"
        local = folder_files(store, name)
        for rel, size in local.items():
            assert keys[f"{prefix}/{rel}"] == size
        mine = [k for k in remote.puts if k.startswith(prefix + "/")]
        assert mine[-2:] == [f"{prefix}/summary.json", f"{prefix}/{ROW_NAME}"]
        assert len(mine) == len(local) + 1
        marker = json.loads((store.dir / MARKERS_DIR / f"{name}.json").read_text())
        assert marker["url"] == f"s3://bucket/profiles/{prefix}/"
        assert marker["objects"] == len(local) + 1
    # the row is the trend table's, one row naming its folder
    row = remote.fs.cat_file(f"{remote.root}/host={HOST}/{DEPLOYED}/{names[5]}/{ROW_NAME}")
    table = pq.read_table(__import__("io").BytesIO(row))
    assert table.num_rows == 1 and table["name"].to_pylist() == [names[5]]
    assert up.status() == UploadStatus(0, 12, 0, 1_800_000_000.0, None)
    assert [e.name for e in store.snapshots()] == names  # nothing deleted by the upload


def test_partition_values_are_percent_encoded_and_a_missing_deployment_is_unknown() -> None:
    started = 1_796_083_200.0  # 2026-12-01T00:00:00Z
    assert partition_prefix("h", "meta-llama/Llama-3.1-8B@8000", started) == (
        "host=h/deployment=meta-llama%2FLlama-3.1-8B@8000/date=2026-12-01"
    )
    assert partition_prefix("h", None, started - 1) == "host=h/deployment=unknown/date=2026-11-30"


def test_a_short_object_is_not_confirmed(store: SnapshotStore) -> None:
    remote = Remote()
    remote.short = True
    up = uploader(store, remote)
    assert up.step() is False
    assert list((store.dir / MARKERS_DIR).glob("*.json")) == []
    status = up.status()
    assert status.backlog == 12 and status.failures_total == 1
    assert status.failing is not None and "expected" in status.failing


def test_a_row_compacted_into_the_main_table_is_still_uploaded(tmp_path: Path) -> None:
    store = real_output(tmp_path / "out")
    TrendTable(store.dir).compact()  # as after COMPACT_EVERY writes: the parts are gone
    assert COMPACT_EVERY > 12 and TrendTable(store.dir).parts() == []
    remote = Remote()
    assert uploader(store, remote).drain() == 12
    assert len(remote.folders()) == 12


# ---------------------------------------------------------------- outages, order, backoff


def test_an_outage_backs_off_doubling_and_the_backlog_drains_in_order_after(
    store: SnapshotStore, caplog: pytest.LogCaptureFixture
) -> None:
    remote, clock = Remote(), Clock()
    up = uploader(store, remote, clock)
    remote.down = True
    waits = []
    for _ in range(5):
        assert up.step() is False
        waits.append(up.wait_s())
        assert up.step() is False  # backing off: nothing tried
        clock.now += up.wait_s()
    assert waits == [5, 10, 20, 40, 40]
    [warning] = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert "nothing is deleted locally" in warning and "vllm-sidecar doctor" in warning
    assert up.failures_total == 5 and up.status().backlog == 12
    remote.down = False
    assert up.drain() == 12
    order = list(dict.fromkeys(k.rsplit("/", 2)[-2] for k in remote.puts))
    assert order == [e.name for e in store.snapshots()]  # oldest first
    assert up.wait_s() == 0 and up.status().failing is None


def test_retention_keeps_what_is_not_uploaded_and_deletes_it_once_confirmed(
    tmp_path: Path,
) -> None:

    now = 1_796_200_000.0  # 2026-12-02T08:26:40Z: the fixtures are over a day old
    store = real_output(tmp_path / "out", Retention(3600, 3600, None, 0), clock=lambda: now)
    remote, clock = Remote(), Clock()
    up = uploader(store, remote, clock)
    store.set_hold(up.held)
    remote.fail_after = 4 + 4  # the two flame folders (three files and the row), then refused

    def write() -> tuple[str, ...]:
        return write_empty(store, now)

    assert write() == ()  # nothing uploaded yet: every expired folder is held
    up.drain()
    assert up.uploaded_total == 2
    deleted = write()
    assert len(deleted) == 2 and all(not (store.dir / n).exists() for n in deleted)
    remote.fail_after = None
    clock.now += up.wait_s()  # the backoff over
    up.drain()
    assert len(write()) == 10
    assert [e.name for e in store.snapshots()] == sorted(p.name for p in store.dir.glob("2*"))


def test_a_restart_resumes_the_backlog_and_redoes_a_cut_folder_whole(tmp_path: Path) -> None:
    store = real_output(tmp_path / "out")
    remote = Remote()
    first = uploader(store, remote)
    puts_before_stop = 4 + 4 + 1  # two flame folders, and one object of the third
    assert first.drain(stop=lambda: len(remote.puts) >= puts_before_stop) == 2
    # a new process: a new store and uploader over the same disk
    again = SnapshotStore(tmp_path / "out", HOST, store.retention)
    second = uploader(again, remote)
    assert second.status().backlog == 10
    assert second.drain() == 10
    assert set(remote.folders().values()) == {1} and len(remote.folders()) == 12
    third = remote.puts[puts_before_stop - 1]
    assert remote.puts.count(third) == 2  # the cut folder's first object, put again
    assert len(list((store.dir / MARKERS_DIR).glob("*.json"))) == 12
    assert first.failures_total == 0  # a stop is no failure


def test_a_folder_deleted_by_hand_leaves_the_backlog(store: SnapshotStore) -> None:
    import shutil

    oldest = store.snapshots()[0]
    shutil.rmtree(oldest.path)
    remote = Remote()
    up = uploader(store, remote)
    assert up.drain() == 12  # 11 uploaded, one gone
    assert up.uploaded_total == 11 and up.failures_total == 0 and up.status().backlog == 0


# ---------------------------------------------------------------- the destination a marker names


def moved(url: str = "s3://bucket/profiles", endpoint_url: str | None = None) -> Remote:
    """A Remote whose configured upload.url and upload.endpoint_url are these."""
    remote = Remote()
    remote.url, remote.endpoint_url = url, endpoint_url
    return remote


@pytest.mark.parametrize(
    ("url", "endpoint_url"),
    [
        ("s3://other-bucket/profiles", None),
        ("s3://bucket/profiles/fleet-b", None),
        ("s3://bucket/profiles", "http://minio.internal:9000"),
    ],
    ids=["bucket", "prefix", "endpoint"],
)
def test_folders_confirmed_for_another_destination_are_sent_again_and_held_until_then(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, url: str, endpoint_url: str | None
) -> None:
    """Issue 26, item 10: after upload.url changed, the markers of the old bucket kept every
    folder out of the backlog for the new one, and retention deleted them unsent."""

    now = 1_796_200_000.0  # 2026-12-02T08:26:40Z: the fixtures are over a day old
    store = real_output(tmp_path / "out", Retention(3600, 3600, None, 0), clock=lambda: now)
    assert uploader(store, moved()).drain() == 12  # every folder confirmed for the old bucket
    remote, clock = moved(url, endpoint_url), Clock()
    up = uploader(store, remote, clock)
    store.set_hold(up.held)

    def write() -> tuple[str, ...]:
        return write_empty(store, now)

    assert up.status().backlog == 12 and all(up.held(e.name) for e in store.snapshots())
    remote.down = True  # the new bucket is unreachable: nothing may go
    with caplog.at_level("INFO", logger="vllm_sidecar"):
        assert up.drain() == 0
    assert any("12 snapshot folders were uploaded to another destination" in r.getMessage()
               for r in caplog.records)  # fmt: skip
    assert write() == ()
    remote.down = False
    clock.now += up.wait_s()
    assert up.drain() == 13  # the twelve, and the folder just written
    assert len(remote.folders()) == 13
    marker = json.loads(next((store.dir / MARKERS_DIR).glob("*.json")).read_text())
    assert marker["destination"] == {"url": url, "endpoint_url": endpoint_url}
    assert len(write()) == 12  # sent to the new destination: retention may delete them now
    assert uploader(store, moved()).status().backlog == 2  # the old one lacks the newest two


def test_markers_of_earlier_versions_still_confirm_for_the_url_they_name(
    store: SnapshotStore,
) -> None:
    """Snapshots live for months: the markers written before destinations were recorded must
    still read. Theirs is the folder's URL, `<upload.url>/host=.../<snapshot>/`."""
    assert uploader(store, moved()).drain() == 12
    markers = sorted((store.dir / MARKERS_DIR).glob("*.json"))
    for path in markers:  # as earlier versions wrote them: no `destination`
        doc = json.loads(path.read_text())
        del doc["destination"]
        assert set(doc) == {"url", "objects", "bytes", "uploaded_at"}
        path.write_text(json.dumps(doc, indent=2) + "\n")
    markers[0].write_text('{"gone": true}\n')  # a folder deleted by hand: gone for any bucket
    markers[1].write_text("{not json")  # unreadable: confirms nothing, the folder is sent again
    same = uploader(store, moved("s3://bucket/profiles/"))  # a trailing slash is the same place
    assert [e.name for e in same.backlog()] == [markers[1].stem]
    other = uploader(store, moved("s3://other-bucket/profiles"))
    assert other.status().backlog == 11
    assert not other.held(markers[0].stem) and other.held(markers[2].stem)


def test_the_thread_drains_on_wake_and_stops(store: SnapshotStore) -> None:
    remote = Remote()
    up = uploader(store, remote)
    drained = threading.Event()
    up.on_change = lambda status: drained.set() if status.backlog == 0 else None
    thread = UploadThread(up, poll_s=3600)
    thread.start()
    try:
        assert drained.wait(30)
    finally:
        thread.stop()
    assert len(remote.folders()) == 12


def test_stop_all_asks_every_thread_then_waits_and_returns_none_running(tmp_path: Path) -> None:
    """Real threads over two stores: both asked, both ended within the one wait."""
    threads = [UploadThread(uploader(real_output(tmp_path / name), Remote()), poll_s=3600)
               for name in ("a", "b")]  # fmt: skip
    for thread in threads:
        thread.start()
    assert stop_all(threads) == []
    assert all(thread.join(0) for thread in threads)
    assert UploadThread(uploader(real_output(tmp_path / "c"), Remote())).join(0)  # never started


class RowHeld(Remote):
    """Holds the first row's put (staged in `.uploads/.upload-*`) until `release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.reached, self.release = threading.Event(), threading.Event()

    def put(self, local: Path, key: str) -> None:
        if key.endswith(ROW_NAME) and not self.release.is_set():
            self.reached.set()
            assert self.release.wait(30)
        super().put(local, key)


def test_a_reload_opening_a_new_uploader_leaves_the_running_threads_staging_alone(
    store: SnapshotStore,
) -> None:
    """The reload race: the running thread has staged a row and is putting it when SIGHUP
    opens the new config's uploader. Opening it touches nothing on disk, so the row is put and
    the folder confirmed without a failure; the staging goes when the new thread starts."""
    from sidecar.config.settings import Config
    from sidecar.daemon.parts import open_uploader

    remote = RowHeld()
    up = uploader(store, remote)
    confirmed = threading.Event()
    up.on_change = lambda status: confirmed.set() if status.uploaded_total else None
    thread = UploadThread(up, poll_s=3600)
    thread.start()
    try:
        assert remote.reached.wait(30)
        staged = list((store.dir / MARKERS_DIR).glob(".upload-*/" + ROW_NAME))
        assert len(staged) == 1
        new = open_uploader(Config(upload=UploadConfig(url="s3://bucket/p")), store)  # s3fs: no I/O
        assert new is not None and staged[0].is_file()
        remote.release.set()
        assert confirmed.wait(30)
    finally:
        remote.release.set()
        thread.stop()
    assert up.failures_total == 0 and up.uploaded_total >= 1


def test_a_starting_thread_removes_stale_staging_unless_told_another_may_use_it(
    store: SnapshotStore,
) -> None:
    stale = store.dir / MARKERS_DIR / ".upload-killed"
    stale.mkdir(parents=True)
    (stale / ROW_NAME).write_bytes(b"row of a killed uploader")
    thread = UploadThread(uploader(store, Remote()), poll_s=3600)
    thread.start(clean_staging=False)  # a reload's old thread is still busy: left alone
    thread.stop()
    assert stale.is_dir()
    thread = UploadThread(uploader(store, Remote()), poll_s=3600)
    thread.start()
    thread.stop()
    assert not stale.exists()


# ---------------------------------------------------------------- config, exporter, doctor


@pytest.mark.parametrize(
    ("text", "env", "message"),
    [
        (
            "upload:\n  url: s3://b/p\n  aws_secret_access_key: abc\n",
            {},
            "upload.aws_secret_access_key: refused",
        ),
        ("upload:\n  url: s3://b/p\n  key: abc\n", {}, "upload.key: refused"),
        ("", {"VLLM_SIDECAR_UPLOAD_SECRET": "abc"}, "VLLM_SIDECAR_UPLOAD_SECRET: refused"),
        ("upload:\n  url: s3://AKIA:sekrit@b/p\n", {}, "holds credentials"),
        (
            "upload:\n  url: s3://b/p\n  endpoint_url: http://AKIA:sekrit@minio:9000\n",
            {},
            "holds credentials",
        ),
        ("upload:\n  url: /var/profiles\n", {}, "is not an s3://bucket/prefix URL"),
        ("upload:\n  url: s3://b/p\n  backoff_s: 1m\n  backoff_max_s: 10s\n", {}, "backoff_max_s"),
    ],
)
def test_credentials_in_the_config_are_refused_naming_the_aws_chain(
    tmp_path: Path, text: str, env: dict[str, str], message: str
) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message) as caught:
        load_config(path, env)
    assert "sekrit" not in str(caught.value)
    if "refused" in message or "holds credentials" in message:
        assert "AWS" in str(caught.value)


def test_the_upload_settings_and_their_units(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(
        "upload:\n  url: s3://bucket/profiles/\n  endpoint_url: http://127.0.0.1:9000\n"
        "  backoff_s: 2s\n  backoff_max_s: 5m\n  retries: 0\n"
    )
    u = load_config(path, {"VLLM_SIDECAR_UPLOAD_TIMEOUT_S": "3s"}).upload
    assert u == UploadConfig("s3://bucket/profiles", "http://127.0.0.1:9000", 2.0, 300.0, 3.0, 0)


def test_the_exporter_shows_backlog_last_success_and_failures() -> None:
    state = ExporterState(host=HOST, clock=lambda: 0.0)
    names = lambda: {s.name: s for f in SidecarCollector(state).collect() for s in f.samples}  # noqa: E731
    assert not any(n.startswith("vllm_sidecar_upload") for n in names())  # upload.url unset
    state.update_upload(UploadStatus(3, 9, 2, None, "refused"))
    got = names()
    assert got["vllm_sidecar_upload_backlog"].value == 3
    assert got["vllm_sidecar_upload_failures_total"].value == 2
    assert got["vllm_sidecar_snapshots_uploaded_total"].value == 9
    assert "vllm_sidecar_upload_last_success_timestamp_seconds" not in got  # none yet
    state.update_upload(UploadStatus(0, 12, 2, 1_800_000_000.0, None))
    assert names()["vllm_sidecar_upload_last_success_timestamp_seconds"].value == 1_800_000_000.0


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """An environment where botocore's chain finds nothing: no variables, no files, no IMDS."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    yield


def test_doctor_names_the_aws_chain_when_no_credentials_are_found(no_aws: None) -> None:
    found = probe(UploadConfig(url="s3://bucket/p"))
    assert not found.ok and found.detail == "no AWS credentials found"
    assert "AWS_ACCESS_KEY_ID" in found.fix and "instance role" in found.fix


def test_doctor_finds_credentials_in_the_environment_and_lists_the_bucket(
    no_aws: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    from sidecar.store.objectstore import credentials_source

    assert credentials_source() == "env"
    fs: Any = fsspec.filesystem("memory")
    fs.pipe_file("/doctor-bucket/p/x", b"1")
    assert probe(UploadConfig(url="s3://doctor-bucket/p"), fs).ok


def test_without_s3fs_a_config_that_uploads_fails_at_start_naming_the_extra(
    store: SnapshotStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    from sidecar.config.settings import Config
    from sidecar.daemon.parts import open_uploader

    assert open_uploader(Config(), store) is None  # upload.url unset: nothing is imported
    monkeypatch.setitem(sys.modules, "s3fs", None)  # as when the extra is not installed
    with pytest.raises(ConfigError, match=r"pip install 'vllm-sidecar\[s3\]'"):
        open_uploader(Config(upload=UploadConfig(url="s3://bucket/p")), store)

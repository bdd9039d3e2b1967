"""`aggregate`: the fleet report over recorded real snapshots (tests/fixtures/diff, flame)
arranged as two hosts' output folders, read from local folders and through an fsspec
filesystem (in memory, the same code path as s3://). No processes."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import fsspec
import pandas as pd
import pytest

from sidecar.cli import main
from sidecar.errors import ConfigError, InputError
from sidecar.fleet.report import FleetReport, aggregate, render_text, to_json
from sidecar.fleet.source import load_fleet
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary
from tests.fleet_layout import FLAME, OTHER_PORT, PREFILL, STEADY, copy, sync, two_hosts, upload


def _report(sources: list[Path] | list[str], since: datetime | None = None,
            until: datetime | None = None) -> FleetReport:  # fmt: skip
    notes: list[str] = []
    fleet = load_fleet([str(s) for s in sources], notes.append)
    return aggregate(fleet, since, until, notes.append)


def _summaries(tmp: Path) -> list[SnapshotSummary]:
    return [read_summary(p) for p in sorted(tmp.glob("out-*/*/2026*"))]


def test_fleet_shares_are_pooled_samples_not_a_mean_of_shares(tmp_path: Path) -> None:
    report = _report(two_hosts(tmp_path))
    summaries = _summaries(tmp_path)
    assert report.fleet.windows == len(summaries) == 13
    for role in ("api_server", "engine_core", "worker"):
        n = sum(s.role_samples.get(role, 0) for s in summaries)
        assert report.fleet.role_samples[role] == n
        for phase in ("forward", "attention", "model_wait", "idle"):
            hand = sum(s.by_role.get(role, {}).get(phase, 0.0) * s.role_samples.get(role, 0)
                       for s in summaries) / n  # fmt: skip
            got = report.fleet.shares.get(role, {}).get(phase, 0.0)
            assert got == pytest.approx(hand, abs=1e-12), (role, phase)
    # The short window (1,000 samples, no worker) counts for what it sampled: the mean of the
    # windows' shares is another figure.
    mean = sum(s.by_role["engine_core"]["idle"] for s in summaries) / len(summaries)
    assert abs(report.fleet.shares["engine_core"]["idle"] - mean) > 1e-4
    # Per deployment and per host: the same sums over their windows.
    rows = {d.key[:2]: d for d in report.deployments}
    assert {k: d.windows for k, d in rows.items()} == {
        ("host-a", "tiny@59399"): 5, ("host-b", "tiny@59399"): 5, ("host-b", OTHER_PORT): 3}  # fmt: skip
    hosts = {h.key[0]: h for h in report.hosts}
    assert hosts["host-b"].samples == sum(s.samples for s in summaries[5:])
    prefill = [read_summary(p) for p in PREFILL]
    rate = sum(s.serving.generation_tokens_per_s * s.sampling.duration_s for s in prefill) / sum(
        s.sampling.duration_s for s in prefill
    )
    assert rows[("host-b", OTHER_PORT)].figures["generation_tokens_per_s"] == pytest.approx(rate)


def test_a_different_deployment_is_the_outlier_and_the_split_steady_load_is_not(
    tmp_path: Path,
) -> None:
    report = _report(two_hosts(tmp_path))
    found = report.outliers.outliers
    assert [(o.host, o.deployment) for o in found] == [("host-b", OTHER_PORT)]
    odd = found[0]
    assert odd.against == 2 and not odd.pair
    compute = [c for c in odd.changes if c.role == "worker" and c.name == "compute"]
    assert compute and compute[0].change is not None and compute[0].change > 0.10  # points
    assert odd.workload is not None and "prompt tokens per request" in odd.workload
    assert report.outliers.tested > 100 and report.outliers.rounds == 2
    text = render_text(report)
    assert f"[Fleet] Outlier: host-b {OTHER_PORT} against the other 2 deployments" in text
    assert "worker compute up" in text


def test_the_steady_load_split_across_two_hosts_has_no_outlier(tmp_path: Path) -> None:
    report = _report(two_hosts(tmp_path, prefill=False))
    assert report.outliers.outliers == ()
    assert report.outliers.tested > 0
    assert "[Fleet] No outlier" in render_text(report)


def test_the_range_leaves_the_later_deployment_out(tmp_path: Path) -> None:
    until = datetime(2026, 12, 1, 14, 53, tzinfo=UTC)  # the prefill windows start at 14:53:07
    report = _report(two_hosts(tmp_path), until=until)
    assert report.fleet.windows == 10 and report.outliers.outliers == ()
    with pytest.raises(InputError, match="widen --since/--until"):
        _report(two_hosts(tmp_path / "again"), since=datetime(2027, 1, 1, tzinfo=UTC))


def test_another_fingerprint_is_compared_with_no_one(tmp_path: Path) -> None:
    """--max-num-seqs 1 is another fingerprint: alone in its group, named, not an outlier."""
    report = _report(two_hosts(tmp_path, prefill=False, max_seqs=True))
    assert report.outliers.outliers == ()
    assert report.outliers.alone == (("host-a", "tiny@9001"),)
    assert "Alone with their model and fingerprint" in render_text(report)


def test_top_frames_come_from_the_stacks(tmp_path: Path) -> None:
    sources = two_hosts(tmp_path, prefill=False)
    copy(FLAME, tmp_path / "out-a" / "host-a", name="20261201T141110Z")
    report = _report(sources)
    assert report.stacks == (1, 11)
    stacks = pd.read_parquet(FLAME / "stacks.parquet")
    forward = stacks[(stacks.role == "worker") & (stacks.phase == "forward")]
    by_frame = forward.groupby("frame")["weight"].sum().sort_values(ascending=False)
    top = report.frames[("worker", "forward")]
    assert top[0][0] == by_frame.index[0]
    assert top[0][1] == pytest.approx(by_frame.iloc[0] / by_frame.sum())
    assert ("host-a", "?") in report.outliers.unknown  # no fingerprint: not compared
    doc = to_json(report)
    assert doc["frames"] and doc["stacks"] == {"snapshots_with_stacks": 1, "snapshots": 11}


@pytest.fixture
def memory_root() -> Iterator[str]:
    fs = fsspec.filesystem("memory")
    root = f"memory://bucket-{uuid.uuid4().hex[:8]}/fleet"
    yield root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def test_an_fsspec_url_reads_the_same_fleet(tmp_path: Path, memory_root: str) -> None:
    """The route s3:// takes (fsspec, DuckDB reading through the registered filesystem),
    shown with fsspec's in-memory filesystem: the uploader's layout gives the same report as
    the local folders, host-a's rows read from the uploaded row.parquet, host-b's (uploaded
    without rows) rebuilt from the summaries."""
    sources = two_hosts(tmp_path)
    copy(FLAME, tmp_path / "out-a" / "host-a", name="20261201T141110Z")
    local = _report(sources)
    upload(sources, memory_root, rows_for="host-a")
    notes: list[str] = []
    remote = aggregate(load_fleet([memory_root], notes.append), None, None, notes.append)
    assert [n for n in notes if "rebuilt" in n] == [
        f"host-b/{d}: {n} rows rebuilt from their summaries (not saved: the bucket is the "
        "uploader's)"
        for d, n in (("tiny@59399", 5), (OTHER_PORT, 3))
    ]
    for role, shares in local.fleet.shares.items():  # DuckDB sums in parallel: to the ulp
        assert remote.fleet.shares[role] == pytest.approx(shares, abs=1e-12)
    assert [d.key for d in remote.deployments] == [d.key for d in local.deployments]
    assert [(o.host, o.deployment) for o in remote.outliers.outliers] == [("host-b", OTHER_PORT)]
    assert remote.frames == local.frames and remote.stacks == local.stacks


def test_a_synced_output_folder_reads_the_same(tmp_path: Path, memory_root: str) -> None:
    """An output folder copied to a bucket as it is: hosts are its first folders, the rows come
    from each host's snapshots.parquet."""
    sources = two_hosts(tmp_path)
    local = _report(sources)
    sync(sources, memory_root)
    notes: list[str] = []
    remote = aggregate(load_fleet([memory_root], notes.append), None, None, notes.append)
    assert not [n for n in notes if "rebuilt" in n]
    assert [d.key for d in remote.deployments] == [d.key for d in local.deployments]
    assert [(o.host, o.deployment) for o in remote.outliers.outliers] == [("host-b", OTHER_PORT)]


def test_bad_sources_name_the_fix(tmp_path: Path, memory_root: str) -> None:
    with pytest.raises(InputError, match=r"does not exist: give the daemon's output\.dir"):
        load_fleet([str(tmp_path / "nowhere")], print)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no snapshot folders under"):
        load_fleet([str(tmp_path / "empty")], print)
    with pytest.raises(InputError, match=r"no snapshot folders \(\*/summary.json\) under"):
        load_fleet([memory_root], print)
    with pytest.raises(ConfigError, match="cannot read nosuch://x"):
        load_fleet(["nosuch://x"], print)
    with pytest.raises(ConfigError, match="aggregate needs a SOURCE"):
        load_fleet([], print)


def test_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sources = [str(s) for s in two_hosts(tmp_path)]
    assert main(["aggregate", *sources, "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(o["host"], o["deployment"]) for o in doc["outliers"]] == [("host-b", OTHER_PORT)]
    assert doc["fleet"]["windows"] == 13 and doc["method"]["tested"] > 100
    assert main(["aggregate", *sources, "--since", "2026-12-02", "--until", "2026-12-01"]) == 2
    assert "--since is not before --until" in capsys.readouterr().err
    assert main(["aggregate", str(tmp_path / "nowhere")]) == 3
    assert main(["aggregate"]) == 2


def test_two_deployments_that_differ_are_both_named(tmp_path: Path) -> None:
    """With two deployments which one is odd cannot be told: both are named, as a pair."""
    a, b = tmp_path / "out" / "host-a", tmp_path / "out" / "host-b"
    for src in STEADY[:5]:
        copy(src, a)
    for src in PREFILL:
        copy(src, b)
    report = _report([tmp_path / "out"])
    found = report.outliers.outliers
    assert [(o.host, o.pair) for o in found] == [("host-a", True), ("host-b", True)]
    worker = {o.host: next(c for c in o.changes if (c.role, c.name) == ("worker", "compute"))
              for o in found}  # fmt: skip
    assert worker["host-b"].change == pytest.approx(-(worker["host-a"].change or 0))
    assert "a third deployment would tell which is odd" in render_text(report)


def test_a_garbled_stacks_file_names_the_fix(tmp_path: Path) -> None:
    sources = two_hosts(tmp_path, prefill=False)
    copy(FLAME, tmp_path / "out-a" / "host-a", name="20261201T141110Z")
    (tmp_path / "out-a" / "host-a" / "20261201T141110Z" / "stacks.parquet").write_bytes(b"PAR1 no")
    with pytest.raises(
        InputError, match=r"cannot read the stacks .*20261201T141110Z.*: remove or re-upload"
    ):
        _report(sources)


def _fleet_daemon_layout(root: Path) -> Path:
    """A fleet daemon's output (OUT/<host>/<deployment>/, each with an index.json naming the
    host): two deployments whose windows were written in the same second, so their folders
    have the same name."""
    host = root / "out" / "host-x"
    for src, dep in ((STEADY[0], "tiny@8001"), (PREFILL[0], "tiny@8002")):
        folder = host / dep
        folder.mkdir(parents=True)
        (folder / "index.json").write_text(json.dumps({"host": "host-x", "deployment": dep}))
        copy(src, folder, dep, name="20261201T120000Z")
    return root / "out"


def test_two_deployments_writing_in_the_same_second_are_both_read(tmp_path: Path) -> None:
    notes: list[str] = []
    report = aggregate(load_fleet([str(_fleet_daemon_layout(tmp_path))], notes.append), None,
                       None, notes.append)  # fmt: skip
    assert not [n for n in notes if "two sources" in n], notes
    assert report.fleet.windows == 2
    assert sorted((d.key[1], d.windows) for d in report.deployments) == [
        ("tiny@8001", 1), ("tiny@8002", 1)]  # fmt: skip
    steady, prefill = read_summary(STEADY[0]), read_summary(PREFILL[0])
    n = steady.role_samples["worker"] + prefill.role_samples["worker"]
    forward = (steady.by_role["worker"]["forward"] * steady.role_samples["worker"]
               + prefill.by_role["worker"]["forward"] * prefill.role_samples["worker"]) / n  # fmt: skip
    assert report.fleet.shares["worker"]["forward"] == pytest.approx(forward, abs=1e-12)


def test_the_same_in_the_uploaders_layout_keeps_each_deployments_files(
    tmp_path: Path, memory_root: str
) -> None:
    """host=<host>/deployment=<d>/date=<day>/<snapshot>/: the same snapshot name under two
    deployments is two folders, not one folder with files of both."""
    fs = fsspec.filesystem("memory")
    for dep_dir in sorted((_fleet_daemon_layout(tmp_path) / "host-x").iterdir()):
        for folder in dep_dir.iterdir():
            if folder.is_dir():
                prefix = f"{memory_root}/host=host-x/deployment={dep_dir.name}/date=2026-12-01"
                for f in folder.iterdir():
                    fs.pipe(f"{prefix}/{folder.name}/{f.name}", f.read_bytes())
    notes: list[str] = []
    local = _report([tmp_path / "out"])
    remote = aggregate(load_fleet([memory_root], notes.append), None, None, notes.append)
    assert remote.fleet.windows == 2
    assert [d.key for d in remote.deployments] == [d.key for d in local.deployments]
    for role, shares in local.fleet.shares.items():
        assert remote.fleet.shares[role] == pytest.approx(shares, abs=1e-12)


@pytest.mark.parametrize("source", ["ftp://example.invalid/fleet", "http://127.0.0.1:9/x"])
def test_a_scheme_aggregate_does_not_read_is_refused_by_name(source: str) -> None:
    # Issue 26, item 19: `aggregate ftp://...` ended in an internal error (socket.gaierror).
    with pytest.raises(ConfigError, match=r"is not supported \(s3://, s3a://, memory:// are\)"):
        load_fleet([source], lambda _: None)

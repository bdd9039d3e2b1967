"""The Python interface (`sidecar.api`) on recorded snapshot folders: load of every schema
version, the tidy DataFrames against the summary they come from, the report against the CLI's,
save and load back, the store reader against the trend table, and the errors that name the fix.
Taking a snapshot of a live server is tested in tests/integration/test_pyapi_live.py."""

from __future__ import annotations

import configparser
import dataclasses
import html
import shutil
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

import sidecar
from sidecar import Profiler, Snapshot, api, load, snapshots
from sidecar.cli import main
from sidecar.config.load import load_config
from sidecar.config.settings import SNAPSHOT_DEFAULTS
from sidecar.errors import ConfigError, InputError, OutputError
from sidecar.report.text import profile_block
from sidecar.store.summary_io import read_summary
from sidecar.store.trend_table import TABLE_NAME
from tests.unit.report.test_report import summary as built_summary

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCHEMA1 = FIXTURES / "schema1" / "20261201T112537Z"
SCHEMA2 = FIXTURES / "trend" / "schema2" / "20261201T133909Z"
SCHEMA3 = FIXTURES / "trend" / "schema3" / "20261201T140758Z"
FOLDERS = (SCHEMA1, SCHEMA2, SCHEMA3)


@pytest.mark.parametrize("folder", FOLDERS, ids=("schema1", "schema2", "schema3"))
def test_load_reads_every_schema_and_reports_as_the_cli_does(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    snap = load(folder)
    assert isinstance(snap, Snapshot)
    assert snap.path == folder and snap.name == folder.name
    assert snap.summary == read_summary(folder)
    assert main(["report", str(folder)]) == 0
    assert snap.report() + "\n" == capsys.readouterr().out
    assert load(folder / "summary.json").path == folder  # the file names its folder


@pytest.mark.parametrize("folder", FOLDERS, ids=("schema1", "schema2", "schema3"))
def test_computation_breakdown_is_the_summarys_shares(folder: Path) -> None:
    snap = load(folder)
    df = snap.computation_breakdown()
    assert list(df.columns) == ["scope", "role", "phase", "samples", "share_of_role"]
    assert df["samples"].dtype == "Int64" and df["share_of_role"].dtype == "Float64"
    s = snap.summary
    every = df[df["scope"] == "all_threads"]
    assert len(every) == sum(len(shares) for shares in s.by_role.values())
    for row in every.itertuples():
        assert row.share_of_role == s.by_role[row.role][row.phase]
    # the counts behind the shares add up to each role's samples
    assert every.groupby("role")["samples"].sum().to_dict() == pytest.approx(
        dict(s.role_samples), abs=len(every)
    )
    main = df[df["scope"] == "main_thread"]
    assert len(main) == sum(len(shares) for shares in s.main_thread.values())
    assert main["samples"].isna().all()
    for _, shares in df.groupby(["scope", "role"])["share_of_role"]:
        assert shares.sum() == pytest.approx(1.0, abs=0.01)


def test_findings_are_the_reports(tmp_path: Path) -> None:
    """The prefill-heavy window's long prompts: the same finding the text report prints."""
    snap = load(FIXTURES / "diff" / "prefill-heavy" / "20261201T145418Z")
    found = snap.findings()
    assert [f.id for f in found] == ["long-prompts-dominate"]
    assert "(long-prompts-dominate)" in snap.report()
    quiet = tmp_path / "advice.yaml"  # an operator's own rules file: none of the packaged rules
    quiet.write_text("version: 1\nrules: []\n")
    assert snap.findings(quiet) == ()


def test_memory_breakdown_on_a_cpu_host() -> None:
    snap = load(SCHEMA3)
    s = snap.summary
    df = snap.memory_breakdown()
    assert list(df.columns) == ["item", "role", "pid", "device", "name", "used_bytes",
                                "total_bytes", "share_of_total"]  # fmt: skip
    assert df["pid"].dtype == "Int64" and df["used_bytes"].dtype == "Int64"
    host = df[df["item"] == "device"].iloc[0]
    assert s.resources.host_memory is not None
    assert host["device"] == "host" and host["total_bytes"] == s.resources.host_memory.total_bytes
    procs = df[df["item"] == "process"]
    assert set(procs["pid"]) == {p.pid for p in s.target.processes}
    assert set(procs["device"]) == {"host"}  # no GPU on this host
    rss = {p.pid: p.rss_bytes for p in s.resources.processes}
    for row in procs.itertuples():
        assert (pd.isna(row.used_bytes) and rss.get(row.pid) is None) or row.used_bytes == rss[
            row.pid
        ]
    (kv,) = df[df["item"] == "kv_cache"].itertuples()
    assert s.kv_cache is not None
    assert kv.used_bytes == s.kv_cache.bytes and kv.share_of_total == s.kv_cache.share
    assert kv.device == "host"


def test_memory_breakdown_with_a_gpu() -> None:
    """An H100 read through the NVML seam (tests/fixtures/nvml/h100_tp1.yaml)."""
    snap = Snapshot(Path("unused"), built_summary(gpu=True, metrics=True))
    df = snap.memory_breakdown()
    gpu = df[(df["item"] == "device") & (df["device"] == "gpu0")].iloc[0]
    (device,) = snap.summary.gpu.devices
    assert gpu["used_bytes"] == device.memory_used_bytes
    assert gpu["share_of_total"] == pytest.approx(
        device.memory_used_bytes / device.memory_total_bytes  # type: ignore[operator]
    )
    assert df[df["item"] == "kv_cache"]["device"].tolist() == ["gpu"]


def test_save_copies_the_folder_and_loads_back(tmp_path: Path) -> None:
    snap = load(SCHEMA3)
    inside = snap.save(tmp_path / "profiles")  # made: the snapshot goes into it
    assert inside == tmp_path / "profiles" / SCHEMA3.name
    assert sorted(p.name for p in inside.iterdir()) == sorted(p.name for p in SCHEMA3.iterdir())
    assert load(inside).summary == snap.summary
    assert snapshots(tmp_path / "profiles")["name"].tolist() == [SCHEMA3.name]  # a store
    named = snap.save(tmp_path / "profiles", name="before-upgrade")
    assert named == tmp_path / "profiles" / "before-upgrade"
    assert load(named).summary == snap.summary
    with pytest.raises(OutputError, match="exists: save to another folder"):
        snap.save(tmp_path / "profiles")
    with pytest.raises(ConfigError, match="a plain folder name"):
        snap.save(tmp_path, name="../elsewhere")
    assert not [p for p in tmp_path.rglob(".*")]  # no temporary left behind


def test_a_temporary_snapshot_folder_goes_with_its_object(tmp_path: Path) -> None:
    folder = tmp_path / "tmp-snap"
    shutil.copytree(SCHEMA3, folder / SCHEMA3.name)
    snap = Snapshot(folder / SCHEMA3.name, read_summary(SCHEMA3), temporary=folder)
    kept = snap.save(tmp_path / "kept")
    del snap
    assert not folder.exists() and (kept / "summary.json").is_file()


def test_stacks_are_the_snapshots_parquet(tmp_path: Path) -> None:
    snap = load(SCHEMA1)
    stacks = snap.stacks()
    assert int(stacks["weight"].sum()) == snap.summary.samples  # frameless reads: in no row
    with pytest.raises(InputError, match=r"no stacks.parquet in .*: this snapshot was kept"):
        load(SCHEMA3).stacks()  # the trend fixtures keep summaries only
    shutil.copytree(SCHEMA1, tmp_path / SCHEMA1.name)
    (tmp_path / SCHEMA1.name / "stacks.parquet").write_text("garbled")
    with pytest.raises(InputError, match=r"cannot read .*stacks.parquet"):
        load(tmp_path / SCHEMA1.name).stacks()


def test_load_errors_name_the_fix(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist: give a snapshot folder"):
        load(tmp_path / "nope")
    with pytest.raises(InputError, match=r"no summary.json in .*: point at a snapshot folder"):
        load(tmp_path)


# ---------------------------------------------------------------------------------- store


def store(tmp_path: Path) -> Path:
    """A daemon's output folder with one host and the three recorded folders in it."""
    host = tmp_path / "out" / "host-a"
    host.mkdir(parents=True)
    for folder in FOLDERS:
        shutil.copytree(folder, host / folder.name)
    return tmp_path / "out"


def test_snapshots_reads_the_table_and_repairs_it(tmp_path: Path) -> None:
    out = store(tmp_path)
    df = snapshots(out)
    assert df["name"].tolist() == [f.name for f in FOLDERS]  # in time order
    assert (out / "host-a" / TABLE_NAME).is_file()  # rebuilt from the summaries and saved
    assert df["path"].tolist() == [str(out / "host-a" / f.name) for f in FOLDERS]
    assert load(df["path"].iloc[2]).summary == read_summary(SCHEMA3)
    s3 = read_summary(SCHEMA3)
    row = df.iloc[2]
    assert row["share.worker.forward"] == s3.by_role["worker"]["forward"]
    assert row["generation_tokens_per_s"] == s3.serving.generation_tokens_per_s
    assert row["host"] == s3.host
    # a folder deleted (retention) leaves the table; the next read drops its row
    shutil.rmtree(out / "host-a" / SCHEMA1.name)
    assert snapshots(out / "host-a")["name"].tolist() == [SCHEMA2.name, SCHEMA3.name]


def test_snapshots_in_a_range(tmp_path: Path) -> None:
    out = store(tmp_path)
    since = snapshots(out, since="2026-12-01T13:00")
    assert since["name"].tolist() == [SCHEMA2.name, SCHEMA3.name]
    until = snapshots(out, until=datetime(2026, 12, 1, 14, 7, 58, tzinfo=UTC))  # exclusive
    assert until["name"].tolist() == [SCHEMA1.name, SCHEMA2.name]
    naive = snapshots(out, since=datetime(2026, 12, 1, 13, 0), until="2026-12-01T14:00")
    assert naive["name"].tolist() == [SCHEMA2.name]  # a naive datetime is UTC
    assert snapshots(out, since="1h").empty  # the fixtures are older than an hour
    assert snapshots(out, kind="baseline").empty


def test_snapshots_errors_name_the_fix(tmp_path: Path) -> None:
    out = store(tmp_path)
    with pytest.raises(ConfigError, match="kind='weekly': give 'all', 'snapshot' or 'baseline'"):
        snapshots(out, kind="weekly")
    with pytest.raises(ConfigError, match="since='yesterday' is neither a duration nor a time"):
        snapshots(out, since="yesterday")
    with pytest.raises(ConfigError, match="until=5: give a duration back"):
        snapshots(out, until=5)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="is not a folder"):
        snapshots(tmp_path / "missing")
    shutil.copytree(out / "host-a", out / "host-b")
    with pytest.raises(InputError, match=r"several hosts: pick one with --host"):
        snapshots(out)
    assert len(snapshots(out, host="host-b")) == 3


# ---------------------------------------------------------------------------------- Profiler


def test_profiler_builds_the_config_the_cli_would() -> None:
    p = Profiler(pid=4100, rate=20, segment="5s", cpu_budget="2%", gpu=False,
                 metrics_url="http://127.0.0.1:8000/metrics")  # fmt: skip
    flags = {"target.pid": "4100", "sampling.rate_hz": "20", "sampling.segment_s": "5s",
             "sampling.cpu_budget": "2%", "gpu": False, "target.discover": False,
             "metrics.url": "http://127.0.0.1:8000/metrics"}  # fmt: skip
    assert p.config == load_config(flags=flags, defaults=SNAPSHOT_DEFAULTS)
    assert Profiler(discover=True).config.target.discover is True
    assert "pid=4100" in repr(p)


def test_profiler_errors_name_the_argument_and_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"name the vLLM server: Profiler\(pid=PID\)"):
        Profiler()
    with pytest.raises(ConfigError, match="not both"):
        Profiler(pid=1, discover=True)
    with pytest.raises(ConfigError, match=r"sampling.rate_hz: 'fast' .*Profiler\(rate=\.\.\.\)"):
        Profiler(pid=1, rate="fast")
    with pytest.raises(ConfigError, match=r"Profiler\(segment=\.\.\.\)"):
        Profiler(pid=1, segment=0)
    with pytest.raises(ConfigError, match="rules"):
        Profiler(pid=1, rules=tmp_path / "missing.yaml")
    p = Profiler(pid=1)
    with pytest.raises(ConfigError, match=r"snapshot\('soon'\): the window"):
        p.snapshot("soon")
    with pytest.raises(ConfigError, match="longer than 0 s"):
        p.snapshot(0)


def test_the_interface_is_on_the_package() -> None:
    assert sidecar.Profiler is Profiler and sidecar.load is load
    with pytest.raises(AttributeError, match="no attribute 'Profiller'"):
        _ = sidecar.Profiller


def test_dir_lists_the_lazy_interface_and_all_names_it() -> None:
    """`dir(sidecar)` (completion, help) lists the API before its first use, and `__all__`
    names the public interface, each name on the package."""
    names = dir(sidecar)
    assert {"Profiler", "Snapshot", "load", "snapshots", "__version__"} <= set(names)
    assert names == sorted(names)
    assert set(sidecar.__all__) == {"Profiler", "Snapshot", "load", "snapshots", "__version__"}
    for name in sidecar.__all__:
        assert hasattr(sidecar, name)


def test_the_package_ships_its_py_typed_marker() -> None:
    """PEP 561: the marker file beside the package, and setup.cfg's package data ships it."""
    root = Path(sidecar.__file__).resolve().parent
    assert (root / "py.typed").is_file()
    config = configparser.ConfigParser()
    config.read(root.parent / "setup.cfg")
    assert config["options.package_data"]["sidecar"].split() == ["py.typed"]


def test_notebook_view_shows_the_profile_block_and_phase_bars() -> None:
    snap = load(SCHEMA3)
    s = snap.summary
    view = snap._repr_html_()
    assert f'<pre style="white-space:pre-wrap">{html.escape(profile_block(s))}</pre>' in view
    assert "[Profile] Computation Time:" in view
    for role, shares in s.by_role.items():
        assert f'data-role="{role}"' in view
        for phase, share in shares.items():
            assert (f'data-phase="{phase}"' in view) == (share > 0)
    assert f"{s.role_samples['engine_core']:,} samples" in view


def test_notebook_view_escapes_every_name() -> None:
    """Roles and phases come from the target and the rules files: none is markup."""
    s = dataclasses.replace(
        read_summary(SCHEMA3),
        name='<b onmouseover="x">',
        by_role={"<script>alert(1)</script>": {'<img src=x onerror="y">': 0.75, "&amp;": 0.0002}},
        role_samples={"<script>alert(1)</script>": 4},
    )
    view = Snapshot(SCHEMA3, s)._repr_html_()
    for raw in ("<script>", "<img", "<b on", 'onerror="y"'):
        assert raw not in view
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in view
    assert "&lt;img src=x onerror=&quot;y&quot;&gt;" in view
    assert "&amp;amp;" in view and "&lt;0.1%" in view
    assert f"width:{round(api.BAR_WIDTH * 0.75)}px" in view
    empty = Snapshot(SCHEMA3, dataclasses.replace(s, by_role={}))._repr_html_()
    assert "No stack samples in this snapshot." in empty

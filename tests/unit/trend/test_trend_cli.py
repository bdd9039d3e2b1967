"""`vllm-sidecar trend` on a small daemon output made of real summaries (schema 1 and 3)
replicated with shifted names and times; the plot's structure, checked on the figure object
before it is saved, and the PNG it writes. No processes."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import matplotlib.image
import pytest
from click.testing import CliRunner
from matplotlib.collections import LineCollection

from sidecar.cli import cli
from sidecar.trend.plot import trend_figure
from sidecar.trend.series import TrendOptions, compute_trend
from sidecar.trend.source import load_table, summary_reader

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCHEMA1 = FIXTURES / "schema1" / "20261201T112537Z" / "summary.json"
SCHEMA3 = FIXTURES / "trend" / "schema3" / "20261201T140758Z" / "summary.json"
T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
STEP = 1800.0  # a snapshot every 30 minutes
PER_STRETCH = 20
BASELINE_EVERY = 4


def _fingerprint(vllm: str) -> dict[str, object]:
    return {"vllm": vllm, "model": "tiny", "serving": {"max_num_seqs": "256"}, "notes": {}}


@pytest.fixture
def out(tmp_path: Path) -> Path:
    """Three stretches: the schema-1 summary (no fingerprint), then the schema-3 one with
    vLLM 0.31.0, then 0.32.0; every 4th folder a baseline."""
    stretches = [
        (json.loads(SCHEMA1.read_text()), None),
        (json.loads(SCHEMA3.read_text()), _fingerprint("0.31.0")),
        (json.loads(SCHEMA3.read_text()), _fingerprint("0.32.0")),
    ]
    host = tmp_path / "out" / "vm"
    i = 0
    for doc, fingerprint in stretches:
        for _ in range(PER_STRETCH):
            when = datetime.fromtimestamp(T0 + STEP * i, tz=UTC)
            kind = "baseline" if i % BASELINE_EVERY == 0 else "snapshot"
            name = when.strftime("%Y%m%dT%H%M%SZ")
            folder = host / (name + ("-baseline" if kind == "baseline" else ""))
            folder.mkdir(parents=True)
            summary = dict(doc, name=name, created_at=when.isoformat(timespec="seconds"),
                           kind=kind)  # fmt: skip
            if fingerprint is not None:
                summary["fingerprint"] = fingerprint
            (folder / "summary.json").write_text(json.dumps(summary))
            i += 1
    return host.parent


def _trend(out: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, ["trend", str(out), "--since", "2026-05-01", *args])
    return result.exit_code, result.stdout, result.stderr


def test_text_names_the_series_their_level_changes_and_the_fingerprint_change(out: Path) -> None:
    code, stdout, stderr = _trend(out)
    assert code == 0, stderr
    assert stderr.startswith("rebuilt the table from 60 summaries in ")
    assert "trend of vm: 60 snapshots (15 baselines)" in stdout
    assert "fingerprint changed at 2026-05-29 16:26: vLLM 0.31.0 -> 0.32.0" in stdout
    # Schema 1's window, then schema 3's: a level change where diff of the windows either
    # side calls it significant, with diff's interval and p; PELT's candidates that diff does
    # not confirm (here: schema 1 counted no tokens, so no rate to test) are named as such.
    line = next(ln for ln in stdout.splitlines() if ln.startswith("share.worker.idle "))
    assert "2026-05-29 06:26 70.8% -> 58.8% (diff: -12.0 pp, -16.3 .. -7.6 pp, p 2.1e-08)" in line
    line = next(ln for ln in stdout.splitlines() if ln.startswith("generation_tokens_per_s "))
    assert line.endswith(" -")
    (summary,) = [ln for ln in stdout.splitlines() if "level changes:" in ln]
    assert summary.startswith(
        "level changes: 7 of 13 candidates, each kept where `vllm-sidecar diff`"
    ), summary
    assert ("  not a change: gen tok/s at 2026-05-29 06:26 609 -> 446: not tested (not "
            "measured on both sides)") in stdout  # fmt: skip
    code, _, stderr = _trend(out)
    assert code == 0 and stderr == ""  # the table is current now: nothing rebuilt


def test_json_and_the_series_option(out: Path) -> None:
    code, stdout, _ = _trend(out, "--format", "json", "--series", "share.worker.*",
                             "--series", "ttft_p95_s", "--kind", "snapshot")  # fmt: skip
    assert code == 0
    doc = json.loads(stdout)
    assert doc["rows"] == 45 and doc["baselines"] == []
    names = [s["name"] for s in doc["series"]]
    assert names[-1] == "ttft_p95_s" and all(n.startswith("share.worker.") for n in names[:-1])
    (ttft,) = [s for s in doc["series"] if s["name"] == "ttft_p95_s"]
    assert len(ttft["candidates"]) == 1 and ttft["candidates"][0]["after"] == pytest.approx(0.232)
    # Each change carries diff's row for it on the windows either side (the baselines left
    # out by --kind snapshot): 15 windows of schema 1 before, the nearest 24 of schema 3 after.
    (idle,) = [s for s in doc["series"] if s["name"] == "share.worker.idle"]
    (change,) = idle["changes"]
    assert change["verdict"] == "significant" and change["note"] is None
    assert len(change["a_windows"]) == 15 and len(change["b_windows"]) == 24
    assert change["tested_in"] == 14  # m: the figures that diff tests (none without spread)
    assert change["diff"]["kind"] == "share" and change["diff"]["significant"] is True
    assert change["diff"]["low"] < change["diff"]["change"] < change["diff"]["high"] < 0
    (forward,) = [s for s in doc["series"] if s["name"] == "share.worker.forward"]
    # significant once the figures without spread left the family (not significant at m = 23)
    assert [c["verdict"] for c in forward["candidates"]] == ["significant"]
    assert len(forward["changes"]) == 1
    assert doc["level_changes"]["tests"] == 5 and doc["level_changes"]["alpha"] == 0.05
    assert 0 < doc["level_changes"]["false_change_bound"] <= 5 * 0.05 / 14
    assert [c["label"] for c in doc["fingerprint_changes"]] == ["vLLM 0.31.0 -> 0.32.0"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--series", "nonsense"], "--series 'nonsense' names no column"),
        (["--until", "2026-05-02"], "no snapshots in the range asked for (60 in all"),
        (["--until", "soon"], "--until 'soon' is neither a duration nor a time"),
    ],
)
def test_bad_options_name_the_fix(out: Path, args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli, ["trend", str(out), "--since", "2026-05-01", *args])
    assert result.exit_code != 0 and message in str(result.exception)


def test_the_figure_has_a_panel_per_role_and_for_serving_with_the_marks(out: Path) -> None:
    table = load_table(out / "vm", note=lambda _: None)
    windows = summary_reader(out / "vm", note=lambda _: None)
    trend = compute_trend(table.to_pandas(), TrendOptions(), host="vm", windows=windows)
    fig = trend_figure(trend)
    titles = [ax.get_title(loc="left") for ax in fig.axes]
    assert [t.split(":")[0] for t in titles[:3]] == ["engine_core", "worker", "api_server"]
    assert titles[3:] == ["throughput (per s)", "latency (ms)"]
    for ax in fig.axes:
        (baselines,) = [c for c in ax.collections if c.get_gid() == "baselines"]
        assert isinstance(baselines, LineCollection) and len(baselines.get_segments()) == 15
        assert len([ln for ln in ax.lines if ln.get_gid() == "fingerprint"]) == 1
        assert len([ln for ln in ax.lines if ln.get_gid() == "points"]) >= 2
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert labels == ["vLLM 0.31.0 -> 0.32.0"]
    (tokens,) = [ln for ln in fig.axes[3].lines if ln.get_label() == "gen tok/s"]
    changes = [ln for ln in fig.axes[3].lines if ln.get_gid() == "changes"]
    assert tokens.get_xydata().shape == (60, 2) and changes == []  # not tested: not drawn
    worker = [ln for ln in fig.axes[1].lines if ln.get_gid() == "changes"]
    # idle, communication and forward (+4.1 pp, +0.05 .. +8.1 pp): these replicated windows
    # leave the serving figures no spread, so they are not tested and the family is smaller
    assert len(worker) == 3


def test_the_plot_option_writes_a_png(out: Path, tmp_path: Path) -> None:
    png = tmp_path / "trend.png"
    code, _, stderr = _trend(out, "--plot", str(png))
    assert code == 0 and f"plot: {png}" in stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width, _ = matplotlib.image.imread(png).shape
    assert width == 1300 and height > 1000  # 13 in x 100 dpi; five panels


def test_a_change_of_serving_flags_is_labelled_by_the_flags_that_changed() -> None:
    import pandas as pd

    from sidecar.trend.series import fingerprint_changes

    times = pd.date_range("2026-11-01", periods=4, freq="5min", tz="UTC")
    rows = pd.DataFrame(
        {"fingerprint": ["", "aaa", "aaa", "bbb"], "vllm": [None, "0.32.0", "0.32.0", "0.32.0"],
         "serving_flags": [None, "max_num_seqs=256 dtype=auto", "max_num_seqs=256 dtype=auto",
                           "max_num_seqs=512 dtype=auto"]},
        index=times,
    )  # fmt: skip
    (change,) = fingerprint_changes(rows)
    assert change.time == times[3] and change.label == "max_num_seqs 256 -> 512"


def test_an_idle_window_without_an_attention_backend_is_no_fingerprint_change() -> None:
    """The backend is read from the window's stacks: None when the window ran no attention."""
    import pandas as pd

    from sidecar.trend.series import fingerprint_changes

    times = pd.date_range("2026-11-01", periods=5, freq="5min", tz="UTC")
    rows = pd.DataFrame(
        {"fingerprint": ["aaa"] * 5, "vllm": ["0.32.0"] * 5,
         "attention_backend": ["CPU_ATTN", None, "CPU_ATTN", None, "FLASH_ATTN"]},
        index=times,
    )  # fmt: skip
    (change,) = fingerprint_changes(rows)
    assert change.time == times[4] and change.label == "attention CPU_ATTN -> FLASH_ATTN"


def test_the_digest_leaves_out_the_attention_backend() -> None:
    from sidecar.records.summary import Fingerprint
    from sidecar.store.trend_table import fingerprint_digest

    busy = Fingerprint(vllm="0.32.0", attention_backend="CPU_ATTN")
    assert fingerprint_digest(busy) == fingerprint_digest(Fingerprint(vllm="0.32.0"))


def test_a_hole_in_the_snapshots_breaks_the_plotted_lines(out: Path) -> None:
    """Six and a half hours without snapshots (13 of the 30-minute folders gone): the lines
    the plot is given hold a NaN across the hole, not a straight line over it."""
    import numpy as np

    folders = sorted((out / "vm").iterdir())
    hole = folders[30:43]
    for folder in hole:
        (folder / "summary.json").unlink()
        folder.rmdir()
    table = load_table(out / "vm", note=lambda _: None)
    trend = compute_trend(table.to_pandas(), TrendOptions(), host="vm")
    fig = trend_figure(trend)
    (tokens,) = [ln for ln in fig.axes[3].lines if ln.get_label() == "gen tok/s"]
    x, y = (np.asarray(v, dtype=float) for v in (tokens.get_xdata(), tokens.get_ydata()))
    assert len(y) == 60 - len(hole) + 1 and np.isnan(y).sum() == 1
    gap = int(np.flatnonzero(np.isnan(y))[0])
    assert x[gap + 1] - x[gap - 1] == pytest.approx((len(hole) + 1) * STEP / 86400)
    for ax in fig.axes:  # every series breaks at the hole, once
        for line in (ln for ln in ax.lines if ln.get_gid() == "points"):
            assert np.isnan(np.asarray(line.get_ydata(), dtype=float)).sum() == 1


def test_with_gaps_breaks_only_where_the_spacing_is_far_above_its_median() -> None:
    import numpy as np
    import pandas as pd

    from sidecar.trend.plot import with_gaps

    times = pd.to_datetime([0, 60, 120, 180, 150 * 60, 150 * 60 + 60, 150 * 60 + 150], unit="s",
                           utc=True)  # fmt: skip
    points = pd.Series(np.arange(7.0), index=times, name="x")
    broken = with_gaps(points)
    assert broken.name == "x" and len(broken) == 8 and broken.isna().sum() == 1
    assert broken.index[4] == times[3] + (times[4] - times[3]) / 2
    assert broken.dropna().equals(points)
    even = pd.Series(np.arange(5.0), index=times[:4].append(times[3:4] + pd.Timedelta("90s")))
    assert with_gaps(even).equals(even)  # 90 s is not three times the 60 s spacing

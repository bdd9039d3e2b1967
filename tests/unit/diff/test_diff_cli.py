"""`vllm-sidecar diff`: choosing the sides, the output forms, the errors (sidecar/diff/sides.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.diff.sides import Range, parse_range, parse_time
from sidecar.errors import ConfigError
from sidecar.store.layout import OutputTree, SnapshotKind

OLD = Path(__file__).resolve().parents[2] / "fixtures" / "schema1" / "20261201T112537Z"
NOW = 1_764_590_400.0  # 2025-12-01T12:00:00Z


def _store(tmp_path: Path, names: list[str]) -> Path:
    """An output root with one host folder holding copies of a real (schema 1) summary."""
    host = tmp_path / "out" / "gpu-host-1"
    for name in names:
        (host / name).mkdir(parents=True)
        shutil.copy(OLD / "summary.json", host / name / "summary.json")
    (host / ".20261201T120000Z.tmp-99").mkdir()  # a writer's leftover is not a snapshot
    return tmp_path / "out"


def test_times_are_iso_utc_or_durations_ago() -> None:
    assert parse_time("2025-12-01T12:00", NOW) == NOW
    assert parse_time("2025-12-01T13:00+01:00", NOW) == NOW
    assert parse_time("2h", NOW) == NOW - 7200
    assert parse_range("3h..1h", NOW) == Range(NOW - 3 * 3600, NOW - 3600)
    assert parse_range("..", NOW) == Range()
    with pytest.raises(ConfigError, match="neither a duration nor a time"):
        parse_time("yesterday", NOW)
    with pytest.raises(ConfigError, match=r"SINCE\.\.UNTIL"):
        parse_range("2h", NOW)


def test_folders_of_an_output_root_in_time_order(tmp_path: Path) -> None:
    root = _store(tmp_path, ["20261201T110000Z", "20261201T100000Z-baseline", "20261201T103000Z"])
    found = OutputTree(root).snapshots()
    assert [f.name for f in found] == [
        "20261201T100000Z-baseline", "20261201T103000Z", "20261201T110000Z",
    ]  # fmt: skip
    assert [f.kind is SnapshotKind.BASELINE for f in found] == [True, False, False]


def test_baseline_compares_the_latest_baseline_with_the_latest_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _store(tmp_path, ["20261201T090000Z-baseline", "20261201T100000Z-baseline",
                             "20261201T101000Z", "20261201T102000Z"])  # fmt: skip
    assert main(["diff", "--baseline", str(root), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["a"]["label"] == "A: baseline 20261201T100000Z-baseline"
    assert out["b"]["label"] == "B: snapshot 20261201T102000Z"
    # schema 1: one unit a window, so nothing can be tested, and the verdict says so
    assert out["method"]["tested"] == 0 and out["significant"] == []
    assert out["verdict"][0].startswith("No significant change")


def test_time_ranges_pick_the_windows_of_each_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _store(tmp_path, ["20261201T100000Z", "20261201T101000Z", "20261201T110000Z"])
    code = main(["diff", f"{root}@2026-12-01T09:00..2026-12-01T10:30",
                 f"{root}@2026-12-01T10:30..", "--format", "json"])  # fmt: skip
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["a"]["snapshots"] == ["20261201T112537Z"] * 2  # the copies keep their own name
    assert len(out["b"]["snapshots"]) == 1
    assert out["a"]["workload"]["windows"] == 2


def test_text_output_has_the_verdict_first_and_every_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["diff", str(OLD), str(OLD)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("[Diff] No significant change")
    for heading in ("[Diff] Workload:", "[Diff] Phase shares per role", "[Diff] CPU seconds per "
                    "1,000 generated tokens", "[Diff] Serving figures:"):  # fmt: skip
        assert heading in text


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["diff", "only-one"], 2, "name two sides"),
        (["diff", "/nonexistent/a", "/nonexistent/b"], 3, "does not exist"),
        (["diff", str(OLD), str(OLD), "--fail-on", "lots"], 2, "--fail-on"),
        (["diff", str(OLD), str(OLD), "--baseline", "."], 2, "not both"),
        (["diff", "{root}@2030-01-01T00:00..", str(OLD)], 3, "no snapshot folders"),
        (["diff", "{root}@soon..", str(OLD)], 2, "neither a duration nor a time"),
        (["diff", "--baseline", "{root}"], 3, "needs a baseline and a snapshot"),
    ],
)
def test_bad_input_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    root = _store(tmp_path, ["20261201T101000Z"])
    assert main([a.replace("{root}", str(root)) for a in argv]) == code
    assert message in capsys.readouterr().err


def test_a_garbled_window_is_skipped_with_a_warning_not_fatal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _store(tmp_path, ["20261201T100000Z", "20261201T101000Z"])
    (root / "gpu-host-1" / "20261201T101000Z" / "summary.json").write_text("{ truncated")
    assert main(["diff", f"{root}@..", str(OLD), "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["a"]["workload"]["windows"] == 1

"""`vllm-sidecar report`'s header (issue 23): which snapshot, when, how long, how sampled, its
caveats before the `[Profile]` blocks; and `report OUT` on an output, host or deployment folder,
which reports the latest snapshot there and names it in the header. Recorded fixture snapshots
only, through the CLI's `main` in-process."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.cli import main
from sidecar.records.summary import SnapshotSummary
from sidecar.report.text import render_report

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
STEADY = FIXTURES / "diff" / "steady-mixed"
SEQS1 = FIXTURES / "diff" / "max-num-seqs-1"
FIRST = STEADY / "20261201T144454Z"  # its py-spy fell 1.0 s behind: one caveat
LATE = "py-spy fell 1.0 s behind (starved of CPU)"


def report(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code = main(["report", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return captured.out


def copy_windows(src: Path, dst: Path, *, baseline: str | None = None) -> None:
    for folder in sorted(src.iterdir()):
        if folder.is_dir():
            name = folder.name + ("-baseline" if folder.name == baseline else "")
            shutil.copytree(folder, dst / name)


def test_the_text_report_opens_with_which_snapshot_when_how_long_and_how_sampled(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = report(capsys, str(FIRST)).splitlines()
    assert lines[:2] == [
        "[Snapshot] 20261201T144454Z: one-shot snapshot (vllm-sidecar snapshot) of tiny@59399 "
        "on host vm",
        "- Window: 2026-12-01 14:44:54 UTC, 30.4 s, sampled at 20 Hz (windows mode)",
    ]
    # the caveats right after the header, before the [Profile] blocks, and not repeated last
    assert lines[2] == "Caveats:" and lines[3].startswith(f"- {LATE}")
    assert lines[4:6] == ["", "[Profile] Memory Usage:"]
    assert sum(LATE in line for line in lines) == 1 and "Caveats:" not in lines[5:]


def test_a_snapshot_without_caveats_goes_from_header_to_profile(
    capsys: pytest.CaptureFixture[str],
) -> None:
    lines = report(capsys, str(FIXTURES / "schema1" / "20261201T112537Z")).splitlines()
    one_shot = "one-shot snapshot (vllm-sidecar snapshot)"
    assert lines[0].startswith(f"[Snapshot] 20261201T112537Z: {one_shot} on host ")
    assert lines[1].startswith("- Window: 2026-12-01 11:25:37 UTC, ")
    assert lines[2:4] == ["", "[Profile] Memory Usage:"] and "Caveats:" not in lines


def test_json_carries_the_header(capsys: pytest.CaptureFixture[str]) -> None:
    data = json.loads(report(capsys, str(FIRST), "--format", "json"))
    assert data["header"] == {
        "kind": "one-shot", "host": "vm", "deployment": "tiny@59399",
        "started": "2026-12-01T14:44:54+00:00", "duration_s": 30.393, "rate_hz": 20.0,
        "mode": "windows",
    }  # fmt: skip


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("level", ["out", "host"])
def test_report_on_an_output_or_host_folder_reports_its_latest_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str, level: str
) -> None:
    """Before: `report OUT` exited 3 ("no summary.json") unless --format html."""
    host = tmp_path / "out" / "vm"
    copy_windows(STEADY, host, baseline="20261201T145212Z")  # the newest, kept as a baseline
    chosen = host / "20261201T145128Z"  # the latest regular snapshot, as the HTML page picks
    path = tmp_path / "out" if level == "out" else host
    out = report(capsys, str(path), "--format", fmt)
    if fmt == "json":
        data = json.loads(out)
        assert data["snapshot"] == chosen.name
        assert data["header"]["source"] == str(chosen)
        assert data["header"]["kind"] == "snapshot"  # from the store's folder name
    else:
        assert out.startswith(f"[Snapshot] {chosen.name}: snapshot of tiny@59399 on host vm\n")
        assert f"\n- Chosen: {chosen} (the latest snapshot in the folder given)\n" in out
        assert "\n[Profile] Memory Usage:\n" in out


def test_a_host_of_several_deployments_reports_the_one_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A daemon with `targets:` writes OUT/<host>/<deployment>/: a deployment folder is read
    as a host folder; OUT or OUT/<host> needs --host to pick one, as `trend` and the page do."""
    host = tmp_path / "out" / "vm"
    copy_windows(STEADY, host / "tiny@59399")
    copy_windows(SEQS1, host / "tiny@9001")
    out = report(capsys, str(host / "tiny@9001"))
    assert out.startswith("[Snapshot] 20261201T145757Z: ")
    assert main(["report", str(tmp_path / "out")]) == 3
    assert "pick one with --host (vm/tiny@59399, vm/tiny@9001)" in capsys.readouterr().err
    out = report(capsys, str(tmp_path / "out"), "--host", "vm/tiny@59399")
    assert out.startswith("[Snapshot] 20261201T145212Z: ")
    out = report(capsys, str(host), "--host", "tiny@59399", "--format", "json")
    assert json.loads(out)["snapshot"] == "20261201T145212Z"


def test_host_does_not_go_with_a_snapshot_folder_and_an_empty_folder_says_what_is_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(FIRST), "--host", "vm"]) == 2
    assert "--host goes with an output folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 3
    assert "no summary.json" in capsys.readouterr().err


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.from_type(SnapshotSummary))
def test_every_typed_summary_has_a_header(s: SnapshotSummary) -> None:
    """Any summary that validates (odd times, NaN rates, no deployment) gets its header."""
    text = render_report(s)
    assert text.startswith(f"[Snapshot] {s.name}: ") and "\n- Window: " in text
    assert "\n\n[Profile] Memory Usage:\n" in text

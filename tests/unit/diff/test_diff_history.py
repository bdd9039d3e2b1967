"""A one-window `diff` tested against the deployment's history (sidecar/analyze/history.py), on the
real windows recorded in tests/fixtures/diff: steady pairs against the other steady windows,
another workload and another serving flag, too little history, `--no-history`, and the loader
that finds the history beside the compared snapshot folders (sidecar/diff/sides.py)."""

from __future__ import annotations

import itertools
import json
import re
import shutil
from pathlib import Path

import pytest

from sidecar.analyze.compare import ALPHA, Side, compare, regressions
from sidecar.analyze.history import MIN_HISTORY, history_for
from sidecar.cli import main
from sidecar.diff.sides import history_of
from sidecar.diff.text import to_json
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "diff"
# Over the 45 steady pairs, one flags anything in CPU, costs or serving against the history (at
# a family-wise 5 % per pair): the partial window 20261201T144549Z against the last window, the
# engine core's CPU x2.6 (in communication). Without stretching a short window's spread
# (history.py), the other partial one, 20261201T144935Z (15 s, a third of the others' length),
# against 20261201T144549Z was a second.
STEADY_HISTORY_FALSE_ALARMS = 1


def windows(kind: str) -> list[SnapshotSummary]:
    return [read_summary(p) for p in sorted((RECORD / kind).iterdir())]


def everything() -> list[SnapshotSummary]:
    return [
        s for kind in ("steady-mixed", "prefill-heavy", "max-num-seqs-1") for s in windows(kind)
    ]


def one_to_one(a: SnapshotSummary, b: SnapshotSummary) -> tuple[Side, Side]:
    return Side("A: a", (a,)), Side("B: b", (b,))


def test_steady_pairs_against_the_other_steady_windows_flag_almost_nothing() -> None:
    """Every pair of the 10 steady windows, one window a side, the rest of the record offered as
    history: the other 8 steady windows are taken (the other workload and flag left out), CPU,
    costs, rates and latencies are tested against them, and nearly no pair flags anything."""
    candidates = everything()
    pairs = list(itertools.combinations(windows("steady-mixed"), 2))
    alarms = []
    for a, b in pairs:
        sides = one_to_one(a, b)
        h = history_for(*sides, candidates)
        assert h.windows == 8 and (h.other_load, h.other_fingerprint) == (3, 3)
        c = compare(*sides, history=h)
        assert len(c.history_tested) >= 16
        assert all(MIN_HISTORY <= (ch.history_windows or 0) <= 8 for ch in c.history_tested)
        found = [(ch.kind, ch.role, ch.name) for ch in c.history_tested if ch.significant]
        if found:
            alarms.append((a.name, b.name, found))
    assert len(alarms) <= ALPHA * len(pairs)
    assert len(alarms) == STEADY_HISTORY_FALSE_ALARMS, alarms


def test_steady_against_prefill_heavy_flags_the_serving_and_cost_changes() -> None:
    """Long prompts, few generated tokens: more requests and prompt tokens a second, far fewer
    generated tokens, so CPU per 1,000 generated tokens up many-fold and the latencies of long
    prompts up; tested against the 9 other steady windows and the 2 other prefill-heavy ones
    (two runs, each its own mean). The workload differs, so none of it gates."""
    steady, prefill = windows("steady-mixed"), windows("prefill-heavy")
    for b in prefill:
        sides = one_to_one(steady[-1], b)
        h = history_for(*sides, everything())
        assert [len(g) for g in h.groups] == [9, 2]
        c = compare(*sides, history=h)
        found = {(ch.kind, ch.role, ch.name): ch for ch in c.significant}
        for name, up in (("requests/s", True), ("prompt tokens/s", True),
                         ("generation tokens/s", False), ("TTFT mean", True)):  # fmt: skip
            change = found[("serving", None, name)].change
            assert change is not None and (change > 1.5 if up else change < 0.2), name
        cost = found[("cost", "worker", "all")]
        assert cost.change is not None and cost.change > 5 and cost.history_windows == 11
        assert c.mix_differs and not regressions(c, 0.10)


def test_a_restart_with_max_num_seqs_1_gates_one_window_against_history(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One window a side, each from its own folder: the history is the other steady windows
    and the other two after the restart; the worker's cost per token and TTFT are regressions
    (without history the same diff does not gate: test_diff_recorded.py)."""
    before, after = (
        sorted((RECORD / "steady-mixed").iterdir())[-1],
        sorted((RECORD / "max-num-seqs-1").iterdir())[0],
    )
    code = main(["diff", str(before), str(after), "--fail-on", "10%", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 10
    names = {(r["kind"], r["role"], r["name"]) for r in out["regressions"]}
    assert ("cost", "worker", "all") in names and ("serving", None, "TTFT mean") in names
    assert all(10 <= r["history_windows"] <= 11 for r in out["regressions"])
    history = out["history"]
    assert history["consulted"] and history["enough"] and history["windows"] == 11
    assert [len(g) for g in history["groups"]] == [9, 2] and history["other_load"] == 0


def test_the_history_caveat_is_said_once(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = sorted((RECORD / "steady-mixed").iterdir())[:2]
    code, text = _run(capsys, str(a), str(b))
    assert code == 0 and "No significant change" in text
    said = [line for line in text.splitlines() if "other windows of this deployment" in line]
    assert len(said) == 1 and re.fullmatch(
        r"Caveat: A and B have one window each: \d+ CPU, traffic, latency and serving figures "
        r"are tested against the spread between 8 other windows of this deployment \(same "
        r"fingerprint, comparable load\) \(they vary between windows more than within one, and "
        r"a side of one window has no spread of its own\)",
        said[0],
    )
    assert (
        "not tested"
        not in text.split("[Diff] CPU time per phase")[1].split("[Diff] CPU milliseconds")[0]
    )
    _, out = _run(capsys, str(a), str(b), "--format", "json")
    doc = json.loads(out)
    assert doc["detectable"]["cpu"] is not None and doc["detectable"]["serving"] is not None
    assert doc["method"]["tested"] > 14 and "history" in doc["method"]
    tested = [ch["history_windows"] for ch in doc["costs"] if ch["low"] is not None]
    assert tested and all(MIN_HISTORY <= n <= 8 for n in tested)


def test_too_little_history_says_what_it_cannot_test(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A host folder of 4 steady windows: 2 compared, 2 left, under the minimum of 5."""
    host = tmp_path / "host"
    for folder in sorted((RECORD / "steady-mixed").iterdir())[:4]:
        shutil.copytree(folder, host / folder.name)
    a, b = sorted(host.iterdir())[:2]
    code, text = _run(capsys, str(a), str(b))
    assert code == 0
    (caveat,) = [line for line in text.splitlines() if "compare two windows or more" in line]
    assert caveat.endswith(
        f"or let the deployment's history grow: testing against it needs {MIN_HISTORY} windows "
        "of this deployment at this load (same fingerprint, comparable load); found 2, 3 more "
        "would do"
    )
    _, out = _run(capsys, str(a), str(b), "--format", "json")
    history = json.loads(out)["history"]
    assert (history["enough"], history["windows"], history["tested"]) == (False, 2, 0)


def test_no_history_turns_it_off(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = sorted((RECORD / "steady-mixed").iterdir())[:2]
    _, out = _run(capsys, str(a), str(b), "--format", "json", "--no-history")
    doc = json.loads(out)
    assert doc["history"]["consulted"] is False and doc["method"]["tested"] == 14
    assert all("--no-history" in ch["note"] for ch in doc["costs"])
    assert sum("--no-history" in line for line in doc["caveats"]) == 1


def test_two_windows_a_side_read_no_history(capsys: pytest.CaptureFixture[str]) -> None:
    folder = RECORD / "steady-mixed"
    _, out = _run(capsys, f"{folder}@..2026-12-01T14:49", f"{folder}@2026-12-01T14:49..",
                  "--format", "json")  # fmt: skip
    assert json.loads(out)["history"] is None


def test_the_loader_reads_the_nearest_windows_beside_the_compared_ones(tmp_path: Path) -> None:
    """Snapshots and baselines of the compared folders' host folder, the compared ones left
    out, the nearest in time first, a garbled one skipped."""
    host = tmp_path / "host"
    steady = sorted((RECORD / "steady-mixed").iterdir())
    for folder in steady:
        shutil.copytree(folder, host / folder.name)
    baseline = host / f"{steady[2].name}-baseline"  # the same seconds as a snapshot: left out
    shutil.copytree(steady[2], baseline)
    doc = json.loads((baseline / "summary.json").read_text())
    (baseline / "summary.json").write_text(json.dumps({**doc, "kind": "baseline"}))
    (host / "20261201T150000Z").mkdir()  # no summary.json: no history
    (host / "notes").mkdir()
    a = Side("A: a", (read_summary(host / steady[0].name),), (host / steady[0].name,))
    b = Side("B: b", (read_summary(host / steady[1].name),), (host / steady[1].name,))
    h = history_of(a, b)
    assert h is not None
    names = {s.name for g in h.groups for s in g}
    assert steady[0].name not in names and steady[1].name not in names
    assert (h.considered, h.overlapping) == (9, 1)  # 8 others, and the baseline
    near = history_of(a, b, limit=3)
    assert near is not None and near.considered == 3
    assert {s.name for g in near.groups for s in g} <= {s.name for s in steady[2:5]} | {
        steady[0].name
    }
    assert history_of(Side("A", a.summaries), Side("B", b.summaries)) == history_for(
        Side("A", a.summaries), Side("B", b.summaries), []
    )


def test_the_json_of_a_diff_without_history_has_the_key(capsys: pytest.CaptureFixture[str]) -> None:
    steady, prefill = windows("steady-mixed"), windows("prefill-heavy")
    doc = to_json(compare(*one_to_one(steady[0], prefill[0])))
    assert doc["history"] is None and all(ch["history_windows"] is None for ch in doc["costs"])


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["diff", *args])
    return code, capsys.readouterr().out

"""`diff` on real windows recorded from the dev vLLM (tests/fixtures/diff, `make record-diff`):
the false-alarm rate on steady load, what another workload and another serving flag show, and
the gate's exit status."""

from __future__ import annotations

import itertools
import json
from datetime import datetime
from pathlib import Path

import pytest

from sidecar.analyze.compare import ALPHA, Side, compare, regressions
from sidecar.cli import main
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "diff"


def windows(kind: str) -> list[tuple[Path, SnapshotSummary]]:
    return [(p, read_summary(p)) for p in sorted((RECORD / kind).iterdir())]


def test_steady_pairs_stay_within_the_stated_false_alarm_rate() -> None:
    """Every pair of windows of one steady `mixed` load is judged "no significant change" at
    the stated family-wise level, and the README's figure is this record's."""
    steady = windows("steady-mixed")
    assert len(steady) >= 8
    pairs = list(itertools.combinations(steady, 2))
    alarms = [
        (a.name, b.name, [(c.role, c.name) for c in comparison.significant])
        for (_, a), (_, b) in pairs
        if (comparison := compare(Side("A", (a,)), Side("B", (b,)))).significant
    ]
    assert len(alarms) / len(pairs) <= ALPHA, alarms
    meta = json.loads((RECORD / "meta.json").read_text())
    assert (meta["steady_false_alarms"], meta["steady_pairs"]) == (len(alarms), len(pairs))


def test_every_steady_window_has_its_segments_and_their_readings() -> None:
    for _, summary in windows("steady-mixed"):
        blocks = summary.sampling.blocks
        assert len(blocks) >= 5 or summary.sampling.partial  # a partial one is kept, and said
        assert sum(b.samples for b in blocks) == summary.samples
        assert all(b.generation_tokens and b.cpu_s.get("worker") for b in blocks)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_long_prompts_show_more_compute_in_the_worker_and_a_changed_workload(index: int) -> None:
    """One window a side: the worker's compute is up significantly; the API server's
    tokenisation is up too, but it is about 1 % of its samples on this tiny model, too few for
    one window to resolve (below: three do)."""
    (_, mixed), (_, prefill) = windows("steady-mixed")[-1], windows("prefill-heavy")[index]
    c = compare(Side("A", (mixed,)), Side("B", (prefill,)))
    found = {(ch.role, ch.name): ch for ch in c.significant}
    compute = found[("worker", "compute")]
    assert compute.change is not None and compute.change > 0.05
    assert c.mix_differs is not None and "prompt tokens per request" in c.mix_differs
    tokenise = next(ch for ch in c.shares if (ch.role, ch.name) == ("api_server",
                                                                      "input_processing"))  # fmt: skip
    assert tokenise.change is not None and tokenise.change > 0
    # one window a side: CPU costs are estimates, never a gate
    assert all(not ch.tested for ch in c.costs) and not regressions(c, 0.10)


def test_over_all_recorded_windows_tokenisation_in_the_api_server_is_up(
    capsys: pytest.CaptureFixture[str],
) -> None:
    steady, prefill = RECORD / "steady-mixed", RECORD / "prefill-heavy"
    assert main(["diff", f"{steady}@..", f"{prefill}@..", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    found = {(c["role"], c["name"]): c for c in out["significant"]}
    assert found[("api_server", "input_processing")]["change"] > 0
    assert found[("worker", "compute")]["change"] > 0
    (significant,) = [line for line in out["verdict"] if line.startswith("Significant: ")]
    assert "worker compute up" in significant
    assert out["workload_differs"] and out["regressions"] == []  # no gate: different work


def test_a_restart_with_max_num_seqs_1_is_named_first_and_fails_the_gate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The windows of each side are the units of the CPU costs and latencies (they vary between
    windows more than within one), so the gate compares time ranges: all steady windows
    against the three after the restart."""
    before, after = RECORD / "steady-mixed", RECORD / "max-num-seqs-1"
    code = main(["diff", f"{before}@..", f"{after}@..", "--fail-on", "10%", "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 10
    assert out["fingerprint"][0] == {"field": "max-num-seqs", "a": "default", "b": "1"}
    assert out["verdict"][0] == "Ran differently: max-num-seqs default \u2192 1."
    names = {(r["kind"], r["role"], r["name"]) for r in out["regressions"]}
    assert ("cost", "worker", "all") in names  # no batching: each token costs the worker more
    assert ("serving", None, "TTFT mean") in names  # and requests queue for the one slot
    assert all(r["change"] > 1.1 and r["significant"] for r in out["regressions"])
    assert all(s.fingerprint is not None for _, s in windows("max-num-seqs-1"))


def test_one_window_a_side_without_history_names_the_flag_but_does_not_gate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """(With the deployment's history it gates: tests/unit/diff/test_diff_history.py.)"""
    (before, _), (after, _) = windows("steady-mixed")[-1], windows("max-num-seqs-1")[0]
    args = [str(before), str(after), "--fail-on", "10%", "--format", "json", "--no-history"]
    assert main(["diff", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"][0] == "Ran differently: max-num-seqs default \u2192 1."
    assert all("one window on a side" in c["note"] for c in out["costs"])


def test_steady_halves_pass_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    """Two time ranges of the same steady load (five windows each): no change, exit 0."""
    steady = windows("steady-mixed")
    mid = datetime.strptime(steady[5][1].name, "%Y%m%dT%H%M%SZ").strftime("%Y-%m-%dT%H:%M:%S")
    folder = RECORD / "steady-mixed"
    code = main(["diff", f"{folder}@..{mid}", f"{folder}@{mid}..", "--fail-on", "10%",
                 "--format", "json"])  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out["verdict"]
    assert out["a"]["workload"]["windows"] == 5 and out["b"]["workload"]["windows"] == 5
    assert out["significant"] == [] and out["method"]["tested"] > 20


def test_a_steady_pair_passes_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    (a, _), (b, _) = windows("steady-mixed")[:2]
    assert main(["diff", str(a), str(b), "--fail-on", "10%"]) == 0
    assert "No significant change" in capsys.readouterr().out

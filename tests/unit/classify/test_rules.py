"""Rules are validated on load: each mistake names the rule and the fix."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from sidecar.classify.rules import load_rules, parse_rules, path_matches
from sidecar.errors import ConfigError
from sidecar.records import Frame

GOOD = """
rules:
  - name: sched
    phase: scheduling
    match:
      - {function: schedule, file: vllm/v1/core/sched/scheduler.py}
"""


def test_minimal_rules_parse() -> None:
    rules = parse_rules(GOOD)
    assert [r.name for r in rules.rules] == ["sched"]
    assert rules.candidates(Frame("schedule", "vllm/v1/core/sched/scheduler.py"))


def test_the_frame_memo_is_per_rule_set_and_never_part_of_its_identity() -> None:
    """A frame's matches are memoised on the rule set itself (hashing one walks every rule, far
    too slow for a per-frame key): equality and hash ignore the memo, and a rule set made from
    another by `replace` starts with its own."""
    used, fresh = parse_rules(GOOD), parse_rules(GOOD)
    frame = Frame(
        "schedule", "/venv/lib/python3.11/site-packages/vllm/v1/core/sched/scheduler.py", 80
    )
    assert used.match(frame).candidates
    assert used == fresh and hash(used) == hash(fresh)
    assert used.match(replace(frame, line=99)) is used.match(frame)  # the line is not part of it
    emptied = replace(used, rules=())
    assert emptied.candidates(frame) == () and used.candidates(frame)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [{name: x, phase: prefil, match: [{function: f}]}]", "rule 'x': phase: unknown value 'prefil'"),
        ("rules: [{name: x, phase: idle, match: [{function_re: '(unclosed'}]}]", "bad regular expression"),
        ("rules: [{name: x, phase: idle, match: [{function: f, flie: a.py}]}]", "unknown frame-spec keys ['flie']"),
        ("rules: [{name: x, phase: idle, match: []}]", "rule 'x': `match:` must be a non-empty list"),
        ("rules: [{name: x, match: [{function: f}]}]", "a phase rule needs `phase:`"),
        ("rules: [{name: x, kind: wait, phase: idle, match: [{function: f}]}]", "a wait rule takes no `phase:`"),
        ("rules: [{name: x, kind: nap, match: [{function: f}]}]", "kind: unknown value 'nap'"),
        ("rules: [{phase: idle, match: [{function: f}]}]", "rule #1 needs a mapping with a `name:`"),
        ("rules: [{name: x, phase: idle, match: [{function: f}]}, {name: x, phase: idle, match: [{function: g}]}]", "repeated: ['x']"),
        ("rules: [{name: x, phase: idle, match: [{file: a.py}]}]", "needs `function:` or `function_re:`"),
        ("rules: [{name: x, phase: idle, stage: both, match: [{function: f}]}]", "stage: unknown value 'both'"),
        ("rules: {}", "expected a mapping with a `rules:` list"),
        ("rules: [\n  - {name: x", "is not valid YAML"),
        ("rules: []\nroles: [{role: gpu, frames: []}]", "role 'gpu': unknown value 'gpu'"),
        # Booleans are YAML booleans: bool("false") is True, so a quoted one is refused.
        ("rules: [{name: x, phase: startup, anywhere: 'false', match: [{function: f}]}]", "rule 'x': `anywhere:` must be true or false (a YAML boolean, unquoted), got 'false'"),
        ("rules: [{name: x, phase: idle, anywhere: 1, match: [{function: f}]}]", "rule 'x': `anywhere:` must be true or false"),
        ("rules: [{name: x, phase: idle, match: [{function: f, native: 'no'}]}]", "rule 'x': `native:` must be true or false"),
        ("rules: [{name: x, phase: idle, match: [{function: f, leaf: 'False'}]}]", "rule 'x': `leaf:` must be true or false"),
        ("rules: [{name: x, phase: idle, match: [{function: f, waiting_only: 'true'}]}]", "rule 'x': `waiting_only:` must be true or false"),
        ("rules: [{name: x, phase: idle, match: [{function: f, under: {function: g, leaf: 'yes'}}]}]", "rule 'x': under: `leaf:` must be true or false"),
        # Titles decide roles in one place, sidecar/target/discovery.py; the rules file gives frames.
        ("rules: []\nroles: [{role: worker, titles: ['^VLLM::Worker']}]", "role 'worker': `titles:` are no longer read from the rules file"),
        ("rules: []\nroles: [{role: worker, frame: []}]", "role 'worker': unknown keys ['frame']"),
    ],
)  # fmt: skip
def test_bad_rules_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_rules(text, source="my.yaml")
    assert message in str(err.value)
    assert "my.yaml" in str(err.value)


def test_booleans_are_read_as_written() -> None:
    text = """
rules:
  - {name: a, phase: startup, anywhere: false, match: [{function: f, native: false, leaf: true}]}
  - {name: b, phase: startup, anywhere: true, match: [{function: g, waiting_only: true}]}
"""
    a, b = parse_rules(text).rules
    assert (a.anywhere, a.specs[0].native, a.specs[0].leaf, a.specs[0].waiting_only) == (
        False, False, True, False
    )  # fmt: skip
    assert (b.anywhere, b.specs[0].native, b.specs[0].waiting_only) == (True, None, True)


def test_missing_rules_file_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="Pass --rules with a readable file"):
        load_rules(tmp_path / "nope.yaml")


def test_default_rules_load_and_name_versions() -> None:
    rules = load_rules()
    assert len(rules.rules) > 20
    phase_rules = [r for r in rules.rules if r.kind.value == "phase"]
    assert all(r.versions for r in phase_rules), "every phase rule names the vLLM versions"


@pytest.mark.parametrize(
    ("path", "glob", "expected"),
    [
        ("vllm/v1/engine/core.py", "vllm/v1/engine/core.py", True),
        ("/usr/lib/python3/dist-packages/vllm/v1/engine/core.py", "vllm/v1/engine/core.py", True),
        ("mythreading.py", "threading.py", False),
        ("/usr/lib/python3.12/threading.py", "threading.py", True),
        ("vllm/v1/attention/backends/flash_attn.py", "vllm/v1/attention/*", True),
        ("notvllm/v1/attention/x.py", "vllm/v1/attention/*", False),
        ("libcudart.so.12", "libcudart*", True),
    ],
)
def test_path_globs_match_on_segment_boundaries(path: str, glob: str, expected: bool) -> None:
    assert path_matches(path, glob) is expected


def test_the_ground_truth_frames_are_data_in_the_rules_file() -> None:
    """Spinning waits and event-loop leaves (sidecar/classify/groundtruth.py) come from `ground_truth:`,
    checked like any frame spec; a file without the section takes the built-in one's."""
    truth = load_rules().ground_truth
    spin = Frame("wait", "vllm/distributed/device_communicators/shm_broadcast.py")
    assert truth.spins([Frame("SpinCondition.wait", spin.file, 120)])
    assert not truth.spins([Frame("acquire_read", spin.file, 400)])
    assert truth.loop_leaf(Frame("Runner.run", "/usr/lib/python3.11/asyncio/runners.py", 118))
    assert truth.loop_leaf(Frame("run", "site-packages/uvloop/__init__.py", 92))
    assert not truth.loop_leaf(Frame("run", "vllm/entrypoints/openai/api_server.py", 10))
    assert parse_rules(GOOD).ground_truth == truth
    own = parse_rules(GOOD + "ground_truth:\n  spin_waits: [{function: my_spin}]\n")
    assert own.ground_truth.spins([Frame("my_spin", "x.py", 1)])
    assert own.ground_truth.loop_leaves == ()
    with pytest.raises(ConfigError, match="ground_truth: unknown keys"):
        parse_rules(GOOD + "ground_truth:\n  spinners: []\n")
    with pytest.raises(ConfigError, match="frame spec needs `function:`"):
        parse_rules(GOOD + "ground_truth:\n  event_loop_leaves: [{file: x.py}]\n")

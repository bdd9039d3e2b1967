"""`vllm-sidecar classify` and `vllm-sidecar rules suggest`: stacks in files to phases."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.tables import json_text, printable


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None,
              help="text (the default) or json; --json is --format json.")  # fmt: skip
@click.option("--explain", is_flag=True,
              help="Per distinct stack (most samples first): role, phase, stage, the rule "
              "and frame that decided, unknown frames. FILES may be snapshots.")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="--explain as text: at most this many stacks (0: all).")  # fmt: skip
@click.option("--rules", type=click.Path(path_type=Path), help="Your own phases.yaml.")
def classify(
    files: tuple[Path, ...],
    as_json: bool,
    fmt: str | None,
    explain: bool,
    limit: int,
    rules: Path | None,
) -> None:
    """Attribute the stacks in dumps, recordings or tracebacks to serving phases."""
    from sidecar.classify.listing import list_stacks

    classifier = Classifier(load_rules(rules))
    as_json = as_json or fmt == "json"
    if explain:
        _explain(classifier, files, as_json, limit)
        return
    listing = list_stacks(classifier, files)
    for w in listing.warnings:
        click.echo(f"warning: {printable(w)}", err=True)
    click.echo(json_text(listing.as_json(), indent=2) if as_json else listing.as_text())


def _explain(classifier: Classifier, files: tuple[Path, ...], as_json: bool, limit: int) -> None:
    from sidecar.classify.explain import as_document, as_text, explain
    from sidecar.store.stacks import read_input

    reads = [read_input(path) for path in files]
    warnings = [w for read in reads for w in read.warnings]
    for w in warnings:
        click.echo(f"warning: {printable(w)}", err=True)
    stacks = [s for read in reads for s in read.stacks]
    explained = explain(classifier, stacks, [r for read in reads for r in read.roles])
    if as_json:
        doc = as_document(explained, classifier.rules.fingerprint, warnings)
        click.echo(json_text(doc, indent=2))
        return
    click.echo(printable(as_text(explained, limit or None)), nl=False)


@click.group("rules")
def rules_group() -> None:
    """Work on the phase rules (configs/phases.yaml)."""


@rules_group.command("suggest")
@click.argument("source", metavar="SNAPSHOT|FILE", type=click.Path(path_type=Path))
@click.option("--rules", type=click.Path(path_type=Path), help="Your own phases.yaml.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many frames to suggest rules for.")  # fmt: skip
@click.option("--no-idle-waits", "idle_waits", is_flag=True, flag_value=False, default=True,
              help="Only `other`: not idle stacks of a wait without context.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)  # fmt: skip
def rules_suggest(source: Path, rules: Path | None, top: int, idle_waits: bool, fmt: str) -> None:
    """The most frequent frames in `other`, each with a rule skeleton to paste into phases.yaml
    (checked: pasted into a copy of the rules file, it loads) and the samples it would move."""
    from sidecar.classify.rules import default_rules_path
    from sidecar.classify.suggest import as_json, as_text, suggest
    from sidecar.store.stacks import read_input

    path = rules or default_rules_path()
    ruleset = load_rules(path)
    read = read_input(source)
    for w in read.warnings:
        click.echo(f"warning: {printable(w)}", err=True)
    total = sum(s.weight for s in read.stacks)
    text = path.read_text(encoding="utf-8")
    found = suggest(Classifier(ruleset), read.stacks, read.roles,
                    rules_text=text, top=top, idle_waits=idle_waits)  # fmt: skip
    if fmt == "json":
        click.echo(json_text(as_json(found, ruleset.fingerprint, total), indent=2))
        return
    click.echo(printable(as_text(found, total)), nl=False)

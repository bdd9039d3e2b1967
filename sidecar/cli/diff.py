"""`vllm-sidecar diff`: what changed from A to B, and whether it is real; exit 10
(`ExitStatus.REGRESSION`) on a significant regression beyond `--fail-on`."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli.options import HELP
from sidecar.config import units
from sidecar.errors import ConfigError, ExitStatus
from sidecar.tables import json_text


@click.command()
@click.argument("sides", nargs=-1, metavar="A B")
@click.option(
    "--baseline",
    "baseline_of",
    type=click.Path(path_type=Path),
    metavar="OUT",
    help="Compare the latest baseline with the latest snapshot under OUT.",
)
@click.option("--since", help="Folder sides start here: ISO time (UTC) or ago (2h, 7d).")
@click.option("--until", help="Folder sides end here (exclusive).")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
@click.option(
    "--fail-on",
    metavar="SHARE",
    help="Exit 10 on a significant regression beyond this, e.g. 10% (a CPU cost "
    "per 1,000 generated tokens, or a latency tested over windows).",
)
@click.option("--advice", type=click.Path(path_type=Path), help=HELP["advice"])
@click.option(
    "--no-history",
    is_flag=True,
    help="Do not test a one-window side against the deployment's other windows (same "
    "fingerprint, comparable load): its CPU, traffic and latencies are then not tested, and "
    "the diff depends on A and B alone.",
)
def diff(sides: tuple[str, ...], baseline_of: Path | None, since: str | None,
         until: str | None, fmt: str, fail_on: str | None,
         advice: Path | None, no_history: bool) -> ExitStatus:  # fmt: skip
    """What changed from A to B, and is it real? A and B: snapshot folders, or output folders
    narrowed to a time range (PATH@SINCE..UNTIL, or --since/--until)."""
    from sidecar.advice.findings import finding_changes
    from sidecar.advice.rules import load_advice
    from sidecar.analyze.compare import compare
    from sidecar.analyze.history import NO_HISTORY
    from sidecar.diff.sides import Range, baseline_sides, history_of, now, parse_time, side_from
    from sidecar.diff.text import gate, render_text
    from sidecar.diff.text import to_json as diff_json

    threshold = None
    if fail_on is not None:
        try:
            threshold = units.SHARE.parse(fail_on)
        except units.Unfit as exc:
            raise ConfigError(f"--fail-on {fail_on!r} {exc}: {units.SHARE.hint}") from None
    if baseline_of is not None:
        if sides:
            raise ConfigError("give A B or --baseline OUT, not both")
        a, b = baseline_sides(baseline_of)
    else:
        if len(sides) != 2:
            raise ConfigError(
                "name two sides: `vllm-sidecar diff A B` (snapshot folders, or output folders "
                "with --since/--until or PATH@SINCE..UNTIL), or `--baseline OUT`"
            )
        t = now()
        default = Range(parse_time(since, t) if since else None,
                        parse_time(until, t) if until else None)  # fmt: skip
        a, b = (side_from(spec, default, t, label) for spec, label in zip(sides, "AB", strict=True))
    rules = load_advice(advice) if advice is not None else None
    comparison = compare(a, b, history=NO_HISTORY if no_history else history_of(a, b))
    failed = gate(comparison, threshold)
    found = finding_changes(a.summaries, b.summaries, rules)
    if fmt == "json":
        click.echo(json_text(diff_json(comparison, failed, found), indent=2))
    else:
        click.echo(render_text(comparison, failed, found, threshold))
    return ExitStatus.REGRESSION if failed else ExitStatus.OK

"""`vllm-sidecar aggregate`: the fleet over many hosts' snapshots, local or in object storage."""

from __future__ import annotations

import click

from sidecar.cli.options import when
from sidecar.errors import ConfigError
from sidecar.tables import json_text


@click.command()
@click.argument("sources", nargs=-1, metavar="SOURCE...")
@click.option(
    "--since",
    default=None,
    metavar="DURATION|TIME",
    help="From this long before --until (7d, 12h), or from a UTC time; default: all.",
)
@click.option(
    "--until",
    default=None,
    metavar="DURATION|TIME",
    help="Up to this long ago (1d), or a UTC time; default: now.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)  # fmt: skip
def aggregate(sources: tuple[str, ...], since: str | None, until: str | None, fmt: str) -> None:
    """The fleet: phase shares, deployments, hosts and outliers over many hosts' snapshots.
    SOURCE: an output folder (a host folder per host), one host folder, or s3://bucket/prefix."""
    import time as _time

    from sidecar.fleet.report import aggregate as fleet_report
    from sidecar.fleet.report import render_text as fleet_text
    from sidecar.fleet.report import to_json as fleet_json
    from sidecar.fleet.source import load_fleet

    now = _time.time()
    end = when(until, "--until", now=now) if until else None
    start = when(since, "--since", now=end.timestamp() if end else now) if since else None
    if start and end and start >= end:
        raise ConfigError("--since is not before --until: swap them or widen the range")
    note = lambda line: click.echo(line, err=True)  # noqa: E731
    report = fleet_report(load_fleet(sources, note), start, end, note)
    if fmt == "json":
        click.echo(json_text(fleet_json(report), indent=2))
    else:
        click.echo(fleet_text(report))

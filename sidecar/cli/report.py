"""`vllm-sidecar report`: one snapshot as text, JSON or a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from sidecar.cli.options import HELP, snapshot_of
from sidecar.errors import ConfigError
from sidecar.tables import json_text

if TYPE_CHECKING:
    from sidecar.advice.rules import AdviceRules


@click.command()
@click.argument("snapshot_dir", metavar="SNAPSHOT|OUT", type=click.Path(path_type=Path))
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "json", "html"]),
    default="text",
    show_default=True,
    help="html: one self-contained page (findings, phase bars, memory, the flame graph; for an "
    "output folder also the trend plot and the diff against the latest baseline).",
)
@click.option(
    "--out",
    "-o",
    "out",
    type=click.Path(path_type=Path),
    help="The page's file (--format html) [default: report-<snapshot>.html].",
)
@click.option("--host", help="The host folder under OUT (needed when OUT holds several).")
@click.option("--advice", type=click.Path(path_type=Path), help=HELP["advice"])
def report(
    snapshot_dir: Path, fmt: str, out: Path | None, host: str | None, advice: Path | None
) -> None:
    """Print the profile of one snapshot: which snapshot (when, how long, how sampled) and its
    caveats, then memory, computation time, throughput, findings (what to change, with the
    evidence), breakdowns. SNAPSHOT may be an output folder (the daemon's output.dir), a host
    or a deployment folder in it: its latest snapshot is shown, named in the header."""
    from sidecar.advice.rules import load_advice
    from sidecar.report.text import render_report, report_data
    from sidecar.store.summary_io import read_summary
    from sidecar.store.writers import to_jsonable

    rules = load_advice(advice) if advice is not None else None
    if fmt == "html":
        _report_page(snapshot_dir, out, host, rules)
        return
    if out is not None:
        raise ConfigError("--out goes with --format html")
    folder, source = snapshot_of(snapshot_dir, host)
    summary = read_summary(folder)
    if fmt == "json":
        click.echo(json_text(to_jsonable(report_data(summary, rules, source)), indent=2))
    else:
        click.echo(render_report(summary, rules, source))


def _report_page(
    path: Path, out: Path | None, host: str | None, advice: AdviceRules | None
) -> None:
    from importlib.metadata import version

    from sidecar.report.page import render_page
    from sidecar.report.page_inputs import default_name, page_inputs, write_page

    generator = f"vllm-sidecar {version('vllm-sidecar')}"
    inputs = page_inputs(path, host, generator, note=lambda line: click.echo(line, err=True),
                         advice=advice)  # fmt: skip
    target = out or default_name(inputs)
    write_page(render_page(inputs), target)
    click.echo(str(target))

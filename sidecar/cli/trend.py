"""`vllm-sidecar trend`: phase shares and serving figures over many snapshots."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli.options import when
from sidecar.tables import json_text


@click.command()
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--host", help="The host folder under OUT (needed when OUT holds several).")
@click.option(
    "--since",
    default="7d",
    show_default=True,
    metavar="DURATION|TIME",
    help="From this long before --until (7d, 12h), or from a UTC time (2026-11-20).",
)
@click.option(
    "--until",
    default=None,
    metavar="DURATION|TIME",
    help="Up to this long ago (1d), or a UTC time; default now.",
)
@click.option(
    "--kind", type=click.Choice(["all", "snapshot", "baseline"]), default="all", show_default=True
)
@click.option(
    "--series",
    multiple=True,
    metavar="COLUMN",
    help="A column or pattern (share.worker.*, ttft_p95_s); repeat for more.",
)
@click.option("--plot", type=click.Path(path_type=Path), help="Also draw the trend into a PNG.")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def trend(out: Path, host: str | None, since: str, until: str | None, kind: str,
          series: tuple[str, ...], plot: Path | None, fmt: str) -> None:  # fmt: skip
    """Phase shares and serving figures over many snapshots, with their level changes: where
    diff of the windows before against the windows after calls the change significant."""
    import time as _time

    from sidecar.trend.series import TrendOptions, compute_trend, render_text, trend_json
    from sidecar.trend.source import folder_label, host_folder, load_table, summary_reader

    end = when(until, "--until", now=_time.time()) if until else None
    start = when(since, "--since", now=end.timestamp() if end else _time.time())
    folder = host_folder(out, host)

    def note(line: str) -> None:
        click.echo(line, err=True)

    table = load_table(folder, note=note)
    options = TrendOptions(start=start, end=end, kind=kind, series=series)
    result = compute_trend(table.to_pandas(), options, host=folder_label(folder),
                           windows=summary_reader(folder, note))  # fmt: skip
    if plot is not None:
        from sidecar.trend.plot import save_png, trend_figure

        save_png(trend_figure(result), plot)
        click.echo(f"plot: {plot}", err=True)
    if fmt == "json":
        click.echo(json_text(trend_json(result), indent=2))
    else:
        click.echo(render_text(result))

"""`vllm-sidecar samples`: write the recorded snapshots shipped with the package into a folder,
to try the other commands without a vLLM (sidecar/samples/)."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.tables import json_text


@click.command()
@click.argument("dest", metavar="DIR", type=click.Path(path_type=Path))
@click.option(
    "--force",
    is_flag=True,
    help="Replace the samples already in DIR (its host folder and README.md; nothing else "
    "there is touched).",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def samples(dest: Path, force: bool, fmt: str) -> None:
    """Write real recorded snapshots into DIR (a new or empty folder): a daemon's output folder
    of a vLLM CPU server under three loads, with baselines and a stall's incident, to try
    report, diff, flamegraph, trend and the HTML page without a vLLM."""
    from sidecar.samples import next_commands, write_samples

    written = write_samples(dest, force=force)
    shown = str(dest)
    commands = next_commands(written, shown)
    if fmt == "json":
        doc = {
            "dir": shown,
            "host": written.host,
            "files": written.files,
            "bytes": written.size_bytes,
            "recorded": written.recorded,
            "vllm": written.vllm,
            "samples": [
                {"path": s.path, "kind": s.kind, "sample": s.sample, "about": s.about}
                for s in written.samples
            ],
            "next": [{"command": c, "shows": what} for c, what in commands],
        }
        click.echo(json_text(doc, indent=2))
        return
    incidents = sum(s.kind == "incident" for s in written.samples)
    click.echo(
        f"wrote {len(written.samples) - incidents} snapshots and {incidents} incident "
        f"({written.files} files, {written.size_bytes / 2**20:.1f} MiB) to {shown}: "
        f"vLLM {written.vllm} on CPU, recorded by the daemon on {written.recorded[:10]}; "
        f"about each: {Path(shown) / 'README.md'}"
    )
    width = max(len(s.path) for s in written.samples)
    for s in written.samples:
        click.echo(f"  {s.path:<{width}}  {s.kind:<8}  {s.sample}")
    click.echo("\nnext, try:")
    for command, what in commands:
        click.echo(f"  {command}\n      {what}")

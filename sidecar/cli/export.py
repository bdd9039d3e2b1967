"""`vllm-sidecar export tensorboard`: snapshots as TensorBoard runs."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.tables import json_text


@click.group()
def export() -> None:
    """Export snapshots to other tools."""


@export.command("tensorboard")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--logdir", required=True, type=click.Path(path_type=Path),
              help="TensorBoard's folder: one run per host and deployment under it.")  # fmt: skip
@click.option("--host", help="Only this host folder under OUT (default: every host).")
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def export_tensorboard(out: Path, logdir: Path, host: str | None, fmt: str) -> None:
    """One TensorBoard step per snapshot under OUT (phase shares per role, serving figures,
    memory, findings), at the snapshot's time. Re-exporting rewrites each run: no step twice."""
    from sidecar.tensorboard.scalars import export_tensorboard as export_runs

    runs = export_runs(out, logdir, host, note=lambda line: click.echo(line, err=True))
    if fmt == "json":
        doc = [{"run": str(r.path), "steps": r.steps, "first": r.first, "last": r.last}
               for r in runs]  # fmt: skip
        click.echo(json_text(doc, indent=2))
        return
    for run in runs:
        click.echo(f"{run.path}: {run.steps} steps ({run.first} .. {run.last})")

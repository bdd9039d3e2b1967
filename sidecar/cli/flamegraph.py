"""`vllm-sidecar flamegraph`: a snapshot's stacks as a flame graph (SVG) and a speedscope
profile, or how another snapshot differs from it."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("snapshot_dir", metavar="SNAPSHOT", type=click.Path(path_type=Path))
@click.option("--diff", "other", metavar="OTHER", type=click.Path(path_type=Path),
              help="Draw how OTHER (B, the layout) differs from SNAPSHOT (A): red grew, blue "
                   "shrank, by each frame's share of all samples. SVG only.")  # fmt: skip
@click.option("--out", "-o", type=click.Path(),
              help="A folder, or a path prefix for <prefix>.svg and <prefix>.speedscope.json "
                   "[default: flame-<snapshot> in the working folder].")  # fmt: skip
@click.option(
    "--min-width",
    type=click.FloatRange(0, 100),
    default=0.1,
    show_default=True,
    metavar="PCT",
    help="Leave out frames narrower than PCT% of the width.",
)
@click.option("--idle", is_flag=True,
              help="Keep the stacks classified idle (left out by default, as py-spy does; "
                   "the graph's heading says how many samples were idle).")  # fmt: skip
def flamegraph(
    snapshot_dir: Path, other: Path | None, out: str | None, min_width: float, idle: bool
) -> None:
    """Draw a snapshot's stacks as a flame graph (SVG) and a speedscope profile (JSON).
    SNAPSHOT (and OTHER) may be an output, host or deployment folder: its latest snapshot."""
    from importlib.metadata import version

    from sidecar.cli.options import snapshot_of
    from sidecar.flame.files import draw, draw_diff

    # An output, host or deployment folder stands for its latest snapshot, as in `report`.
    snapshot_dir = snapshot_of(snapshot_dir, None)[0]
    other = None if other is None else snapshot_of(other, None)[0]
    if other is not None:
        paths = draw_diff(snapshot_dir, other, out, min_width / 100, idle)
        click.echo("(no speedscope file for a differential graph: speedscope cannot show one; "
                   "`flamegraph OTHER` writes B's profile)", err=True)  # fmt: skip
    else:
        exporter = f"vllm-sidecar@{version('vllm-sidecar')}"
        paths = draw(snapshot_dir, out, min_width / 100, exporter, idle)
    for path in paths:
        click.echo(str(path))

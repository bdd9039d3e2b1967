"""`vllm-sidecar trigger`: a snapshot now, taken by the running daemon over its local socket."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.config.load import load_config
from sidecar.tables import json_text


@click.command()
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path),
    help="The daemon's YAML config: its trigger.socket or output.dir name the socket.",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    help="The daemon's output folder (--out of `run`): its control.sock.",
)
@click.option(
    "--socket",
    "socket_file",
    type=click.Path(path_type=Path),
    help="The daemon's control socket itself.",
)
@click.option(
    "--reason",
    default="vllm-sidecar trigger",
    show_default=True,
    help="Recorded in the snapshot's cause.",
)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def trigger(config_path: Path | None, out: Path | None, socket_file: Path | None,
            reason: str, fmt: str) -> None:  # fmt: skip
    """Take a snapshot now in the running daemon (over its local socket); prints its folder."""
    from sidecar.daemon.triggers import request_snapshot, socket_path

    config = load_config(config_path)
    path = socket_file or socket_path(config.trigger.socket, out or Path(config.output.dir))
    folder = request_snapshot(path, reason, config.trigger.window_s + 150)
    click.echo(json_text({"snapshot": folder}, indent=2) if fmt == "json" else folder)

"""`vllm-sidecar config`: the built-in configs as files an operator can start from.

`config example` writes the example config (every setting with its default and unit, the same
file the checkout has as configs/sidecar.yaml) to stdout or a file, from the installed package,
so that a `pip install` has what the README's `run --config` runs."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.config.packaged import packaged_config
from sidecar.errors import OutputError
from sidecar.store.atomic import write_file

BUILT_IN = {"sidecar": "sidecar.yaml", "phases": "phases.yaml", "advice": "advice.yaml"}


@click.group("config")
def config_group() -> None:
    """The built-in config files, to start your own from."""


@click.command("example")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write it to this file (refused if the file exists); default: stdout.",
)
@click.option("--which", type=click.Choice(sorted(BUILT_IN)), default="sidecar",
              show_default=True,
              help="sidecar: the daemon's config; phases: the phase rules (for --rules); "
                   "advice: the advice rules (for --advice).")  # fmt: skip
def example(output: Path | None, which: str) -> None:
    """Print the example config (or the built-in phase or advice rules)."""
    text = packaged_config(BUILT_IN[which]).read_text(encoding="utf-8")
    if output is None:
        click.echo(text, nl=False)
        return
    if output.exists():
        raise OutputError(f"{output} exists; remove it or give another --output (nothing written)")
    try:
        write_file(output, text, durable=False)
    except OSError as exc:
        raise OutputError(f"cannot write {output}: {exc.strerror or exc}; give a writable "
                          "--output") from None  # fmt: skip
    click.echo(f"wrote {output}; edit it, then: vllm-sidecar run --config {output}", err=True)


config_group.add_command(example)

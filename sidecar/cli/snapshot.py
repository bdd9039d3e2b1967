"""`vllm-sidecar snapshot`: one window of a vLLM server, written as a snapshot folder."""

from __future__ import annotations

from pathlib import Path

import click

from sidecar.cli.options import SHARED_SETTINGS, given, setting_options, settings_from, shown
from sidecar.config import units
from sidecar.config.load import snapshot_options
from sidecar.config.settings import SNAPSHOT_DEFAULTS, Config, SnapshotOptions
from sidecar.errors import ConfigError
from sidecar.tables import phase_table


@click.command()
@setting_options(SNAPSHOT_DEFAULTS, SHARED_SETTINGS)
@click.option("--duration", type=click.STRING, metavar="DURATION",
              default=SnapshotOptions().duration_s,
              show_default=shown(SnapshotOptions().duration_s, units.SECONDS),
              help="Window length: 30 (seconds), 30s, 2m.")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Snapshot folder.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True, help="json: print summary.json instead of a table.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, hidden=True, help="Same as --format json.")
def snapshot(**kwargs: object) -> None:
    """Sample a vLLM server for one window and write a snapshot folder under --out.

    --discover takes the one vLLM server it finds. Several are an error (exit 2) that names
    each (PID, model, port): pick one with --pid PID, or profile them all with `vllm-sidecar
    run --discover` (as `targets: [{discover: true}]` in a --config file does)."""
    from sidecar.commands import take_snapshot  # keeps `classify` free of the sampler's imports
    from sidecar.report.text import caveats

    config, options = snapshot_settings(click.get_current_context())
    folder, summary = take_snapshot(
        config, options, progress=lambda line: click.echo(line, err=True)
    )
    if options.as_json:
        click.echo((folder / "summary.json").read_text().rstrip())
        return
    sampling = summary.sampling
    click.echo(f"snapshot: {folder}")
    click.echo(
        f"{sampling.samples} samples in {sampling.duration_s:.1f} s at "
        f"{sampling.rate_hz:g} Hz, {sampling.errors} py-spy errors, sampler CPU "
        f"{100 * (sampling.sampler_cpu_share or 0):.2f}% of one core"
    )
    for caveat in caveats(summary):  # stdout carries the data alone
        click.echo(f"WARNING: {caveat}", err=True)
    click.echo(phase_table(summary))


def snapshot_settings(ctx: click.Context) -> tuple[Config, SnapshotOptions]:
    """The shared config (from --config, the environment and the setting flags) and the
    options only `snapshot` takes, in the same units."""
    typed = given(ctx)
    if "pid" in typed and typed.get("discover"):
        raise ConfigError("give --pid PID or --discover, not both")
    config, _, _ = settings_from(ctx, SHARED_SETTINGS, SNAPSHOT_DEFAULTS)
    t = config.target
    if t.pid is None and t.pid_file is None and not t.discover:
        raise ConfigError(
            "name the vLLM server: give --pid PID, --pid-file FILE or --discover "
            "(or target.pid, target.pid_file or target.discover in --config)"
        )
    own = {"out": "out", "duration": "duration_s", "as_json": "as_json"}
    if typed.pop("fmt", None) == "json":  # --json is the old spelling of --format json
        typed["as_json"] = True
    return config, snapshot_options({own[k]: v for k, v in typed.items() if k in own})

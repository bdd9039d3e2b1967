"""The command line. Flags are validated here, once, into frozen configs; the core never sees
click. Exit codes are decided in one place (`main`), from the error hierarchy."""

from __future__ import annotations

import json
import sys
import traceback
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from sidecar.classify.aggregate import label_stacks
from sidecar.classify.classifier import STEP_PHASES, Classifier
from sidecar.classify.rules import load_rules
from sidecar.config import units
from sidecar.config.load import (
    FLAGS,
    check_fleet_target,
    load_config,
    snapshot_options,
    unit_of,
)
from sidecar.config.settings import SNAPSHOT_DEFAULTS, Config, SnapshotOptions
from sidecar.config.units import Unit
from sidecar.doctor import check_rule_files
from sidecar.errors import ConfigError, SidecarError, exit_code
from sidecar.parsers import parse_file
from sidecar.tables import phase_table, table

if TYPE_CHECKING:
    from sidecar.advice.rules import AdviceRules
    from sidecar.records import Role, StackSample


@click.group()
@click.version_option(package_name="vllm-sidecar")
def cli() -> None:
    """Profile a running vLLM server: py-spy stacks mapped to serving phases."""


# ---------------------------------------------------------------------------------- settings
# One config model for `snapshot`, `run` and `doctor` (sidecar/config/load.py): each setting flag
# overrides --config and the environment, and is parsed in the setting's unit there, so an error
# names the flag. A flag left out leaves the file's value alone (click's defaults only show).

SHARED_SETTINGS = (
    "target.pid", "target.pid_file", "target.discover", "target.proc_root", "target.host_proc",
    "target.any_python", "sampling.rate_hz", "sampling.cpu_budget", "sampling.py_spy",
    "sampling.segment_s",
    "metrics.url", "gpu", "rules",
)  # fmt: skip
DAEMON_SETTINGS = (
    *SHARED_SETTINGS, "sampling.mode", "sampling.continuous_budget",
    "advice", "output.dir", "exporter_listen", "schedule.window_s",
    "schedule.interval_s", "schedule.baseline_every_s",
)  # fmt: skip
_HELP = {
    "target.pid": "Any process of the vLLM server (API server, engine, worker).",
    "target.pid_file": "A file holding that PID; re-read when vLLM restarts.",
    "target.discover": "Find the vLLM server under --proc-root.",
    "target.proc_root": "A host's /proc mounted elsewhere (e.g. /host_proc).",
    "target.host_proc": "The host's /proc, to map NVML's host PIDs from inside a container.",
    "target.any_python": "Allow a Python process that is not vLLM.",
    "sampling.rate_hz": "Samples per second (the starting rate under a budget).",
    "sampling.cpu_budget": "Adapt the rate to this share of one core, e.g. 2% (`off`: fixed).",
    "sampling.py_spy": "Path to the py-spy binary.",
    "sampling.mode": "continuous: every process all the time, within --continuous-budget; "
    "windows: --window in every --interval at --rate.",
    "sampling.continuous_budget": "Continuous mode: the sidecar and py-spy within this share "
    "of one core, e.g. 1%.",
    "sampling.segment_s": "py-spy runs in segments this long, each a unit for `diff`.",
    "metrics.url": "vLLM's /metrics (default: from the API server's flags).",
    "gpu": "NVML readings.",
    "rules": "Your own phases.yaml.",
    "advice": "Your own advice.yaml (the findings' rules).",
    "output.dir": "Output folder.",
    "exporter_listen": "host:port of the sidecar's /metrics, or off.",
    "schedule.window_s": "Window length, e.g. 60s.",
    "schedule.interval_s": "A window every ..., e.g. 5m.",
    "schedule.baseline_every_s": "Baseline period, e.g. 1h.",
}
_BOOLS = ("target.discover", "target.any_python", "gpu")


_METAVARS = {
    "seconds": "DURATION", "hertz": "HZ", "share": "SHARE", "path": "PATH", "command": "PATH",
    "pid": "PID", "url": "URL", "listen address": "HOST:PORT", "sampling mode": "MODE",
}  # fmt: skip


def _shown(default: Any, unit: Unit) -> str | bool:
    if default is None:
        return False
    if unit is units.SECONDS:
        return f"{default:g}s"
    return f"{100 * default:g}%" if unit is units.SHARE else True


def _param(key: str) -> str:
    return FLAGS[key].lstrip("-").replace("-", "_")


def _setting_options(
    defaults: Config, keys: tuple[str, ...]
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """--config and a flag per setting; values stay text until the config layer parses them.
    `defaults` are shown in --help only: a flag left out is not passed on (see `_typed`)."""

    def decorate(f: Callable[..., None]) -> Callable[..., None]:
        for key in reversed(keys):
            flag, help_text = FLAGS[key], _HELP[key]
            if key in _BOOLS:
                f = click.option(f"{flag}/--no-{flag[2:]}", default=None, help=help_text)(f)
                continue
            section, _, name = key.rpartition(".")
            default = getattr(getattr(defaults, section) if section else defaults, name)
            unit = unit_of(key)
            f = click.option(flag, type=click.STRING, metavar=_METAVARS.get(unit.name, "TEXT"),
                             default=default, show_default=_shown(default, unit),
                             help=help_text)(f)  # fmt: skip
        return click.option("--config", "config_path", type=click.Path(path_type=Path),
                            help="YAML config (see configs/sidecar.yaml).")(f)  # fmt: skip

    return decorate


def _typed(ctx: click.Context) -> dict[str, Any]:
    """The options given on the command line, by parameter name."""
    return {
        name: value
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    }


def _settings(
    ctx: click.Context, keys: tuple[str, ...], defaults: Config
) -> tuple[Config, Path | None, dict[str, Any]]:
    """The config for `keys`' flags on top of --config and the environment; the flags too, in
    the config layer's form, for the daemon to re-apply on SIGHUP."""
    typed = _typed(ctx)
    flags = {key: typed[_param(key)] for key in keys if _param(key) in typed}
    if flags.get("target.pid") is not None or flags.get("target.pid_file") is not None:
        flags.setdefault("target.discover", False)  # a named target over the file's discovery
    path = ctx.params.get("config_path")
    config = load_config(path, flags=flags, defaults=defaults)
    check_rule_files(config)
    return config, path, flags


# ---------------------------------------------------------------------------------- classify


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default=None,
              help="text (the default) or json; --json is --format json.")  # fmt: skip
@click.option("--explain", is_flag=True,
              help="Per distinct stack (most samples first): role, phase, stage, the rule "
              "and frame that decided, unknown frames. FILES may be snapshots.")  # fmt: skip
@click.option("--limit", type=click.IntRange(min=0), default=20, show_default=True,
              help="--explain as text: at most this many stacks (0: all).")  # fmt: skip
@click.option("--rules", type=click.Path(path_type=Path), help="Your own phases.yaml.")
def classify(
    files: tuple[Path, ...],
    as_json: bool,
    fmt: str | None,
    explain: bool,
    limit: int,
    rules: Path | None,
) -> None:
    """Attribute the stacks in dumps, recordings or tracebacks to serving phases."""
    classifier = Classifier(load_rules(rules))
    as_json = as_json or fmt == "json"
    if explain:
        _explain(classifier, files, as_json, limit)
        return
    entries, warnings = [], []
    for path in files:
        parsed = parse_file(path)
        warnings += [f"{path}: {w}" for w in parsed.warnings]
        # label_stacks gives every thread of a process its process's most specific role.
        for labelled in label_stacks(classifier, parsed.stacks):
            stack, label = labelled.stack, labelled.label
            entries.append(
                {
                    "source": str(path),
                    "thread_id": stack.thread_id,
                    "thread_name": stack.thread_name,
                    "process": stack.process,
                    "role": label.role.value,
                    "phase": label.phase.value,
                    "stage": label.stage.value if label.phase in STEP_PHASES else None,
                    "weight": stack.weight,
                    "frame": label.frame.label() if label.frame else None,
                }
            )
    totals: Counter[str] = Counter()
    for e in entries:
        totals[str(e["phase"])] += int(str(e["weight"]))
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    if as_json:
        out = {"stacks": entries, "totals": dict(totals.most_common()), "warnings": warnings}
        click.echo(json.dumps(out, indent=2))
        return
    rows = [
        [e["thread_id"] or "-", e["thread_name"] or "-", e["role"], e["phase"],
         e["stage"] or "-", e["weight"], e["frame"] or "-"]
        for e in entries
    ]  # fmt: skip
    click.echo(table(["thread", "name", "role", "phase", "stage", "weight", "frame"], rows))
    click.echo("\n" + table(["phase", "weight"], totals.most_common()))


def _explain(classifier: Classifier, files: tuple[Path, ...], as_json: bool, limit: int) -> None:
    from sidecar.classify.explain import as_json as explained_json
    from sidecar.classify.explain import as_text, explain
    from sidecar.store.stacks import read_input

    stacks: list[StackSample] = []
    roles: list[Role | None] = []
    warnings: list[str] = []
    for path in files:
        read = read_input(path)
        stacks += read.stacks
        roles += read.roles
        warnings += read.warnings
    for w in warnings:
        click.echo(f"warning: {w}", err=True)
    explained = explain(classifier, stacks, roles)
    if as_json:
        out = {"rules": classifier.rules.fingerprint, "samples": sum(e.weight for e in explained),
               "stacks": explained_json(explained), "warnings": warnings}  # fmt: skip
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(as_text(explained, limit or None), nl=False)


@cli.group("rules")
def rules_group() -> None:
    """Work on the phase rules (configs/phases.yaml)."""


@rules_group.command("suggest")
@click.argument("source", metavar="SNAPSHOT|FILE", type=click.Path(path_type=Path))
@click.option("--rules", type=click.Path(path_type=Path), help="Your own phases.yaml.")
@click.option("--top", type=click.IntRange(min=1), default=10, show_default=True,
              help="How many frames to suggest rules for.")  # fmt: skip
@click.option("--no-idle-waits", "idle_waits", is_flag=True, flag_value=False, default=True,
              help="Only `other`: not idle stacks of a wait without context.")  # fmt: skip
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text",
              show_default=True)  # fmt: skip
def rules_suggest(source: Path, rules: Path | None, top: int, idle_waits: bool, fmt: str) -> None:
    """The most frequent frames in `other`, each with a rule skeleton to paste into phases.yaml
    (checked: pasted into a copy of the rules file, it loads) and the samples it would move."""
    from sidecar.classify.rules import default_rules_path
    from sidecar.classify.suggest import as_text, suggest
    from sidecar.store.stacks import read_input

    path = rules or default_rules_path()
    ruleset = load_rules(path)
    read = read_input(source)
    for w in read.warnings:
        click.echo(f"warning: {w}", err=True)
    total = sum(s.weight for s in read.stacks)
    text = path.read_text(encoding="utf-8")
    found = suggest(Classifier(ruleset), read.stacks, read.roles,
                    rules_text=text, top=top, idle_waits=idle_waits)  # fmt: skip
    if fmt == "json":
        out = {"rules": ruleset.fingerprint, "samples": total, "suggestions": [
            {"frame": s.frame.label(), "phase_now": s.phase_now.value, "samples": s.samples,
             "stacks": s.stacks, "moved": s.moved, "changed": s.changed, "share": round(s.share, 6),
             "phase": s.phase.value, "skeleton": s.skeleton} for s in found]}  # fmt: skip
        click.echo(json.dumps(out, indent=2))
        return
    click.echo(as_text(found, total), nl=False)


# ---------------------------------------------------------------------------------- snapshot


@cli.command()
@_setting_options(SNAPSHOT_DEFAULTS, SHARED_SETTINGS)
@click.option("--duration", type=click.STRING, metavar="DURATION",
              default=SnapshotOptions().duration_s,
              show_default=_shown(SnapshotOptions().duration_s, units.SECONDS),
              help="Window length: 30 (seconds), 30s, 2m.")  # fmt: skip
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Snapshot folder.")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of a table.")
def snapshot(**kwargs: object) -> None:
    """Sample a vLLM server for one window and write a snapshot folder under --out."""
    from sidecar.commands import take_snapshot  # keeps `classify` free of the sampler's imports
    from sidecar.report.text import caveats

    config, options = _snapshot_settings(click.get_current_context())
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
    for caveat in caveats(summary):
        click.echo(f"WARNING: {caveat}")
    click.echo(phase_table(summary))


def _snapshot_settings(ctx: click.Context) -> tuple[Config, SnapshotOptions]:
    """The shared config (from --config, the environment and the setting flags) and the
    options only `snapshot` takes, in the same units."""
    typed = _typed(ctx)
    if "pid" in typed and typed.get("discover"):
        raise ConfigError("give --pid PID or --discover, not both")
    config, _, _ = _settings(ctx, SHARED_SETTINGS, SNAPSHOT_DEFAULTS)
    t = config.target
    if t.pid is None and t.pid_file is None and not t.discover:
        raise ConfigError(
            "name the vLLM server: give --pid PID, --pid-file FILE or --discover "
            "(or target.pid, target.pid_file or target.discover in --config)"
        )
    own = {"out": "out", "duration": "duration_s", "as_json": "as_json"}
    return config, snapshot_options({own[k]: v for k, v in typed.items() if k in own})


@cli.command()
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
@click.option("--advice", type=click.Path(path_type=Path), help=_HELP["advice"])
def report(
    snapshot_dir: Path, fmt: str, out: Path | None, host: str | None, advice: Path | None
) -> None:
    """Print the profile of one snapshot: memory, computation time, throughput, findings
    (what to change, with the evidence), breakdowns. With --format html, SNAPSHOT may be an
    output folder: its latest snapshot is shown."""
    from sidecar.advice.rules import load_advice
    from sidecar.report.text import render, report_data
    from sidecar.store.summary_io import read_summary
    from sidecar.store.writers import to_jsonable

    rules = load_advice(advice) if advice is not None else None
    if fmt == "html":
        _report_page(snapshot_dir, out, host, rules)
        return
    if out is not None or host is not None:
        raise ConfigError("--out and --host go with --format html")
    summary = read_summary(snapshot_dir)
    if fmt == "json":
        click.echo(json.dumps(to_jsonable(report_data(summary, rules)), indent=2))
    else:
        click.echo(render(summary, rules))


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


# ---------------------------------------------------------------------------------- diff

REGRESSION_EXIT = 10  # `diff --fail-on`: a significant regression beyond the threshold


@cli.command()
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
@click.option("--advice", type=click.Path(path_type=Path), help=_HELP["advice"])
def diff(sides: tuple[str, ...], baseline_of: Path | None, since: str | None,
         until: str | None, fmt: str, fail_on: str | None,
         advice: Path | None) -> None:  # fmt: skip
    """What changed from A to B, and is it real? A and B: snapshot folders, or output folders
    narrowed to a time range (PATH@SINCE..UNTIL, or --since/--until)."""
    from sidecar.advice.findings import finding_changes
    from sidecar.advice.rules import load_advice
    from sidecar.analyze.compare import compare
    from sidecar.diff.sides import (
        Range,
        baseline_sides,
        gate,
        now,
        parse_time,
        render_text,
        side_from,
    )
    from sidecar.diff.sides import to_json as diff_json

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
    comparison = compare(a, b)
    failed = gate(comparison, threshold)
    found = finding_changes(a.summaries, b.summaries, rules)
    if fmt == "json":
        click.echo(json.dumps(diff_json(comparison, failed, found), indent=2))
    else:
        click.echo(render_text(comparison, failed, found))
    if failed:
        raise SystemExit(REGRESSION_EXIT)


# ---------------------------------------------------------------------------------- flamegraph


@cli.command()
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
def flamegraph(snapshot_dir: Path, other: Path | None, out: str | None, min_width: float) -> None:
    """Draw a snapshot's stacks as a flame graph (SVG) and a speedscope profile (JSON)."""
    from importlib.metadata import version

    from sidecar.flame.files import draw, draw_diff

    if other is not None:
        paths = draw_diff(snapshot_dir, other, out, min_width / 100)
        click.echo("(no speedscope file for a differential graph: speedscope cannot show one; "
                   "`flamegraph OTHER` writes B's profile)", err=True)  # fmt: skip
    else:
        exporter = f"vllm-sidecar@{version('vllm-sidecar')}"
        paths = draw(snapshot_dir, out, min_width / 100, exporter)
    for path in paths:
        click.echo(str(path))


# ---------------------------------------------------------------------------------- trend


@cli.command()
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
    """Phase shares and serving figures over many snapshots, with their level changes."""
    import time as _time

    from sidecar.trend.series import TrendOptions, compute_trend, render_text, trend_json
    from sidecar.trend.source import folder_label, host_folder, load_table

    end = _when(until, "--until", now=_time.time()) if until else None
    start = _when(since, "--since", now=end.timestamp() if end else _time.time())
    folder = host_folder(out, host)
    table = load_table(folder, note=lambda line: click.echo(line, err=True))
    options = TrendOptions(start=start, end=end, kind=kind, series=series)
    result = compute_trend(table.to_pandas(), options, host=folder_label(folder))
    if plot is not None:
        from sidecar.trend.plot import save_png, trend_figure

        save_png(trend_figure(result), plot)
        click.echo(f"plot: {plot}", err=True)
    if fmt == "json":
        click.echo(json.dumps(trend_json(result), indent=2))
    else:
        click.echo(render_text(result))


# ---------------------------------------------------------------------------------- aggregate


@cli.command()
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
    end = _when(until, "--until", now=now) if until else None
    start = _when(since, "--since", now=end.timestamp() if end else now) if since else None
    if start and end and start >= end:
        raise ConfigError("--since is not before --until: swap them or widen the range")
    note = lambda line: click.echo(line, err=True)  # noqa: E731
    report = fleet_report(load_fleet(sources, note), start, end, note)
    if fmt == "json":
        click.echo(json.dumps(fleet_json(report), indent=2))
    else:
        click.echo(fleet_text(report))


# ---------------------------------------------------------------------------------- export


@cli.group()
def export() -> None:
    """Export snapshots to other tools."""


@export.command("tensorboard")
@click.argument("out", type=click.Path(path_type=Path))
@click.option("--logdir", required=True, type=click.Path(path_type=Path),
              help="TensorBoard's folder: one run per host and deployment under it.")  # fmt: skip
@click.option("--host", help="Only this host folder under OUT (default: every host).")
def export_tensorboard(out: Path, logdir: Path, host: str | None) -> None:
    """One TensorBoard step per snapshot under OUT (phase shares per role, serving figures,
    memory, findings), at the snapshot's time. Re-exporting rewrites each run: no step twice."""
    from sidecar.tensorboard.scalars import export_tensorboard as export_runs

    runs = export_runs(out, logdir, host, note=lambda line: click.echo(line, err=True))
    for run in runs:
        click.echo(f"{run.path}: {run.steps} steps ({run.first} .. {run.last})")


def _when(text: str, flag: str, now: float) -> datetime:
    """A duration back from `now` (7d, 12h, 90m) or a UTC time (2026-11-20, 2026-11-20T06:00)."""
    try:
        return datetime.fromtimestamp(units.moment(text, now), tz=UTC)
    except units.Unfit as exc:
        raise ConfigError(f"{flag} {text!r} {exc}") from None


# ---------------------------------------------------------------------------------- run, doctor


@cli.command()
@_setting_options(Config(), DAEMON_SETTINGS)
def run(**kw: Any) -> None:
    """Profile vLLM on a schedule: snapshots, hourly baselines, a Prometheus endpoint."""
    from sidecar.daemon.logs import setup_logging
    from sidecar.daemon.loop import Daemon
    from sidecar.daemon.multi_target import MultiTargetDaemon

    config, path, flags = _settings(click.get_current_context(), DAEMON_SETTINGS, Config())
    check_fleet_target(config)
    setup_logging(config.log_level)
    # `targets:` in the config file: every server it names, each a deployment (multi_target.py).
    daemon = MultiTargetDaemon if config.targets else Daemon
    daemon(config, config_path=path, flags=flags).run()


@cli.command()
@_setting_options(Config(), DAEMON_SETTINGS)
def doctor(**kw: Any) -> None:
    """Check py-spy, ptrace, the target, NVML, vLLM's /metrics and the output folder."""
    from sidecar.doctor import Status, run_checks

    config, _, _ = _settings(click.get_current_context(), DAEMON_SETTINGS, Config())
    check_fleet_target(config)
    checks = run_checks(config)
    for c in checks:
        click.echo(f"[{c.status.value:>4}] {c.name}: {c.detail}")
        if c.fix:
            click.echo(f"       fix: {c.fix}")
    if any(c.status is Status.FAIL for c in checks):
        raise SystemExit(1)


@cli.command()
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
def trigger(config_path: Path | None, out: Path | None, socket_file: Path | None,
            reason: str) -> None:  # fmt: skip
    """Take a snapshot now in the running daemon (over its local socket); prints its folder."""
    from sidecar.daemon.triggers import request_snapshot, socket_path

    config = load_config(config_path)
    path = socket_file or socket_path(config.trigger.socket, out or Path(config.output.dir))
    click.echo(request_snapshot(path, reason, config.trigger.window_s + 150))


def main(argv: list[str] | None = None) -> int:
    """Entry point: the one place where errors become exit codes."""
    try:
        cli.main(args=argv, prog_name="vllm-sidecar", standalone_mode=False)
    except SystemExit as exc:  # doctor's verdict
        return int(exc.code or 0)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SidecarError as exc:
        click.echo(f"vllm-sidecar: error: {exc}", err=True)
        return exit_code(exc)
    except Exception as exc:  # a bug: the traceback is what a report needs
        traceback.print_exc(file=sys.stderr)
        click.echo(f"vllm-sidecar: internal error ({type(exc).__name__}): please report it "
                   "with the traceback above", err=True)  # fmt: skip
        return exit_code(exc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

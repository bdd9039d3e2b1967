"""The command line. Flags are validated here, once, into frozen configs; the core never sees
click. Exit codes are decided in one place (`main`), from the error hierarchy."""

from __future__ import annotations

import json
import sys
import traceback
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from sidecar.aggregate import label_stacks
from sidecar.classifier import STEP_PHASES, Classifier
from sidecar.errors import ConfigError, SidecarError, exit_code
from sidecar.parsers import parse_file
from sidecar.render import phase_table, table
from sidecar.rules import load_rules


@click.group()
@click.version_option(package_name="vllm-sidecar")
def cli() -> None:
    """Profile a running vLLM server: py-spy stacks mapped to serving phases."""


# ---------------------------------------------------------------------------------- classify


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of a table.")
@click.option("--rules", type=click.Path(path_type=Path), help="Your own phases.yaml.")
def classify(files: tuple[Path, ...], as_json: bool, rules: Path | None) -> None:
    """Attribute the stacks in dumps, recordings or tracebacks to serving phases."""
    classifier = Classifier(load_rules(rules))
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


# ---------------------------------------------------------------------------------- snapshot


@dataclass(frozen=True, slots=True)
class SnapshotConfig:
    pid: int | None
    discover: bool
    duration_s: float
    rate_hz: float
    cpu_budget: float | None
    out: Path
    proc_root: Path
    rules: Path | None
    py_spy: str | None
    any_python: bool
    as_json: bool
    metrics_url: str | None = None
    gpu: bool = True
    host_proc_root: Path | None = None


def parse_share(value: str | None) -> float | None:
    """`2%` or `0.02` -> 0.02."""
    if value is None:
        return None
    text = value.strip()
    try:
        share = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ConfigError(
            f"--cpu-budget {value!r}: give a share of one core, e.g. 2% or 0.02"
        ) from None
    if not 0 < share <= 1:
        raise ConfigError(f"--cpu-budget {value!r} must be between 0 and 100% of one core")
    return share


@cli.command()
@click.option(
    "--pid", type=int, help="Any process of the vLLM server (API server, engine, worker)."
)
@click.option("--discover", is_flag=True, help="Find the vLLM server under --proc-root.")
@click.option("--duration", type=float, default=10.0, show_default=True, help="Window, seconds.")
@click.option("--rate", type=float, default=5.0, show_default=True, help="Samples per second.")
@click.option("--cpu-budget", help="Adapt the rate to this share of one core (e.g. 2%).")
@click.option("--out", type=click.Path(path_type=Path), required=True, help="Snapshot folder.")
@click.option(
    "--proc-root",
    type=click.Path(path_type=Path),
    default=Path("/proc"),
    show_default=True,
    help="A host's /proc mounted elsewhere (e.g. /host_proc).",
)
@click.option("--rules", type=click.Path(path_type=Path), help="Your own phases.yaml.")
@click.option("--py-spy", "py_spy", help="Path to the py-spy binary.")
@click.option("--any-python", is_flag=True, help="Allow a Python process that is not vLLM.")
@click.option("--json", "as_json", is_flag=True, help="Print summary.json instead of a table.")
@click.option("--metrics-url", help="vLLM's /metrics (default: from the API server's flags).")
@click.option("--no-gpu", is_flag=True, help="Skip NVML readings.")
@click.option(
    "--host-proc",
    type=click.Path(path_type=Path),
    help="The host's /proc, to map NVML's host PIDs from inside a container.",
)
def snapshot(**kwargs: object) -> None:
    """Sample a vLLM server for one window and write a snapshot folder under --out."""
    from sidecar.commands import take_snapshot  # keeps `classify` free of the sampler's imports
    from sidecar.report import caveats

    config = _snapshot_config(kwargs)
    folder, summary = take_snapshot(config, progress=lambda line: click.echo(line, err=True))
    if config.as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    sampling = summary["sampling"]
    click.echo(f"snapshot: {folder}")
    click.echo(
        f"{sampling['samples']} samples in {sampling['duration_s']:.1f} s at "
        f"{sampling['rate_hz']:g} Hz, {sampling['errors']} py-spy errors, sampler CPU "
        f"{100 * (sampling['sampler_cpu_share'] or 0):.2f}% of one core"
    )
    for caveat in caveats(summary):
        click.echo(f"WARNING: {caveat}")
    click.echo(phase_table(summary))


def _snapshot_config(kw: dict[str, object]) -> SnapshotConfig:
    if (kw["pid"] is None) == (not kw["discover"]):
        raise ConfigError("give exactly one of --pid PID or --discover")
    duration, rate = float(str(kw["duration"])), float(str(kw["rate"]))
    if duration <= 0 or rate <= 0:
        raise ConfigError("--duration and --rate must be positive")
    return SnapshotConfig(
        pid=kw["pid"] if isinstance(kw["pid"], int) else None,
        discover=bool(kw["discover"]),
        duration_s=duration,
        rate_hz=rate,
        cpu_budget=parse_share(kw["cpu_budget"] if isinstance(kw["cpu_budget"], str) else None),
        out=Path(str(kw["out"])),
        proc_root=Path(str(kw["proc_root"])),
        rules=Path(str(kw["rules"])) if kw["rules"] else None,
        py_spy=str(kw["py_spy"]) if kw["py_spy"] else None,
        any_python=bool(kw["any_python"]),
        as_json=bool(kw["as_json"]),
        metrics_url=str(kw["metrics_url"]) if kw["metrics_url"] else None,
        gpu=not kw["no_gpu"],
        host_proc_root=Path(str(kw["host_proc"])) if kw["host_proc"] else None,
    )


@cli.command()
@click.argument("snapshot_dir", type=click.Path(path_type=Path))
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def report(snapshot_dir: Path, fmt: str) -> None:
    """Print the profile of one snapshot: memory, computation time, throughput, breakdowns."""
    from sidecar.report import load_summary, render, report_data

    summary = load_summary(snapshot_dir)
    if fmt == "json":
        click.echo(json.dumps(report_data(summary), indent=2))
    else:
        click.echo(render(summary))


# ---------------------------------------------------------------------------------- run, doctor


def _daemon_options(f: Any) -> Any:
    """Flags shared by `run` and `doctor`; each overrides the config file and environment."""
    options = [
        click.option("--config", "config_path", type=click.Path(path_type=Path),
                     help="YAML config (see configs/sidecar.yaml)."),
        click.option("--pid", type=int, help="Any process of the vLLM server."),
        click.option("--pid-file", type=click.Path(path_type=Path),
                     help="A file holding that PID; re-read when vLLM restarts."),
        click.option("--discover/--no-discover", default=None,
                     help="Find vLLM under --proc-root."),
        click.option("--proc-root", type=click.Path(path_type=Path)),
        click.option("--out", type=click.Path(path_type=Path), help="Output folder."),
        click.option("--metrics-url"),
        click.option("--exporter-listen", help="host:port of the sidecar's /metrics, or off."),
        click.option("--rate", type=float),
        click.option("--cpu-budget"),
        click.option("--window", help="Window length, e.g. 60s."),
        click.option("--interval", help="A window every ..., e.g. 5m."),
        click.option("--baseline-every", help="Baseline period, e.g. 1h."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


_FLAG_KEYS = {
    "pid": "target.pid", "pid_file": "target.pid_file", "discover": "target.discover",
    "proc_root": "target.proc_root", "out": "output.dir", "metrics_url": "metrics.url",
    "exporter_listen": "exporter_listen", "rate": "sampling.rate_hz",
    "cpu_budget": "sampling.cpu_budget", "window": "schedule.window_s",
    "interval": "schedule.interval_s", "baseline_every": "schedule.baseline_every_s",
}  # fmt: skip


def _load_daemon_config(kw: dict[str, Any]) -> tuple[Any, Path | None, dict[str, Any]]:
    from sidecar.config import load_config

    flags = {_FLAG_KEYS[k]: v for k, v in kw.items() if k in _FLAG_KEYS and v is not None}
    if flags.get("target.pid") is not None or flags.get("target.pid_file") is not None:
        flags.setdefault("target.discover", False)
    path = kw.get("config_path")
    return load_config(path, flags=flags), path, flags


@cli.command()
@_daemon_options
def run(**kw: Any) -> None:
    """Profile vLLM on a schedule: snapshots, hourly baselines, a Prometheus endpoint."""
    from sidecar.daemon import Daemon
    from sidecar.logs import setup_logging

    config, path, flags = _load_daemon_config(kw)
    setup_logging(config.log_level)
    Daemon(config, config_path=path, flags=flags).run()


@cli.command()
@_daemon_options
def doctor(**kw: Any) -> None:
    """Check py-spy, ptrace, the target, NVML, vLLM's /metrics and the output folder."""
    from sidecar.doctor import Status, run_checks

    config, _, _ = _load_daemon_config(kw)
    checks = run_checks(config)
    for c in checks:
        click.echo(f"[{c.status.value:>4}] {c.name}: {c.detail}")
        if c.fix:
            click.echo(f"       fix: {c.fix}")
    if any(c.status is Status.FAIL for c in checks):
        raise SystemExit(1)


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

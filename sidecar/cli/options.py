"""The options the commands share: one flag per setting of the config model (`snapshot`, `run`
and `doctor`), parsed in the setting's unit by the config layer (sidecar/config/load.py), so an
error names the flag; a flag left out leaves the file's value alone (click's defaults only show).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import click
from click.core import ParameterSource

from sidecar.config import units
from sidecar.config.load import FLAGS, load_config, unit_of
from sidecar.config.settings import Config
from sidecar.config.units import Unit
from sidecar.doctor import check_rule_files
from sidecar.errors import ConfigError

_R = TypeVar("_R")

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
HELP = {
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


def shown(default: Any, unit: Unit) -> str | bool:
    if default is None:
        return False
    if unit is units.SECONDS:
        return f"{default:g}s"
    return f"{100 * default:g}%" if unit is units.SHARE else True


def _param(key: str) -> str:
    return FLAGS[key].lstrip("-").replace("-", "_")


def setting_options(
    defaults: Config, keys: tuple[str, ...]
) -> Callable[[Callable[..., _R]], Callable[..., _R]]:
    """--config and a flag per setting; values stay text until the config layer parses them.
    `defaults` are shown in --help only: a flag left out is not passed on (see `_typed`)."""

    def decorate(f: Callable[..., _R]) -> Callable[..., _R]:
        for key in reversed(keys):
            flag, help_text = FLAGS[key], HELP[key]
            if key in _BOOLS:
                f = click.option(f"{flag}/--no-{flag[2:]}", default=None, help=help_text)(f)
                continue
            section, _, name = key.rpartition(".")
            default = getattr(getattr(defaults, section) if section else defaults, name)
            unit = unit_of(key)
            f = click.option(flag, type=click.STRING, metavar=_METAVARS.get(unit.name, "TEXT"),
                             default=default, show_default=shown(default, unit),
                             help=help_text)(f)  # fmt: skip
        return click.option("--config", "config_path", type=click.Path(path_type=Path),
                            help="YAML config (`config example` prints one).")(f)  # fmt: skip

    return decorate


def given(ctx: click.Context) -> dict[str, Any]:
    """The options given on the command line, by parameter name."""
    return {
        name: value
        for name, value in ctx.params.items()
        if ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)
    }


def settings_from(
    ctx: click.Context, keys: tuple[str, ...], defaults: Config
) -> tuple[Config, Path | None, dict[str, Any]]:
    """The config for `keys`' flags on top of --config and the environment; the flags too, in
    the config layer's form, for the daemon to re-apply on SIGHUP."""
    typed = given(ctx)
    flags = {key: typed[_param(key)] for key in keys if _param(key) in typed}
    if flags.get("target.pid") is not None or flags.get("target.pid_file") is not None:
        flags.setdefault("target.discover", False)  # a named target over the file's discovery
    path = ctx.params.get("config_path")
    config = load_config(path, flags=flags, defaults=defaults)
    check_rule_files(config)
    return config, path, flags


def when(text: str, flag: str, now: float) -> datetime:
    """A duration back from `now` (7d, 12h, 90m) or a UTC time (2026-11-20, 2026-11-20T06:00)."""
    try:
        return datetime.fromtimestamp(units.moment(text, now), tz=UTC)
    except units.Unfit as exc:
        raise ConfigError(f"{flag} {text!r} {exc}") from None


def snapshot_of(path: Path, host: str | None) -> tuple[Path, str | None]:
    """The snapshot folder PATH names: itself, or the latest snapshot of the output, host or
    deployment folder it is (HOST picks one where it holds several); with the folder chosen,
    for the header (None: PATH itself)."""
    from sidecar.report.page_inputs import latest_snapshot
    from sidecar.store.layout import OutputTree
    from sidecar.store.summary_io import SUMMARY_NAME

    tree = OutputTree(path)
    if (path.is_dir() and not (path / SUMMARY_NAME).is_file()
            and (host is not None or tree.snapshots() or tree.hosts())):  # fmt: skip
        chosen = latest_snapshot(tree.host_folder(host))
        return chosen, str(chosen)
    if host is not None:
        raise ConfigError("--host goes with an output folder, not a snapshot folder")
    return path, None

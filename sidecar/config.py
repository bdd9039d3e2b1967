"""The daemon's configuration: defaults, then the YAML file, then VLLM_SIDECAR_* environment
variables, then flags; validated once into a frozen `Config` (STYLE.md 5).

Every error names where the bad value came from (file key, variable or flag) and what fits.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from sidecar.errors import ConfigError

ENV_PREFIX = "VLLM_SIDECAR_"


@dataclass(frozen=True, slots=True)
class TargetConfig:
    pid: int | None = None  # any process of the vLLM server
    pid_file: Path | None = None  # re-read on every rediscovery: follows redeploys
    discover: bool = True  # used when neither pid nor pid_file is set
    proc_root: Path = Path("/proc")
    host_proc: Path | None = None  # the host's /proc, to map NVML's host PIDs in a container
    any_python: bool = False
    start_timeout_s: float = 120.0  # at start, wait this long for vLLM to appear, then exit 4


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    rate_hz: float = 5.0
    cpu_budget: float | None = 0.02  # share of one core; None keeps rate_hz fixed
    py_spy: str | None = None


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    window_s: float = 60.0  # how long each snapshot samples
    interval_s: float = 300.0  # a window starts every interval_s (>= window_s)
    baseline_every_s: float = 3600.0  # baselines on wall-clock multiples: on the hour
    jitter_s: float = 0.0  # random delay per window, against lining up with periodic load


@dataclass(frozen=True, slots=True)
class OutputConfig:
    dir: Path = Path("/var/lib/vllm-sidecar")
    retention_days: float = 7.0
    baseline_retention_days: float = 90.0
    max_total_mb: float = 2048.0
    min_free_mb: float = 512.0


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    url: str | None = None  # vLLM /metrics; from the API server's --host/--port when unset
    timeout_s: float = 2.0


@dataclass(frozen=True, slots=True)
class Config:
    target: TargetConfig = TargetConfig()
    sampling: SamplingConfig = SamplingConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    output: OutputConfig = OutputConfig()
    metrics: MetricsConfig = MetricsConfig()
    exporter_listen: str = "127.0.0.1:9464"  # "off" disables the sidecar's own /metrics
    gpu: bool = True
    log_level: str = "info"
    source: str = "defaults"


_SECTIONS: dict[str, type] = {
    "target": TargetConfig, "sampling": SamplingConfig, "schedule": ScheduleConfig,
    "output": OutputConfig, "metrics": MetricsConfig,
}  # fmt: skip
_TOP = {"exporter_listen": str, "gpu": bool, "log_level": str}
_LOG_LEVELS = ("debug", "info", "warning", "error")


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
) -> Config:
    """defaults -> YAML -> environment -> flags. `flags` keys are `section.key` or top keys."""
    layers: list[tuple[str, dict[str, Any]]] = []
    if path is not None:
        layers.append((str(path), _yaml_layer(path)))
    layers.append(("environment", _env_layer(os.environ if environ is None else environ)))
    layers.append(("flags", _dotted({k: v for k, v in (flags or {}).items() if v is not None})))
    config = Config()
    for where, layer in layers:
        config = _apply(config, layer, where)
    config = replace(config, source=str(path) if path else "defaults")
    validate(config)
    return config


def _yaml_layer(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of sections (target:, sampling:, ...)")
    return data


def _env_layer(environ: Mapping[str, str]) -> dict[str, Any]:
    """VLLM_SIDECAR_OUTPUT_DIR=/x -> {"output": {"dir": "/x"}}; VLLM_SIDECAR_GPU=false too."""
    layer: dict[str, Any] = {}
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        section = next((s for s in _SECTIONS if key.startswith(s + "_")), None)
        if section:
            layer.setdefault(section, {})[key[len(section) + 1 :]] = value
        elif key in _TOP:
            layer[key] = value
        else:
            raise ConfigError(
                f"unknown environment variable {name}: use {ENV_PREFIX}<SECTION>_<KEY>, "
                f"sections {sorted(_SECTIONS)} or {sorted(k.upper() for k in _TOP)}"
            )
    return layer


def _dotted(flags: Mapping[str, Any]) -> dict[str, Any]:
    layer: dict[str, Any] = {}
    for key, value in flags.items():
        section, _, name = key.partition(".")
        if name:
            layer.setdefault(section, {})[name] = value
        else:
            layer[key] = value
    return layer


def _apply(config: Config, layer: Mapping[str, Any], where: str) -> Config:
    changes: dict[str, Any] = {}
    for key, value in layer.items():
        if key in _SECTIONS:
            if not isinstance(value, Mapping):
                raise ConfigError(f"{where}: `{key}` must be a mapping of settings")
            changes[key] = _apply_section(getattr(config, key), value, f"{where}: {key}")
        elif key in _TOP:
            changes[key] = _coerce(value, _TOP[key], f"{where}: {key}")
        else:
            raise ConfigError(
                f"{where}: unknown setting `{key}`; known: {sorted([*_SECTIONS, *_TOP])}"
            )
    return replace(config, **changes)


def _apply_section(section: Any, values: Mapping[str, Any], where: str) -> Any:
    types = {f.name: f.type for f in fields(section)}
    changes = {}
    for key, value in values.items():
        if key not in types:
            raise ConfigError(f"{where}.{key}: unknown setting; known: {sorted(types)}")
        changes[key] = _coerce(value, types[key], f"{where}.{key}")
    return replace(section, **changes)


_NULLS = ("", "null", "none", "off")


def _coerce(value: Any, kind: Any, where: str) -> Any:
    text = str(kind)
    optional = "None" in text
    if value is None or (optional and isinstance(value, str) and value.lower() in _NULLS):
        if optional:
            return None
        raise ConfigError(f"{where}: a value is required")
    try:
        if "bool" in text:
            return _bool(value)
        if "int" in text and "float" not in text:
            return int(value)
        if "float" in text:
            return _number(value)
        if "Path" in text:
            return Path(str(value))
        return str(value)
    except (ValueError, TypeError):
        raise ConfigError(f"{where}: {value!r} is not a valid {text}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(value)


def _number(value: Any) -> float:
    """`2%` -> 0.02, `90s`/`5m`/`1h`/`7d` -> seconds, else a plain number."""
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip().lower()
    if text.endswith("%"):
        return float(text[:-1]) / 100
    unit = re.fullmatch(r"([\d.]+)\s*(s|m|h|d)", text)
    if unit:
        return float(unit[1]) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit[2]]
    return float(text)


def validate(c: Config) -> None:
    s = c.schedule
    if s.window_s <= 0 or s.interval_s <= 0:
        raise ConfigError("schedule.window_s and schedule.interval_s must be positive")
    if s.interval_s < s.window_s:
        raise ConfigError(
            f"schedule.interval_s ({s.interval_s:g}) is shorter than window_s "
            f"({s.window_s:g}): windows would overlap; raise interval_s or lower window_s"
        )
    if s.baseline_every_s < s.interval_s:
        raise ConfigError("schedule.baseline_every_s must be at least schedule.interval_s")
    if c.sampling.rate_hz <= 0 or c.sampling.rate_hz > 1000:
        raise ConfigError("sampling.rate_hz must be in (0, 1000]")
    if c.sampling.cpu_budget is not None and not 0 < c.sampling.cpu_budget <= 1:
        raise ConfigError("sampling.cpu_budget is a share of one core: between 0 and 1 (100%)")
    if c.target.pid is not None and c.target.pid_file is not None:
        raise ConfigError("give target.pid or target.pid_file, not both")
    if c.output.min_free_mb < 0 or c.output.max_total_mb <= 0:
        raise ConfigError("output.min_free_mb must be >= 0 and output.max_total_mb > 0")
    if c.log_level.lower() not in _LOG_LEVELS:
        raise ConfigError(f"log_level must be one of {_LOG_LEVELS}")

"""The one configuration of `run`, `doctor` and `snapshot`: defaults, then the YAML file, then
VLLM_SIDECAR_* environment variables, then flags; validated once into a frozen `Config`
(STYLE.md 5), at start and again on SIGHUP.

Each setting declares its unit (sidecar/config/units.py), so `7d` is seven days for a days
setting and
604800 for a seconds one, and `2%` is refused for a size. Every error names the setting, where
its value came from (file, variable or flag) and what fits.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from sidecar.config.custom_metrics import parse_custom_metrics
from sidecar.config.packaged import load_yaml
from sidecar.config.settings import (
    CREDENTIAL_KEYS,
    CREDENTIALS_HELP,
    Config,
    SnapshotOptions,
)
from sidecar.config.targets import parse_targets
from sidecar.config.units import Unfit, Unit, kind_of
from sidecar.errors import ConfigError
from sidecar.records.window import SamplingMode

ENV_PREFIX = "VLLM_SIDECAR_"
# VLLM_SIDECAR_* variables the project documents for something other than a setting: accepted
# and ignored here, so that an operator's shell that sets them can still start the sidecar.
NOT_SETTINGS = (
    "VLLM_SIDECAR_CACHE",  # devtools/vllm_env.py, Makefile, scripts/validate-deploy.sh, README
)
_NULLS = ("", "null", "none", "off")


# and an error names the flag the operator typed.
FLAGS: Mapping[str, str] = {
    "target.pid": "--pid", "target.pid_file": "--pid-file", "target.discover": "--discover",
    "target.proc_root": "--proc-root", "target.host_proc": "--host-proc",
    "target.any_python": "--any-python", "sampling.rate_hz": "--rate",
    "sampling.cpu_budget": "--cpu-budget", "sampling.py_spy": "--py-spy",
    "sampling.segment_s": "--segment", "sampling.mode": "--mode",
    "sampling.continuous_budget": "--continuous-budget",
    "schedule.window_s": "--window", "schedule.interval_s": "--interval",
    "schedule.baseline_every_s": "--baseline-every", "output.dir": "--out",
    "metrics.url": "--metrics-url", "exporter_listen": "--exporter-listen", "gpu": "--gpu",
    "rules": "--rules", "advice": "--advice",
}  # fmt: skip
SNAPSHOT_FLAGS: Mapping[str, str] = {
    "out": "--out", "duration_s": "--duration", "as_json": "--json"
}  # fmt: skip

_SECTIONS: dict[str, Any] = {f.name: f.default for f in fields(Config) if is_dataclass(f.default)}


def _settings(record: Any) -> dict[str, Field[Any]]:
    return {f.name: f for f in fields(record) if "unit" in f.metadata}


def _all_keys() -> list[str]:
    nested = [f"{s}.{k}" for s, d in _SECTIONS.items() for k in _settings(d)]
    return nested + list(_settings(Config))


# VLLM_SIDECAR_OUTPUT_MAX_TOTAL_MB -> output.max_total_mb, for every setting.
ENV_VARIABLES = {ENV_PREFIX + key.replace(".", "_").upper(): key for key in _all_keys()}

Entry = tuple[str, Any, str]  # (setting as `section.key` or `key`, raw value, where it came from)


def load_config(
    path: Path | None = None,
    environ: Mapping[str, str] | None = None,
    flags: Mapping[str, Any] | None = None,
    defaults: Config = Config(),  # frozen: one shared instance is safe
    origin: Callable[[str], str] | None = None,
) -> Config:
    """defaults -> YAML -> environment -> flags. `flags` keys are `section.key` or top keys;
    `origin` names where a flag's value came from in errors (default: the CLI flag, `flag
    --rate`; the Python API names its argument, `Profiler(rate=...)`).

    Raises ConfigError, and nothing else, for any bad input. The rules and advice files a
    config names are files of their own, checked where they are loaded at start (and again on
    reload): `doctor.check_rule_files` and the daemon's parts.
    """
    data = _read_yaml(Path(path)) if path is not None else {}
    entries = [
        *(_file_entries(data, Path(path)) if path is not None else ()),
        *_env_entries(os.environ if environ is None else environ),
        # A flag left out arrives as None: it leaves the layers below alone.
        *((k, v, (origin or _flag_origin)(k)) for k, v in (flags or {}).items() if v is not None),
    ]
    config, origins = _apply(defaults, entries)
    custom = (parse_custom_metrics(data[CUSTOM], f"file {path}") if CUSTOM in data
              else defaults.custom_metrics)  # fmt: skip
    targets = (parse_targets(data[TARGETS], f"file {path}") if TARGETS in data
               else defaults.targets)  # fmt: skip
    config = replace(config, source=str(path) if path else "defaults", custom_metrics=custom,
                     targets=targets)  # fmt: skip
    validate(config)
    return replace(config, origins=tuple(origins.items()))


def _flag_origin(key: str) -> str:
    return f"flag {FLAGS.get(key, key)}"


def snapshot_options(values: Mapping[str, Any]) -> SnapshotOptions:
    """`snapshot`'s own flags (`out`, `duration_s`, `as_json`), parsed in the same units."""
    known = _settings(SnapshotOptions)
    changes = {}
    for name, value in values.items():
        flag = SNAPSHOT_FLAGS.get(name, name)
        if name not in known:
            raise ConfigError(f"{flag}: not an option of snapshot")
        changes[name] = _parse(known[name], value, flag.lstrip("-"), f"flag {flag}")
    return replace(SnapshotOptions(), **changes)


# ------------------------------------------------------------------------------------- layers


CUSTOM = "custom_metrics"
TARGETS = "targets"


def _file_entries(data: Mapping[Any, Any], path: Path) -> Iterator[Entry]:
    where = f"file {path}"
    for key, value in data.items():
        if key in (CUSTOM, TARGETS):
            continue  # a list of entries, not a setting: parse_custom_metrics/_targets read it
        if key in _SECTIONS and value is None:
            continue  # a section with every setting commented out
        if key in _SECTIONS and not isinstance(value, Mapping):
            raise ConfigError(f"{key}: is {kind_of(value)} in {path}; give a mapping of "
                              f"its settings ({key}: {{...}})")  # fmt: skip
        if key in _SECTIONS:
            yield from ((f"{key}.{sub}", v, where) for sub, v in value.items())
        else:
            yield str(key), value, where


def _read_yaml(path: Path) -> Mapping[Any, Any]:
    try:
        data = load_yaml(path.read_text(encoding="utf-8"), str(path))
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path} is not UTF-8 text ({exc.reason}): give a YAML file") from None
    except (yaml.YAMLError, RecursionError) as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections (target:, sampling:, ...)")
    return data


def _env_entries(environ: Mapping[str, str]) -> Iterator[Entry]:
    """VLLM_SIDECAR_OUTPUT_DIR=/x -> ("output.dir", "/x"); VLLM_SIDECAR_GPU=false too."""
    for name, value in environ.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS:
            continue
        upload = name.removeprefix(ENV_PREFIX + "UPLOAD_")
        if upload != name and upload.lower() in CREDENTIAL_KEYS:
            raise ConfigError(f"{name}: refused; {CREDENTIALS_HELP}")
        if name not in ENV_VARIABLES:
            guess = difflib.get_close_matches(name, ENV_VARIABLES, n=1)
            raise ConfigError(
                f"unknown environment variable {name}"
                + (f": did you mean {guess[0]}?" if guess else "")
                + f" Settings are {ENV_PREFIX}<SECTION>_<KEY>: {', '.join(ENV_VARIABLES)}"
            )
        yield ENV_VARIABLES[name], value, f"variable {name}"


def _apply(base: Config, entries: list[Entry]) -> tuple[Config, dict[str, str]]:
    """Each entry parsed in its setting's unit, later ones over earlier ones."""
    values: dict[str, Any] = {}
    origins: dict[str, str] = {}
    for key, raw, where in entries:
        values[key] = _parse(_field_for(key, where), raw, key, where)
        origins[key] = where
    top = {k: v for k, v in values.items() if "." not in k}
    for section in _SECTIONS:
        mine = {k.partition(".")[2]: v for k, v in values.items() if k.startswith(section + ".")}
        top[section] = replace(getattr(base, section), **mine)
    return replace(base, **top), origins


def _field_for(key: str, where: str) -> Field[Any]:
    section, dot, name = key.partition(".")
    if section == "upload" and name.lower() in CREDENTIAL_KEYS:
        raise ConfigError(f"{key}: refused ({where}); {CREDENTIALS_HELP}")
    if dot and section in _SECTIONS:
        known = _settings(_SECTIONS[section])
        if name not in known:
            raise ConfigError(f"{key}: unknown setting ({where}); known: {sorted(known)}")
        return known[name]
    top = _settings(Config)
    if dot or key not in top:
        names = sorted([*_SECTIONS, *top, CUSTOM, TARGETS])
        raise ConfigError(f"unknown setting `{key}` ({where}); known: {names}")
    return top[key]


def unit_of(key: str) -> Unit:
    """The unit of a setting (`section.key` or a top key), e.g. for a flag's help."""
    unit_: Unit = _field_for(key, "a lookup").metadata["unit"]
    return unit_


def _parse(f: Field[Any], raw: Any, key: str, where: str) -> Any:
    unit: Unit = f.metadata["unit"]
    if raw is None or (f.metadata["optional"] and isinstance(raw, str) and raw.strip().lower()
                       in _NULLS):  # fmt: skip
        if f.metadata["optional"]:
            return None
        raise ConfigError(f"{key}: a value is required; {unit.hint} ({where})")
    try:
        value = unit.parse(raw)
        if f.metadata["positive"] and value == 0:
            raise Unfit("is zero")
    except Unfit as exc:
        shown = re.sub(r"//[^/@\s]*@", "//***@", repr(raw))  # never echo a secret to a log
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ConfigError(f"{key}: {shown} {exc}; {unit.hint} ({where})") from None
    return value


# -------------------------------------------------------------------------------- cross-checks


def validate(c: Config) -> None:
    """What no one setting can say alone: how settings fit together."""
    s = c.schedule
    # window_s is the windows mode's alone: a continuous period is the whole interval.
    if c.sampling.mode == SamplingMode.WINDOWS and s.interval_s < s.window_s:
        raise ConfigError(
            f"schedule.interval_s ({s.interval_s:g}) is shorter than window_s "
            f"({s.window_s:g}): windows would overlap; raise interval_s or lower window_s"
        )
    if s.baseline_every_s < s.interval_s:
        raise ConfigError(
            f"schedule.baseline_every_s ({s.baseline_every_s:g}) must be at least "
            f"schedule.interval_s ({s.interval_s:g})"
        )
    ratio = s.baseline_every_s / s.interval_s
    if c.sampling.mode == SamplingMode.CONTINUOUS and abs(ratio - round(ratio)) > 1e-9:
        raise ConfigError(
            f"schedule.baseline_every_s ({s.baseline_every_s:g}) is not a whole multiple of "
            f"schedule.interval_s ({s.interval_s:g}): in continuous mode a baseline is its "
            "periods put together; make it a multiple (e.g. 3600 and 300), or set "
            "sampling.mode: windows"
        )
    endpoint = c.upload.endpoint_url
    if endpoint is not None and "@" in endpoint.split("//", 1)[-1].split("/", 1)[0]:
        raise ConfigError(f"upload.endpoint_url holds credentials; {CREDENTIALS_HELP}")
    if c.upload.backoff_max_s < c.upload.backoff_s:
        raise ConfigError(
            f"upload.backoff_max_s ({c.upload.backoff_max_s:g}) is shorter than backoff_s "
            f"({c.upload.backoff_s:g}); raise backoff_max_s"
        )
    if c.targets and c.metrics.url is not None:
        raise ConfigError(
            "metrics.url names one server, and `targets:` lists several: give metrics_url on "
            "the targets entry it belongs to, or leave it out (each URL comes from its --port)"
        )
    if c.target.pid is not None and c.target.pid_file is not None:
        raise ConfigError("give target.pid or target.pid_file, not both")


def check_fleet_target(c: Config) -> None:
    """`run` and `doctor` with `targets:`: the daemon follows the servers the entries name, so
    target.pid or target.pid_file (one server) would be ignored; refused instead, naming the
    fix. Not in `validate`: `snapshot --pid N` takes one server from a config that lists a
    fleet, and the file's `targets:` is rightly ignored there."""
    t = c.target
    given = [f"target.{key} {value}" for key, value in (("pid", t.pid), ("pid_file", t.pid_file))
             if value is not None]  # fmt: skip
    if c.targets and given:
        raise ConfigError(
            f"{' and '.join(given)} (--pid, --pid-file, VLLM_SIDECAR_TARGET_PID[_FILE] or "
            f"target: in the file) names one server, and `targets:` in {c.source} lists the "
            "servers this daemon follows, so it would be ignored: add it to targets: as an "
            "entry (`- pid: N` or `- pid_file: PATH`) and drop it from target:, or remove "
            "targets: to profile that one server"
        )

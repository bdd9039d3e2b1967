"""The one configuration of `run`, `doctor` and `snapshot`: defaults, then the YAML file, then
VLLM_SIDECAR_* environment variables, then flags; validated once into a frozen `Config`
(STYLE.md 5), at start and again on SIGHUP.

Each setting declares its unit (sidecar/units.py), so `7d` is seven days for a days setting and
604800 for a seconds one, and `2%` is refused for a size. Every error names the setting, where
its value came from (file, variable or flag) and what fits.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import Field, dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from sidecar import units as u
from sidecar.advice_rules import load_advice
from sidecar.custom_spec import CustomMetricSpec, parse_custom_metrics
from sidecar.errors import ConfigError
from sidecar.rules import load_rules
from sidecar.target_spec import TargetSpec, parse_targets
from sidecar.units import Unfit, Unit, kind_of

ENV_PREFIX = "VLLM_SIDECAR_"
# VLLM_SIDECAR_* variables the project documents for something other than a setting: accepted
# and ignored here, so that an operator's shell that sets them can still start the sidecar.
NOT_SETTINGS = (
    "VLLM_SIDECAR_CACHE",  # devtools/vllm_env.py, Makefile, scripts/validate-deploy.sh, README
)
_NULLS = ("", "null", "none", "off")


def unit(kind: Unit, *, optional: bool = False, positive: bool = False) -> dict[str, Any]:
    """A setting's field metadata: it takes values in `kind`; `optional`: null (or `none`,
    `off`, empty) unsets it; `positive`: zero is refused too."""
    return {"unit": kind, "optional": optional, "positive": positive}


@dataclass(frozen=True, slots=True)
class TargetConfig:
    # Any process of the vLLM server.
    pid: int | None = field(default=None, metadata=unit(u.PID, optional=True))
    # Re-read on every rediscovery: follows redeploys.
    pid_file: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    # Used when neither pid nor pid_file is set.
    discover: bool = field(default=True, metadata=unit(u.BOOL))
    proc_root: Path = field(default=Path("/proc"), metadata=unit(u.PATH))
    # The host's /proc, to map NVML's host PIDs in a container.
    host_proc: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    any_python: bool = field(default=False, metadata=unit(u.BOOL))
    # At start, wait this long for vLLM to appear, then exit 4.
    start_timeout_s: float = field(default=120.0, metadata=unit(u.SECONDS))
    # With `targets:`: how often the entries are rediscovered for servers that came or went
    # (a /proc scan: about 0.2 ms of CPU per process on the host, measured here).
    rescan_s: float = field(default=5.0, metadata=unit(u.SECONDS, positive=True))
    # With `targets:`: a server down (gone, not found again) this long is dropped from the
    # exporter, so that one removed for good stops showing `target_up 0` and firing
    # VllmTargetDown; its folder and snapshots stay, and it is exported again if it returns.
    # None: never.
    forget_after_s: float | None = field(
        default=3600.0, metadata=unit(u.SECONDS, optional=True, positive=True)
    )


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    # continuous: every process sampled all the time at a low rate per role, within
    # `continuous_budget`, each period of `schedule.interval_s` a snapshot and the hour its
    # baseline (sidecar/continuous.py); windows: `schedule.window_s` in every `interval_s` at
    # `rate_hz`, within `cpu_budget`.
    mode: str = field(default="continuous", metadata=unit(u.SAMPLING_MODE))
    # Continuous mode: the whole sidecar (itself and py-spy) within this share of one core.
    continuous_budget: float = field(default=0.01, metadata=unit(u.SHARE, positive=True))
    # Continuous mode: the least rate of the EngineCore and workers whatever the budget says
    # (the API server's is a quarter of it); below 1 Hz py-spy samples part of each segment.
    continuous_min_hz: float = field(default=0.5, metadata=unit(u.HERTZ, positive=True))
    # Continuous mode: py-spy runs per process in segments of this length (its start and
    # attach are paid once a segment); each segment is a block for `diff`.
    continuous_segment_s: float = field(default=100.0, metadata=unit(u.SECONDS, positive=True))
    rate_hz: float = field(default=5.0, metadata=unit(u.HERTZ))
    # A share of one core; None keeps rate_hz fixed.
    cpu_budget: float | None = field(default=0.02, metadata=unit(u.SHARE, optional=True))
    py_spy: str | None = field(default=None, metadata=unit(u.COMMAND, optional=True))
    # py-spy runs in segments of this length (the rate adapts between them); each segment's
    # counts are kept apart, the units `diff` estimates its intervals from (README, Comparing).
    segment_s: float = field(default=10.0, metadata=unit(u.SECONDS, positive=True))


@dataclass(frozen=True, slots=True)
class ScheduleConfig:
    # How long each window samples; a window starts every interval_s (>= window_s).
    window_s: float = field(default=60.0, metadata=unit(u.SECONDS, positive=True))
    interval_s: float = field(default=300.0, metadata=unit(u.SECONDS, positive=True))
    # Baselines on wall-clock multiples: on the hour.
    baseline_every_s: float = field(default=3600.0, metadata=unit(u.SECONDS, positive=True))
    # A random delay per window, against lining up with periodic load.
    jitter_s: float = field(default=0.0, metadata=unit(u.SECONDS))


@dataclass(frozen=True, slots=True)
class OutputConfig:
    dir: Path = field(default=Path("/var/lib/vllm-sidecar"), metadata=unit(u.PATH))
    retention_days: float = field(default=7.0, metadata=unit(u.DAYS))
    baseline_retention_days: float = field(default=90.0, metadata=unit(u.DAYS))
    max_total_mb: float = field(default=2048.0, metadata=unit(u.MEGABYTES, positive=True))
    min_free_mb: float = field(default=512.0, metadata=unit(u.MEGABYTES))


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    # vLLM's /metrics; from the API server's --host/--port when unset.
    url: str | None = field(default=None, metadata=unit(u.URL, optional=True))
    timeout_s: float = field(default=2.0, metadata=unit(u.SECONDS, positive=True))


@dataclass(frozen=True, slots=True)
class UploadConfig:
    # s3://bucket/prefix: each finished snapshot folder goes under it (sidecar/upload.py);
    # None: nothing is uploaded. Credentials come from the AWS chain (environment, ~/.aws, an
    # instance role), never from this file: `key`/`secret` here are refused (CREDENTIAL_KEYS).
    url: str | None = field(default=None, metadata=unit(u.OBJECT_URL, optional=True))
    # An S3-compatible store's API (MinIO, Ceph, R2, moto); None: AWS's own endpoints.
    endpoint_url: str | None = field(default=None, metadata=unit(u.URL, optional=True))
    # After a failed try the backlog waits backoff_s, doubled per failure up to backoff_max_s.
    backoff_s: float = field(default=5.0, metadata=unit(u.SECONDS, positive=True))
    backoff_max_s: float = field(default=600.0, metadata=unit(u.SECONDS, positive=True))
    # Per request (connect and read); botocore's own retries are kept to `retries`.
    timeout_s: float = field(default=10.0, metadata=unit(u.SECONDS, positive=True))
    retries: int = field(default=2, metadata=unit(u.COUNT))


# Settings that would put a secret in the config file in plain text: refused with the fix.
CREDENTIAL_KEYS = frozenset({
    "key", "secret", "token", "access_key", "secret_key", "access_key_id", "secret_access_key",
    "aws_access_key_id", "aws_secret_access_key", "aws_session_token", "session_token",
    "password", "credentials",
})  # fmt: skip
AWS_CHAIN_HELP = (
    "give them through the standard AWS chain: AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in "
    "the service's environment (systemd: EnvironmentFile=, Docker: env_file:), a profile in "
    "~/.aws/credentials (AWS_PROFILE), or an instance role"
)
CREDENTIALS_HELP = "credentials never go in the sidecar's config: " + AWS_CHAIN_HELP


@dataclass(frozen=True, slots=True)
class HangConfig:
    # Watch the engine for stalls (sidecar/hang.py): a /metrics scrape every check_s.
    enabled: bool = field(default=True, metadata=unit(u.BOOL))
    check_s: float = field(default=5.0, metadata=unit(u.SECONDS, positive=True))
    # Work pending, no step, and the engine's main-thread stacks the same in every dump this
    # long: stalled (a long step moves through the model's layers; a frozen one does not).
    stack_after_s: float = field(default=30.0, metadata=unit(u.SECONDS, positive=True))
    # Work pending and no step this long, whatever the stacks do: stalled.
    stall_after_s: float = field(default=120.0, metadata=unit(u.SECONDS, positive=True))
    # An incident's `py-spy dump --native` of one process may take this long.
    dump_timeout_s: float = field(default=30.0, metadata=unit(u.SECONDS, positive=True))


@dataclass(frozen=True, slots=True)
class TriggerConfig:
    # The daemon's local control socket for `vllm-sidecar trigger` (a Unix socket, mode 0600,
    # never a network port); None: OUTPUT_DIR/control.sock.
    socket: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    # A snapshot on a trigger samples this long at sampling.rate_hz, beside continuous sampling.
    window_s: float = field(default=20.0, metadata=unit(u.SECONDS, positive=True))
    # Latency trigger: p95 time to first token over the last `over_s` above this; None: off.
    ttft_p95_s: float | None = field(
        default=None, metadata=unit(u.SECONDS, optional=True, positive=True)
    )
    # Queue trigger: this many requests waiting or more; None: off.
    queue_length: int | None = field(default=None, metadata=unit(u.COUNT, optional=True))
    over_s: float = field(default=60.0, metadata=unit(u.SECONDS, positive=True))
    # The latency and queue triggers fire at most once in this long.
    min_interval_s: float = field(default=600.0, metadata=unit(u.SECONDS))


@dataclass(frozen=True, slots=True)
class Config:
    target: TargetConfig = TargetConfig()
    sampling: SamplingConfig = SamplingConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    output: OutputConfig = OutputConfig()
    metrics: MetricsConfig = MetricsConfig()
    upload: UploadConfig = UploadConfig()
    hang: HangConfig = HangConfig()
    trigger: TriggerConfig = TriggerConfig()
    # The sidecar's own /metrics; "off" disables it.
    exporter_listen: str = field(default="127.0.0.1:9464", metadata=unit(u.LISTEN))
    gpu: bool = field(default=True, metadata=unit(u.BOOL))
    log_level: str = field(default="info", metadata=unit(u.LOG_LEVEL))
    # The phases.yaml to classify with; None: the built-in rules.
    rules: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    # The advice.yaml the findings come from; None: the built-in configs/advice.yaml.
    advice: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    # Extra Prometheus series per snapshot (sidecar/custom_spec.py): a list, so the file only
    # (no variable or flag sets it); validated on load like every setting.
    custom_metrics: tuple[CustomMetricSpec, ...] = ()
    # The vLLM servers one daemon follows together (target_spec.py, multi_target.py):
    # a list, in the file only; empty: `target` names the one server, as before.
    targets: tuple[TargetSpec, ...] = ()
    source: str = "defaults"  # not a setting: the file the configuration came from


# `snapshot` is one window an operator asked for: a fixed rate unless given a budget, and a
# target named (--pid, --pid-file or --discover) rather than found; the daemon's defaults suit
# weeks of unattended running. A --config file or a variable can still set either.
SNAPSHOT_DEFAULTS = Config(
    target=TargetConfig(discover=False), sampling=SamplingConfig(cpu_budget=None)
)


@dataclass(frozen=True, slots=True)
class SnapshotOptions:
    """What `snapshot` takes besides the shared `Config`, in the same units."""

    out: Path = field(default=Path("."), metadata=unit(u.PATH))  # OUT/<UTC timestamp>/
    duration_s: float = field(default=10.0, metadata=unit(u.SECONDS, positive=True))
    as_json: bool = field(default=False, metadata=unit(u.BOOL))


# The command-line flag of each setting that has one: cli.py declares its options from this,
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

    Raises ConfigError, and nothing else, for any bad input; the rules file a config names is
    loaded once here, so a broken one fails the start (or the reload) rather than a window.
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
    _check_rules(config, origins.get("rules", "defaults"))
    _check_advice(config, origins.get("advice", "defaults"))
    return config


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
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
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
    if c.sampling.mode == "windows" and s.interval_s < s.window_s:
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
    if c.sampling.mode == "continuous" and abs(ratio - round(ratio)) > 1e-9:
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


def _check_rules(config: Config, where: str) -> None:
    if config.rules is None:
        return  # the built-in rules: tested with the package, not re-read on every start
    try:
        load_rules(config.rules)
    except ConfigError as exc:
        raise ConfigError(f"rules: {exc} ({where})") from None
    except ValueError as exc:  # UnicodeDecodeError: load_rules reads UTF-8 text
        raise ConfigError(f"rules: {config.rules} is not a rules file ({exc}) ({where})") from None


def _check_advice(config: Config, where: str) -> None:
    if config.advice is None:
        return  # the built-in advice rules: tested with the package
    try:
        load_advice(config.advice)
    except ConfigError as exc:
        raise ConfigError(f"advice: {exc} ({where})") from None

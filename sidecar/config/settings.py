"""The configuration's settings: one frozen section a concern, each field with its unit
(sidecar/config/units.py) in its metadata. Loading them (defaults, file, environment, flags) is
sidecar/config/load.py's; nothing here reads a file, so any module may hold a section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sidecar.config import units as u
from sidecar.config.custom_metrics import CustomMetricSpec
from sidecar.config.targets import TargetSpec
from sidecar.config.units import Unit
from sidecar.errors import ConfigError, SidecarError
from sidecar.records.window import SamplingMode


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
    # baseline (sidecar/sampling/continuous.py); windows: `schedule.window_s` in every
    # `interval_s` at `rate_hz`, within `cpu_budget`.
    mode: SamplingMode = field(default=SamplingMode.CONTINUOUS, metadata=unit(u.SAMPLING_MODE))
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
    # Each segment is cut into time slices this long (py-spy's speedscope output keeps the
    # samples' order): the units of the phase shares in `diff`, chosen from samples recorded in
    # order on a real server (sidecar/analyze/slices.py). A long window's slices are longer, at
    # most MAX_SLICES a window. None: the segments are the units (py-spy's raw output).
    unit_s: float | None = field(
        default=2.0, metadata=unit(u.SECONDS, optional=True, positive=True)
    )


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
    # s3://bucket/prefix: each finished snapshot folder goes under it (sidecar/store/upload.py);
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
    # Watch the engine for stalls (sidecar/daemon/hang.py): a /metrics scrape every check_s.
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
    # The sidecar's own /metrics; "off" disables it. 19464: outside Prometheus' exporter
    # allocations (9100-9999, full, and on past 10000), below the ephemeral ports; 9464, the old
    # default, is OpenTelemetry's Prometheus exporter's.
    exporter_listen: str = field(default="127.0.0.1:19464", metadata=unit(u.LISTEN))
    gpu: bool = field(default=True, metadata=unit(u.BOOL))
    log_level: str = field(default="info", metadata=unit(u.LOG_LEVEL))
    # The phases.yaml to classify with; None: the built-in rules.
    rules: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    # The advice.yaml the findings come from; None: the built-in configs/advice.yaml.
    advice: Path | None = field(default=None, metadata=unit(u.PATH, optional=True))
    # Extra Prometheus series per snapshot (sidecar/config/custom_metrics.py): a list, so the
    # file only (no variable or flag sets it); validated on load like every setting.
    custom_metrics: tuple[CustomMetricSpec, ...] = ()
    # The vLLM servers one daemon follows together (target_spec.py, multi_target.py):
    # a list, in the file only; empty: `target` names the one server, as before.
    targets: tuple[TargetSpec, ...] = ()
    source: str = "defaults"  # not a setting: the file the configuration came from
    # Not a setting: where each setting given came from (`file PATH`, `variable NAME`, `flag
    # --rate`), as (setting, origin) pairs, for errors found after loading (the rules file).
    origins: tuple[tuple[str, str], ...] = field(default=(), compare=False)

    def origin(self, key: str) -> str:
        """Where setting `key` came from; "defaults" when nothing set it."""
        return dict(self.origins).get(key, "defaults")


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


_Loaded = TypeVar("_Loaded")


def load_named(config: Config, setting: str, load: Callable[[Path | None], _Loaded]) -> _Loaded:
    """What `load` reads from the file a path setting names (`rules`, `advice`; None: the
    built-in one), with an error that names the setting and where it was given. Whatever else
    `load` raises (a RecursionError from a file nested past the parser's reach, a MemoryError)
    is a ConfigError too: the file cannot be loaded, and a restart will not change that."""
    try:
        return load(getattr(config, setting))
    except ConfigError as exc:
        raise ConfigError(f"{setting}: {exc} ({config.origin(setting)})") from None
    except SidecarError:
        raise
    except Exception as exc:
        file = getattr(config, setting) or "the built-in file"
        raise ConfigError(f"{setting}: {file} cannot be loaded ({type(exc).__name__}: {exc}); "
                          "simplify or fix the file, or unset the setting to use the built-in "
                          f"one ({config.origin(setting)})") from exc  # fmt: skip

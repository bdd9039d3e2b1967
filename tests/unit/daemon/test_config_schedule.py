"""The daemon's config (defaults -> YAML -> environment -> flags) and its schedule (absolute
deadlines on a fake monotonic clock, baselines on the wall clock)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from sidecar.config.load import load_config
from sidecar.config.settings import Config, ScheduleConfig, TargetConfig
from sidecar.daemon.schedule import Schedule
from sidecar.errors import AttachError, ConfigError
from sidecar.store.layout import SnapshotKind
from sidecar.target.discovery import configured_target
from sidecar.target.procfs import ProcFs

EXAMPLE = Path(__file__).resolve().parents[3] / "configs" / "sidecar.yaml"


def test_documented_example_is_valid_and_means_the_defaults() -> None:
    config = load_config(EXAMPLE, environ={})
    assert config.schedule.interval_s == 300 and config.schedule.baseline_every_s == 3600
    assert config.sampling.cpu_budget == pytest.approx(0.02)
    assert config.exporter_listen == "127.0.0.1:19464"
    defaults = Config()
    assert (config.target, config.sampling, config.schedule, config.output) == (
        defaults.target, defaults.sampling, defaults.schedule, defaults.output,
    )  # fmt: skip


def test_precedence_file_then_environment_then_flags(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("output: {dir: /from/file}\nsampling: {rate_hz: 3}\nschedule: {window_s: 30}\n")
    config = load_config(
        path,
        environ={"VLLM_SIDECAR_OUTPUT_DIR": "/from/env", "VLLM_SIDECAR_SAMPLING_RATE_HZ": "7",
                 "VLLM_SIDECAR_GPU": "false", "HOME": "/root"},
        flags={"sampling.rate_hz": 9.0, "schedule.interval_s": "2m"},
    )  # fmt: skip
    assert config.output.dir == Path("/from/env")
    assert config.sampling.rate_hz == 9.0
    assert config.schedule.window_s == 30 and config.schedule.interval_s == 120
    assert config.gpu is False


@pytest.mark.parametrize(
    ("text", "environ", "message"),
    [
        ("samplng: {rate_hz: 3}", {}, "unknown setting `samplng`"),
        ("sampling: {rat_hz: 3}", {}, "sampling.rat_hz: unknown setting"),
        ("sampling: {rate_hz: fast}", {}, "sampling.rate_hz: 'fast' is not a number"),
        (
            "sampling: {mode: windows}\nschedule: {window_s: 600, interval_s: 60}",
            {},
            "windows would overlap",
        ),
        ("sampling: {cpu_budget: 150%}", {}, "between 0 and 1"),
        ("target: {pid: 12, pid_file: /run/vllm.pid}", {}, "not both"),
        ("[1, 2]", {}, "expected a mapping of sections"),
        (
            "",
            {"VLLM_SIDECAR_OUTPUTDIR": "/x"},
            "unknown environment variable VLLM_SIDECAR_OUTPUTDIR",
        ),
        ("log_level: loud", {}, "log_level: 'loud' is not a log level; give one of debug"),
    ],
)
def test_bad_config_names_the_setting(
    tmp_path: Path, text: str, environ: dict[str, str], message: str
) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_config(path, environ=environ)


def test_null_means_unset(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("sampling: {cpu_budget: null}\nmetrics: {url: none}\n")
    config = load_config(path, environ={})
    assert config.sampling.cpu_budget is None and config.metrics.url is None


class Clocks:
    """A monotonic clock and a wall clock that move together, as real ones do."""

    def __init__(self, mono: float = 1000.0, wall: float = 1_780_000_000.0) -> None:
        self.mono, self.wall_offset = mono, wall - mono

    def clock(self) -> float:
        return self.mono

    def wall(self) -> float:
        return self.mono + self.wall_offset


def schedule(
    window: float = 10, interval: float = 60, baseline: float = 3600
) -> tuple[Schedule, Clocks]:
    clocks = Clocks()
    cfg = ScheduleConfig(window_s=window, interval_s=interval, baseline_every_s=baseline)
    return Schedule(cfg, clocks.clock, clocks.wall), clocks


def run_window(s: Schedule, c: Clocks, length: float) -> tuple[SnapshotKind, float]:
    planned = s.plan()
    c.mono = max(c.mono, planned.start)
    s.started(planned)
    c.mono += length
    s.done(planned)
    return planned.kind, planned.start


def test_deadlines_are_absolute_and_do_not_drift() -> None:
    s, c = schedule()
    starts = [run_window(s, c, 10)[1] for _ in range(5)]
    assert [round(b - a, 6) for a, b in itertools.pairwise(starts)] == [60.0] * 4
    assert s.missed == 0


def test_a_window_that_overruns_misses_deadlines_instead_of_drifting() -> None:
    s, c = schedule(window=10, interval=60)
    first = run_window(s, c, 10)[1]
    run_window(s, c, 150)  # a window that took 150 s: the deadlines at +120 and +180 pass
    assert s.missed == 2
    assert (s.plan().start - first) % 60 == pytest.approx(0)


def test_baselines_fall_on_wall_clock_multiples() -> None:
    s, c = schedule(window=1, interval=2, baseline=6)
    kinds = []
    for _ in range(12):
        kind, start = run_window(s, c, 1)
        if kind is SnapshotKind.BASELINE:
            wall_at_start = start + c.wall_offset
            assert wall_at_start % 6 == pytest.approx(0, abs=1e-6)
        kinds.append(kind)
    assert kinds.count(SnapshotKind.BASELINE) >= 3
    assert kinds.count(SnapshotKind.SNAPSHOT) >= 6
    assert s.missed == 0  # a baseline replaces the regular window it overlaps, it is not missed


def test_an_outage_skips_the_deadlines_it_covered() -> None:
    s, c = schedule(window=10, interval=60)
    run_window(s, c, 10)
    c.mono += 600
    s.skip_until(c.mono)
    assert s.missed == 10
    assert s.plan().start > c.mono


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "does not exist (yet)"), ("", "holds no PID"), ("vllm\n", "holds no PID")],
)
def test_pid_file_problems_name_the_fix(tmp_path: Path, content: str | None, message: str) -> None:
    """`run` and `doctor` share this lookup; a bad pid file is an AttachError, not a crash."""
    path = tmp_path / "vllm.pid"
    if content is not None:
        path.write_text(content)
    with pytest.raises(AttachError, match=re.escape(message)):
        configured_target(ProcFs(tmp_path / "proc"), TargetConfig(pid_file=path, discover=False))

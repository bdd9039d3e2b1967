"""One config model for `snapshot`, `run` and `doctor`: each setting parsed in its own unit,
every value checked at load (so at start and on SIGHUP), errors that name the setting, where its
value came from and what fits. CLI cases run in-process and stop before anything is attached."""

from __future__ import annotations

import math
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.classify.rules import load_rules
from sidecar.cli import cli, main
from sidecar.cli.options import DAEMON_SETTINGS, settings_from
from sidecar.cli.snapshot import snapshot_settings
from sidecar.config.load import ENV_VARIABLES, FLAGS, NOT_SETTINGS, load_config, snapshot_options
from sidecar.config.settings import SNAPSHOT_DEFAULTS, Config
from sidecar.doctor import check_rule_files
from sidecar.errors import ConfigError

RULES = """
rules:
  - name: my-forward
    phase: forward
    match:
      - {function: my_forward, file: "*/model.py"}
"""
BROKEN_RULES = RULES.replace("phase: forward", "phase: warp_speed")


@pytest.fixture(autouse=True)
def _no_sidecar_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI reads os.environ: the test runner's own VLLM_SIDECAR_* must not leak in."""
    for name in [n for n in os.environ if n.startswith("VLLM_SIDECAR_")]:
        monkeypatch.delenv(name)


def write(tmp_path: Path, text: str, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path | None = None, **kw: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, environ=kw.pop("environ", {}), **kw)
    return str(info.value)


# ------------------------------------------------------------------------------------- units


@pytest.mark.parametrize(
    ("yaml_text", "section", "key", "expected"),
    [
        # days: a suffix scales to days, it does not turn the value into seconds
        ("output: {retention_days: 7d}", "output", "retention_days", 7.0),
        ("output: {retention_days: 12h}", "output", "retention_days", 0.5),
        ("output: {baseline_retention_days: 90}", "output", "baseline_retention_days", 90.0),
        # seconds
        (
            "schedule: {window_s: 90s, interval_s: 5m, baseline_every_s: 7d}",
            "schedule",
            "baseline_every_s",
            604800.0,
        ),
        ("schedule: {window_s: 90s}", "schedule", "window_s", 90.0),
        ("target: {start_timeout_s: 1h}", "target", "start_timeout_s", 3600.0),
        ("schedule: {jitter_s: 0}", "schedule", "jitter_s", 0.0),
        # megabytes (MiB)
        ("output: {max_total_mb: 2G}", "output", "max_total_mb", 2048.0),
        ("output: {max_total_mb: 512M}", "output", "max_total_mb", 512.0),
        ("output: {max_total_mb: 1T}", "output", "max_total_mb", 1024.0**2),
        ("output: {min_free_mb: 256}", "output", "min_free_mb", 256.0),
        # share of a core, hertz, strict bool
        ("sampling: {cpu_budget: 2%}", "sampling", "cpu_budget", 0.02),
        ("sampling: {cpu_budget: 0.05}", "sampling", "cpu_budget", 0.05),
        ("sampling: {rate_hz: 20Hz}", "sampling", "rate_hz", 20.0),
        ("target: {any_python: yes}", "target", "any_python", True),
        ("target: {pid: '4242'}", "target", "pid", 4242),
    ],
)
def test_each_setting_reads_its_own_unit(
    tmp_path: Path, yaml_text: str, section: str, key: str, expected: object
) -> None:
    config = load_config(write(tmp_path, yaml_text), environ={})
    assert getattr(getattr(config, section), key) == pytest.approx(expected)


def test_seven_days_is_seven_days_for_a_days_setting(tmp_path: Path) -> None:
    """The old coercion read every `7d` as 604800 seconds, retention_days included."""
    config = load_config(write(tmp_path, "output: {retention_days: 7d}"), environ={})
    assert config.output.retention_days == 7


def test_a_share_is_refused_for_a_size_naming_the_setting(tmp_path: Path) -> None:
    """The old coercion turned `2%` into 0.02 MB for max_total_mb."""
    path = write(tmp_path, "output: {max_total_mb: 2%}")
    assert refused(path) == (
        "output.max_total_mb: '2%' is a share; give a size in megabytes, e.g. 2048 or 2G "
        f"(file {path})"
    )


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("schedule: {window_s: -5}", "schedule.window_s: -5 is negative; give a duration"),
        ("schedule: {window_s: 0}", "schedule.window_s: 0 is zero"),
        ("schedule: {window_s: .nan}", "schedule.window_s: nan is not a finite number"),
        ("schedule: {window_s: .inf}", "schedule.window_s: inf is not a finite number"),
        ("schedule: {window_s: 1e999}", "is not a finite number"),
        ("schedule: {window_s: ten seconds}", "schedule.window_s: 'ten seconds' is not a number"),
        (
            "schedule: {window_s: 10 parsecs}",
            "schedule.window_s: '10 parsecs' has a unit (parsecs)",
        ),
        ("schedule: {window_s: 10w}", "schedule.window_s: '10w' has a unit (w) that does not fit"),
        ("schedule: {window_s: [60]}", "schedule.window_s: [60] is a list"),
        (
            "target: {pid: 10000000000000000000000000000}",
            "target.pid: 1000000000000000000000000000",
        ),
        ("target: {pid: 12.5}", "target.pid: 12.5 is not a whole number"),
        ("target: {pid: true}", "target.pid: True is true/false; give a process ID"),
        ("output: {retention_days: 99999999999999999999999999999999}", "output.retention_days"),
        ("output: {max_total_mb: 0}", "output.max_total_mb: 0 is zero"),
        ("output: {dir: {a: 1}}", "output.dir: {'a': 1} is a mapping; give a path"),
        ("sampling: {rate_hz: 5000}", "sampling.rate_hz: 5000 is more than the most"),
        ("sampling: {cpu_budget: 150%}", "is not between 0 and 1 (100%) of one core"),
        ("gpu: 2", "gpu: 2 is not true or false; give true or false"),
        ("gpu: maybe", "gpu: 'maybe' is not true or false"),
        ("metrics: {url: 'localhost:8000'}", "metrics.url: 'localhost:8000' is not an http(s) URL"),
        (
            "metrics: {url: 'http://x:99999/metrics'}",
            "metrics.url: 'http://x:99999/metrics' is not a URL",
        ),
        ("log_level: loud", "log_level: 'loud' is not a log level; give one of debug, info"),
        ("target: [1]", "target: is a list in"),
        ("source: elsewhere", "unknown setting `source`"),
    ],
)
def test_a_bad_value_names_the_setting_and_what_fits(
    tmp_path: Path, yaml_text: str, message: str
) -> None:
    path = write(tmp_path, yaml_text)
    text = refused(path)
    assert text.startswith(message) or message in text, text
    if ": is a list in" not in text and "unknown setting" not in text:
        assert text.endswith(f"(file {path})")


def test_exporter_listen_is_checked_at_load(tmp_path: Path) -> None:
    """It used to be parsed only when the exporter started: after the target was found."""
    path = write(tmp_path, 'exporter_listen: "nonsense"')
    assert refused(path).startswith("exporter_listen: 'nonsense' has no valid port; write host:")
    message = refused(environ={"VLLM_SIDECAR_EXPORTER_LISTEN": "::1:19464"})
    assert "without brackets" in message and "(variable VLLM_SIDECAR_EXPORTER_LISTEN)" in message
    assert "(flag --exporter-listen)" in refused(flags={"exporter_listen": "127.0.0.1:http"})


@pytest.mark.parametrize(
    ("text", "expected"),
    [("exporter_listen: off", "off"), ("exporter_listen: 9465", "9465"),
     ("exporter_listen: '[::1]:19464'", "[::1]:19464")],
)  # fmt: skip
def test_exporter_listen_forms(tmp_path: Path, text: str, expected: str) -> None:
    assert load_config(write(tmp_path, text), environ={}).exporter_listen == expected


def test_each_layer_is_named_in_its_errors(tmp_path: Path) -> None:
    env = {"VLLM_SIDECAR_OUTPUT_MAX_TOTAL_MB": "5%"}
    assert refused(environ=env).endswith("(variable VLLM_SIDECAR_OUTPUT_MAX_TOTAL_MB)")
    assert refused(flags={"schedule.window_s": "soon"}).endswith("(flag --window)")
    assert refused(flags={"sampling.cpu_budget": "2"}).startswith("sampling.cpu_budget: '2'")


def test_a_flag_overrides_a_bad_file_value_only_when_given(tmp_path: Path) -> None:
    path = write(tmp_path, "schedule: {window_s: 30s, interval_s: 1m}")
    config = load_config(path, environ={}, flags={"schedule.window_s": None})
    assert config.schedule.window_s == 30 and config.schedule.interval_s == 60


def test_an_empty_section_is_no_settings(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "target:\nsampling:\n"), environ={})
    assert config.target == Config().target


# ------------------------------------------------------------------------------- environment


def test_documented_variables_are_not_refused_as_settings() -> None:
    """VLLM_SIDECAR_CACHE (devtools, Makefile, README) stopped `run` as an unknown setting."""
    assert "VLLM_SIDECAR_CACHE" in NOT_SETTINGS
    config = load_config(None, environ={"VLLM_SIDECAR_CACHE": "/x", "VLLM_SIDECAR_GPU": "off"})
    assert config.gpu is False


def test_an_unknown_variable_is_still_an_error_naming_the_known_ones() -> None:
    message = refused(environ={"VLLM_SIDECAR_OUTPUTDIR": "/x"})
    assert message.startswith("unknown environment variable VLLM_SIDECAR_OUTPUTDIR: did you mean "
                              "VLLM_SIDECAR_OUTPUT_DIR?")  # fmt: skip
    assert "VLLM_SIDECAR_RULES" in message and "VLLM_SIDECAR_SCHEDULE_WINDOW_S" in message


def test_every_setting_has_a_variable_and_the_flags_name_settings() -> None:
    assert set(ENV_VARIABLES.values()) >= set(FLAGS)
    assert all(name.isupper() for name in ENV_VARIABLES)


def test_the_example_config_lists_every_setting() -> None:
    example = Path(__file__).resolve().parents[3] / "configs" / "sidecar.yaml"
    data = yaml.safe_load(example.read_text())
    listed = {f"{k}.{sub}" if isinstance(v, dict) else k
              for k, v in data.items() for sub in (v if isinstance(v, dict) else [k])}  # fmt: skip
    # custom_metrics and targets are lists (file only, no variable): the example shows them empty.
    assert data.pop("custom_metrics") == [] and "custom_metrics" in listed
    assert data.pop("targets") == [] and "targets" in listed
    assert listed - {"custom_metrics", "targets"} == set(ENV_VARIABLES.values())


# ------------------------------------------------------------------------------------- rules


def test_the_rules_setting_is_loaded_once_at_load(tmp_path: Path) -> None:
    rules = write(tmp_path, RULES, "phases.yaml")
    config = load_config(write(tmp_path, f"rules: {rules}"), environ={})
    assert config.rules == rules
    assert [r.name for r in load_rules(config.rules).rules] == ["my-forward"]


def rules_refused(**kw: Any) -> str:
    """The start's check of the rules and advice files a loaded config names (the CLI, the
    Python interface and a reload call it after loading)."""
    config = load_config(None, environ=kw.pop("environ", {}), **kw)
    with pytest.raises(ConfigError) as info:
        check_rule_files(config)
    return str(info.value)


def test_a_broken_rules_file_fails_the_start_naming_the_rule(tmp_path: Path) -> None:
    rules = write(tmp_path, BROKEN_RULES, "phases.yaml")
    message = rules_refused(environ={"VLLM_SIDECAR_RULES": str(rules)})
    assert message.startswith("rules: ") and "rule 'my-forward': phase" in message
    assert message.endswith("(variable VLLM_SIDECAR_RULES)")
    assert "cannot read rules file" in rules_refused(flags={"rules": tmp_path / "missing.yaml"})
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe\x00rules")
    assert rules_refused(flags={"rules": binary}).startswith("rules: ")
    assert rules_refused(flags={"advice": binary}).startswith("advice: ")


def test_loading_a_config_reads_no_rules_file(tmp_path: Path) -> None:
    """The config holds settings only: the files it names are read where they are used."""
    config = load_config(None, environ={}, flags={"rules": tmp_path / "missing.yaml"})
    assert config.rules == tmp_path / "missing.yaml"
    assert config.origin("rules") == "flag --rules" and config.origin("advice") == "defaults"


# --------------------------------------------------------------------------------------- CLI


def context(command: str, args: list[str]) -> Any:
    """The command's click context, parsed as `main` would, without running the command."""
    return cli.commands[command].make_context(command, args)


def test_snapshot_takes_config(tmp_path: Path) -> None:
    """`snapshot` had its own options bag; now it reads --config like `run`."""
    path = write(tmp_path, "target: {pid: 4242}\nsampling: {rate_hz: 20, cpu_budget: 5%}\n"
                           "metrics: {url: 'http://10.0.0.1:8000/metrics', timeout_s: 5s}\n")  # fmt: skip
    with context("snapshot", ["--config", str(path), "--out", str(tmp_path)]) as ctx:
        config, options = snapshot_settings(ctx)
    assert config.target.pid == 4242 and config.sampling.rate_hz == 20
    assert config.sampling.cpu_budget == pytest.approx(0.05)
    assert config.metrics.timeout_s == 5 and config.source == str(path)
    assert options.out == tmp_path and options.duration_s == 10 and not options.as_json


def test_snapshot_flags_override_its_config_and_keep_its_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, "target: {discover: true}\nsampling: {rate_hz: 20}\n")
    args = ["--config", str(path), "--pid", "77", "--rate", "7", "--out", str(tmp_path)]
    with context("snapshot", args) as ctx:
        config, _ = snapshot_settings(ctx)
    assert config.target.pid == 77 and not config.target.discover  # --pid over file discovery
    assert config.sampling.rate_hz == 7
    with context("snapshot", ["--discover", "--out", str(tmp_path)]) as ctx:
        config, _ = snapshot_settings(ctx)
    assert config.sampling.cpu_budget is None  # one window: a fixed rate unless asked
    assert SNAPSHOT_DEFAULTS.sampling.cpu_budget is None


@pytest.mark.parametrize("duration", ["30s", "30", "0.5m"])
def test_snapshot_duration_takes_a_unit(tmp_path: Path, duration: str) -> None:
    with context("snapshot", ["--pid", "1", "--duration", duration, "--out", "x"]) as ctx:
        _, options = snapshot_settings(ctx)
    assert options.duration_s == 30 and options.out == Path("x")


def test_snapshot_options_are_checked_in_their_units() -> None:
    with pytest.raises(ConfigError, match=re.escape("duration: '2%' is a share; give a duration")):
        snapshot_options({"duration_s": "2%"})
    with pytest.raises(ConfigError, match=re.escape("(flag --duration)")):
        snapshot_options({"duration_s": "0"})


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "x"], "name the vLLM server: give --pid PID, --pid-file FILE or --discover"),
        (["--pid", "1", "--discover", "--out", "x"], "give --pid PID or --discover, not both"),
        (["--pid", "one", "--out", "x"], "target.pid: 'one' is not a whole number"),
        (
            ["--pid", "1", "--cpu-budget", "2", "--out", "x"],
            "sampling.cpu_budget: '2' is not between",
        ),
        (["--pid", "1", "--duration", "-1", "--out", "x"], "duration: '-1' is negative"),
    ],
)
def test_snapshot_refuses_before_attaching(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["snapshot", *args]) == 2
    assert message in capsys.readouterr().err


def test_rules_flag_reaches_run_and_snapshot(tmp_path: Path) -> None:
    """`run` always used the built-in rules; now --rules (or `rules:`) reaches the daemon."""
    rules = write(tmp_path, RULES, "phases.yaml")
    with context("run", ["--rules", str(rules)]) as ctx:
        config, _, flags = settings_from(ctx, DAEMON_SETTINGS, Config())
    assert config.rules == rules and flags == {"rules": str(rules)}  # re-applied on SIGHUP
    with context("snapshot", ["--pid", "1", "--rules", str(rules), "--out", "x"]) as ctx:
        config, _ = snapshot_settings(ctx)
    assert [r.name for r in load_rules(config.rules).rules] == ["my-forward"]


@pytest.mark.parametrize("command", [["run"], ["doctor"], ["snapshot", "--pid", "1", "--out", "x"]])
def test_a_broken_rules_file_stops_every_command_at_start(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    rules = write(tmp_path, BROKEN_RULES, "phases.yaml")
    assert main([*command, "--rules", str(rules)]) == 2
    assert "rule 'my-forward': phase" in capsys.readouterr().err


def test_run_refuses_a_bad_listen_address_before_attaching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--exporter-listen", "nonsense", "--pid", "1"]) == 2
    assert "exporter_listen: 'nonsense' has no valid port" in capsys.readouterr().err


def test_the_cli_accepts_the_documented_cache_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VLLM_SIDECAR_CACHE", str(tmp_path))
    monkeypatch.setenv("VLLM_SIDECAR_SCHEDULE_WINDOW_S", "30s")
    with context("run", ["--interval", "1m"]) as ctx:
        config, _, _ = settings_from(ctx, DAEMON_SETTINGS, Config())
    assert config.schedule.window_s == 30 and config.schedule.interval_s == 60


# ---------------------------------------------------------------------------------- property


_SCALARS = (
    st.none() | st.booleans() | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["2%", "7d", "12h", "2G", "off", "1e999", "-1s", ".5", "[::1]:1", "yes"])
)  # fmt: skip
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner, max_size=3), max_leaves=4)
_KEYS = st.sampled_from([k.partition(".")[2] or k for k in ENV_VARIABLES.values()] + ["x"])
_SECTION = st.dictionaries(_KEYS, _VALUES, max_size=4)
_DOCUMENT = st.dictionaries(
    st.sampled_from(["target", "sampling", "schedule", "output", "metrics", "gpu",
                     "exporter_listen", "log_level"]),
    _SECTION | _VALUES, max_size=4,
) | _VALUES  # fmt: skip


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    document=_DOCUMENT,
    env=st.dictionaries(st.sampled_from(sorted(ENV_VARIABLES)), st.text(max_size=8), max_size=3),
)
def test_any_input_is_a_config_or_a_config_error(document: Any, env: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "c.yaml"
        path.write_text(yaml.safe_dump(document))
        try:
            config = load_config(path, environ=env)
        except ConfigError:
            return
    for number in (config.schedule.window_s, config.output.max_total_mb, config.sampling.rate_hz):
        assert math.isfinite(number) and number > 0

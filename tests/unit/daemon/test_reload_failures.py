"""A config whose parts fail to build with an error that is not the project's own (a
RecursionError from a rules file nested too deep, a MemoryError, a library's ValueError):
a reload keeps the running configuration, and a start exits 2, which the systemd units list in
RestartPreventExitStatus, instead of 70 and a restart every 15 s for ever (issue 26, item 12).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from sidecar import cli as cli_module
from sidecar.classify.rules import load_rules
from sidecar.daemon import logs as logs_module
from sidecar.daemon.loop import Daemon
from sidecar.errors import ConfigError, exit_code
from tests.unit.daemon.test_daemon_loop import (
    CONFIG,
    INTERVAL,
    T0,
    FakeStore,
    World,
    builders,
    deployment,
    grid,
    reloading_daemon,
    rules,
    write_config,
)

UNITS = Path(__file__).resolve().parents[3] / "systemd"


def nested_rules(path: Path, depth: int = 600) -> Path:
    """A rules file whose one spec holds `under:` specs nested DEPTH deep: well within YAML's
    nesting limit, but parsing it recurses past the interpreter's."""
    spec = "{function: f" + ", under: {function: f" * depth + "}" * depth + "}"
    path.write_text(f"rules:\n  - name: deep\n    phase: idle\n    match:\n      - {spec}\n")
    return path


def _raises(error: BaseException) -> Any:
    def build(*args: object) -> Any:
        raise error

    return build


def _second_call_raises(real: Any, error: BaseException) -> Any:
    calls = itertools.count()
    return lambda *args: real(*args) if next(calls) == 0 else _raises(error)(*args)


@pytest.mark.parametrize(
    ("part", "error"),
    [
        ("rules", RecursionError("maximum recursion depth exceeded")),
        ("advice", MemoryError()),
        ("py_spy", ValueError("a library's own error")),
    ],
)
def test_a_reload_whose_part_build_raises_anything_keeps_the_running_configuration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, part: str, error: Exception
) -> None:
    world = World()
    world.start(deployment(100))
    path = write_config(tmp_path / "sidecar.yaml")
    store = FakeStore()
    real = {"rules": rules, "advice": builders(store).advice, "py_spy": builders(store).py_spy}
    d, _, _ = reloading_daemon(world, path, **{part: _second_call_raises(real[part], error)})
    before, config = d.parts, d.config

    def reload() -> None:
        write_config(path, interval="120s")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 4 * INTERVAL + 30)
    d.serve()  # returns: the daemon did not die of the reload
    assert d.parts is before and d.config is config
    assert world.starts() == grid(0, 1, 2, 3, 4)  # still every 60 s
    failed = [r for r in caplog.records if "reload failed" in r.getMessage()]
    assert len(failed) == 1 and type(error).__name__ in failed[0].getMessage()


def test_a_reload_of_a_rules_file_nested_too_deep_keeps_the_running_configuration(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The real rules loader, no fake: the file parsed on SIGHUP raised RecursionError."""
    world = World()
    world.start(deployment(100))
    path = write_config(tmp_path / "sidecar.yaml")
    deep = nested_rules(tmp_path / "deep.yaml")
    d, _, _ = reloading_daemon(world, path, rules=load_rules)
    before = d.parts

    def reload() -> None:
        write_config(path, interval="120s", extra=f"rules: {deep}\n")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 4 * INTERVAL + 30)
    d.serve()
    assert d.parts is before
    assert world.starts() == grid(0, 1, 2, 3, 4)
    assert any("reload failed" in r.getMessage() and "deep.yaml" in r.getMessage()
               for r in caplog.records)  # fmt: skip


def test_a_config_whose_parts_raise_anything_at_start_is_a_config_error() -> None:
    world = World()
    broken = builders(FakeStore(), rules=_raises(RecursionError("maximum recursion depth")))
    with pytest.raises(ConfigError, match="RecursionError") as raised:
        Daemon(CONFIG, environ={}, clock=world.time.clock, wall_clock=world.time.wall,
               wait=world.wait, builders=broken, find_target=world.find)  # fmt: skip
    assert exit_code(raised.value) == 2


def test_run_with_a_rules_file_that_can_never_load_exits_2_which_systemd_does_not_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(logs_module, "setup_logging", lambda *args, **kwargs: None)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    deep = nested_rules(tmp_path / "deep.yaml")
    config = write_config(tmp_path / "sidecar.yaml", extra=f"rules: {deep}\n")
    assert cli_module.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "error: rules:" in err and "deep.yaml" in err and "Traceback" not in err
    for unit in UNITS.glob("*.service"):  # 2 is one of the codes that stop the restarts
        lines = [ln for ln in unit.read_text().splitlines() if ln.startswith("RestartPrevent")]
        assert lines and "2" in lines[0].split("=", 1)[1].split(), unit.name

"""A reload applies `log_level`: under systemd, editing it and `systemctl reload` is how an
operator turns the journal's debug lines on and off. Before, the new level was read and validated
on SIGHUP, then ignored until the next restart (issue 24, item 4)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unit.daemon.test_daemon_loop import T0, World, deployment, reloading_daemon, write_config


@pytest.fixture
def sidecar_logger() -> Iterator[logging.Logger]:
    logger = logging.getLogger("vllm_sidecar")
    level = logger.level
    logger.setLevel(logging.INFO)  # what `run` set at start from log_level: info
    yield logger
    logger.setLevel(level)


@pytest.mark.parametrize(("new", "expected"), [("debug", logging.DEBUG), ("error", logging.ERROR)])
def test_a_reload_applies_the_new_log_level(
    tmp_path: Path, sidecar_logger: logging.Logger, new: str, expected: int
) -> None:
    world = World()
    world.start(deployment(100))
    path = write_config(tmp_path / "sidecar.yaml")
    d, _, _ = reloading_daemon(world, path)

    def reload() -> None:
        write_config(path, extra=f"log_level: {new}\n")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 200)
    d.serve()
    assert d.config.log_level == new
    assert sidecar_logger.level == expected


def test_a_failed_reload_keeps_the_running_log_level(
    tmp_path: Path, sidecar_logger: logging.Logger
) -> None:
    world = World()
    world.start(deployment(100))
    path = write_config(tmp_path / "sidecar.yaml")
    d, _, _ = reloading_daemon(world, path)

    def reload() -> None:
        write_config(path, extra="log_level: debug\nmetrics:\n  url: ftp://vllm/metrics\n")
        d.signals.reload.set()

    world.time.at(T0 + 90, reload)
    world.stop_at(T0 + 200)
    d.serve()
    assert d.config.log_level == "info"
    assert sidecar_logger.level == logging.INFO

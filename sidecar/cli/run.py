"""`vllm-sidecar run`: the daemon, a snapshot on a schedule and hourly baselines."""

from __future__ import annotations

from typing import Any

import click

from sidecar.cli.options import DAEMON_SETTINGS, setting_options, settings_from
from sidecar.config.load import check_fleet_target
from sidecar.config.settings import Config


@click.command()
@setting_options(Config(), DAEMON_SETTINGS)
def run(**kw: Any) -> None:
    """Profile vLLM on a schedule: snapshots, hourly baselines, a Prometheus endpoint."""
    from sidecar.daemon.logs import setup_logging
    from sidecar.daemon.loop import Daemon
    from sidecar.daemon.multi_target import MultiTargetDaemon

    config, path, flags = settings_from(click.get_current_context(), DAEMON_SETTINGS, Config())
    check_fleet_target(config)
    setup_logging(config.log_level)
    # `targets:` in the config file: every server it names, each a deployment (multi_target.py).
    daemon = MultiTargetDaemon if config.targets else Daemon
    daemon(config, config_path=path, flags=flags).run()

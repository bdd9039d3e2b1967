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
    """Profile vLLM on a schedule: snapshots, hourly baselines, a Prometheus endpoint.

    With --discover (the default) and one vLLM server, its snapshots go to OUT/<host>/. With
    several, every one is profiled, each in OUT/<host>/<model@port>/, as `targets:
    [{discover: true}]` in a --config file does: a server that starts later is added, one that
    stops is marked down and taken up again when it returns; their windows are taken in turn
    (the windows mode). An OUT/<host>/ that holds one server's snapshots keeps the daemon to
    one server, and one that holds a folder per server keeps it to all."""
    from sidecar.daemon.choice import start_daemon
    from sidecar.daemon.logs import setup_logging

    config, path, flags = settings_from(click.get_current_context(), DAEMON_SETTINGS, Config())
    check_fleet_target(config)
    setup_logging(config.log_level)
    # One server's daemon (loop.py) or every server's (multi_target.py): daemon/choice.py.
    start_daemon(config, path, flags)

"""`vllm-sidecar doctor`: each thing the daemon needs, checked, with what to fix; exit 1
(`ExitStatus.CHECKS_FAILED`) when a check fails."""

from __future__ import annotations

from typing import Any

import click

from sidecar.cli.options import DAEMON_SETTINGS, setting_options, settings_from
from sidecar.config.load import check_fleet_target
from sidecar.config.settings import Config
from sidecar.errors import ExitStatus


@click.command()
@setting_options(Config(), DAEMON_SETTINGS)
def doctor(**kw: Any) -> ExitStatus:
    """Check py-spy, ptrace, the target, NVML, vLLM's /metrics and the output folder."""
    from sidecar.doctor import Status, run_checks

    config, _, _ = settings_from(click.get_current_context(), DAEMON_SETTINGS, Config())
    check_fleet_target(config)
    checks = run_checks(config)
    for c in checks:
        click.echo(f"[{c.status.value:>4}] {c.name}: {c.detail}")
        if c.fix:
            click.echo(f"       fix: {c.fix}")
    failed = any(c.status is Status.FAIL for c in checks)
    return ExitStatus.CHECKS_FAILED if failed else ExitStatus.OK

"""`vllm-sidecar doctor`: each thing the daemon needs, checked, with what to fix; exit 1
(`ExitStatus.CHECKS_FAILED`) when a check fails."""

from __future__ import annotations

from typing import Any

import click

from sidecar.cli.options import DAEMON_SETTINGS, setting_options, settings_from
from sidecar.config.load import check_fleet_target
from sidecar.config.settings import Config
from sidecar.errors import ExitStatus
from sidecar.tables import json_text


@click.command()
@setting_options(Config(), DAEMON_SETTINGS)
@click.option(
    "--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True
)
def doctor(fmt: str, **kw: Any) -> ExitStatus:
    """Check py-spy, ptrace, the target, NVML, vLLM's /metrics and the output folder."""
    from sidecar.doctor import Status, run_checks

    config, _, _ = settings_from(click.get_current_context(), DAEMON_SETTINGS, Config())
    check_fleet_target(config)
    checks = run_checks(config)
    failed = any(c.status is Status.FAIL for c in checks)
    if fmt == "json":
        doc = {"ok": not failed, "checks": [
            {"name": c.name, "status": c.status.value.lower(), "detail": c.detail, "fix": c.fix}
            for c in checks]}  # fmt: skip
        click.echo(json_text(doc, indent=2))
        return ExitStatus.CHECKS_FAILED if failed else ExitStatus.OK
    for c in checks:
        click.echo(f"[{c.status.value:>4}] {c.name}: {c.detail}")
        if c.fix:
            click.echo(f"       fix: {c.fix}")
    return ExitStatus.CHECKS_FAILED if failed else ExitStatus.OK

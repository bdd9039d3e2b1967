"""The command line: one module per command, each parsing its flags and calling the package;
this module only wires them (`vllm-sidecar = sidecar.cli:main`, `python -m sidecar.cli`).

Flags are validated once, into frozen configs (sidecar/cli/options.py); the core never sees
click. Exit codes are decided in one place, `main`: a command returns an `ExitStatus` (0, 1 for a
failed `doctor`, 10 for a `diff` regression), an error maps through `errors.exit_code`.
"""

from __future__ import annotations

import sys
import traceback

import click

from sidecar.cli.aggregate import aggregate
from sidecar.cli.classify import classify, rules_group
from sidecar.cli.config_cmd import config_group
from sidecar.cli.diff import diff
from sidecar.cli.doctor import doctor
from sidecar.cli.epilogs import GROUP_EPILOG, HELP_NAMES, attach
from sidecar.cli.export import export
from sidecar.cli.flamegraph import flamegraph
from sidecar.cli.report import report
from sidecar.cli.run import run
from sidecar.cli.samples import samples
from sidecar.cli.snapshot import snapshot
from sidecar.cli.trend import trend
from sidecar.cli.trigger import trigger
from sidecar.daemon.logs import journal_prefix
from sidecar.errors import ExitStatus, SidecarError, exit_code
from sidecar.extras import missing_extra

ERR = 3  # syslog's err: under systemd, `journalctl -p err` shows why the service stopped


@click.group(context_settings={"help_option_names": HELP_NAMES}, epilog=GROUP_EPILOG)
@click.version_option(package_name="vllm-sidecar")
def cli() -> None:
    """Profile a running vLLM server: py-spy stacks mapped to serving phases."""


for _command in (classify, rules_group, snapshot, report, diff, flamegraph, trend, aggregate,
                 export, run, doctor, trigger, config_group, samples):  # fmt: skip
    cli.add_command(_command)
attach(cli)  # examples and exit codes in each command's --help (sidecar/cli/epilogs.py)


def main(argv: list[str] | None = None) -> int:
    """Entry point: the one place where outcomes and errors become exit codes."""
    try:
        status = cli.main(args=argv, prog_name="vllm-sidecar", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return ExitStatus.ABORTED
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except SidecarError as exc:
        click.echo(f"{journal_prefix(ERR)}vllm-sidecar: error: {exc}", err=True)
        return exit_code(exc)
    except ModuleNotFoundError as exc:
        # A library of an extra that this install lacks: say which `pip install` brings it.
        missing = missing_extra(exc, _command_name(argv))
        if missing is None:
            return _bug(exc)
        click.echo(f"{journal_prefix(ERR)}vllm-sidecar: error: {missing}", err=True)
        return exit_code(missing)
    except Exception as exc:
        return _bug(exc)
    # A command's ExitStatus, or click's own 0 after --help and --version; None: it ended well.
    return int(status) if isinstance(status, int) else ExitStatus.OK


def _bug(exc: Exception) -> int:
    """A bug: the traceback is what a report needs."""
    traceback.print_exc(file=sys.stderr)
    click.echo(f"{journal_prefix(ERR)}vllm-sidecar: internal error ({type(exc).__name__}): "
               "please report it with the traceback above", err=True)  # fmt: skip
    return exit_code(exc)


def _command_name(argv: list[str] | None) -> str | None:
    """The command ARGV runs (`diff`, `export tensorboard`), for messages; None if none."""
    words = [w for w in (sys.argv[1:] if argv is None else argv) if not w.startswith("-")]
    if not words or words[0] not in cli.commands:
        return None
    group = cli.commands[words[0]]
    if isinstance(group, click.Group) and len(words) > 1 and words[1] in group.commands:
        return f"{words[0]} {words[1]}"
    return words[0]

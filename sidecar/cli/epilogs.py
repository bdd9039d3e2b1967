"""Each command's `--help` epilog: a few real examples and the exit codes it can return.

The codes and what they mean come from sidecar/errors.py (`ExitStatus`, the `SidecarError`
classes' `exit_code` and docstrings, `BUG_EXIT`), so the help cannot drift from `main`.
"""

from __future__ import annotations

import re

import click

from sidecar.errors import (
    BUG_EXIT,
    AttachError,
    ConfigError,
    ExitStatus,
    InputError,
    OutputError,
    SamplerError,
    SidecarError,
    TriggerError,
)

# What an ExitStatus means, in a line (errors.py gives each its comment; this is the help's
# wording); the numbers are the enum's own.
_STATUS = {
    ExitStatus.OK: "success",
    ExitStatus.CHECKS_FAILED: "a check failed (what to fix is printed beside it)",
    ExitStatus.REGRESSION: "a significant regression beyond --fail-on",
    ExitStatus.ABORTED: "interrupted (Ctrl-C)",
}
Outcome = ExitStatus | type[SidecarError] | int


def _line(outcome: Outcome) -> tuple[int, str]:
    if isinstance(outcome, ExitStatus):
        return int(outcome), _STATUS[outcome]
    if isinstance(outcome, int):  # BUG_EXIT
        return outcome, "an internal error (a bug: please report it with the traceback)"
    doc = (outcome.__doc__ or outcome.__name__).split("\n\n")[0]
    first = re.sub(r" \(exit \d+\)", "", " ".join(doc.split()).split(". ")[0]).rstrip(".")
    if outcome is ConfigError:
        first += ", or a usage error"
    return outcome.exit_code, first[0].lower() + first[1:]


def exit_codes(*outcomes: Outcome) -> str:
    """The 'Exit codes:' block for these outcomes (always with 0, 2 and the bug exit)."""
    lines: dict[int, list[str]] = {}
    for outcome in (ExitStatus.OK, ConfigError, *outcomes, BUG_EXIT):
        code, text = _line(outcome)
        if text not in lines.setdefault(code, []):
            lines[code].append(text)
    body = "\n".join(f"  {code:>3}  {'; '.join(texts)}" for code, texts in sorted(lines.items()))
    return f"Exit codes:\n{body}"


def epilog(examples: tuple[str, ...], *outcomes: Outcome) -> str:
    """Examples (each a `vllm-sidecar ...` line) then the exit codes; `\\b` keeps click from
    rewrapping either block."""
    shown = "\n".join(f"  {line}" for line in examples)
    return f"\b\nExamples:\n{shown}\n\n\b\n{exit_codes(*outcomes)}"


ABORTED = ExitStatus.ABORTED
EPILOGS: dict[str, str] = {
    "classify": epilog(
        (
            "vllm-sidecar classify dump.txt",
            "vllm-sidecar classify --format json recording.txt | jq .totals",
            "vllm-sidecar classify --explain --limit 5 ./snapshots/20261120T060000Z",
        ),
        InputError,
    ),
    "rules suggest": epilog(
        (
            "vllm-sidecar rules suggest ./snapshots/20261120T060000Z",
            "vllm-sidecar rules suggest --rules my-phases.yaml --top 5 dump.txt",
        ),
        InputError,
    ),
    "snapshot": epilog(
        (
            "vllm-sidecar snapshot --discover --duration 30s --out ./snapshots",
            "vllm-sidecar snapshot --pid 4242 --out ./snapshots --format json | jq .sampling",
        ),
        InputError,
        AttachError,
        SamplerError,
        OutputError,
        ABORTED,
    ),
    "report": epilog(
        (
            "vllm-sidecar report ./snapshots/20261120T060000Z",
            "vllm-sidecar report --format json ./snapshots/20261120T060000Z | jq .findings",
            "vllm-sidecar report --format html -o report.html /var/lib/vllm-sidecar",
        ),
        InputError,
        OutputError,
    ),
    "diff": epilog(
        (
            "vllm-sidecar diff ./snapshots/before ./snapshots/after",
            "vllm-sidecar diff --baseline /var/lib/vllm-sidecar --fail-on 10%",
            "vllm-sidecar diff --format json OUT@7d..1d OUT@1d..",
        ),
        InputError,
        ExitStatus.REGRESSION,
    ),
    "flamegraph": epilog(
        (
            "vllm-sidecar flamegraph ./snapshots/20261120T060000Z",
            "vllm-sidecar flamegraph ./snapshots/before --diff ./snapshots/after -o flame/",
        ),
        InputError,
        OutputError,
    ),
    "trend": epilog(
        (
            "vllm-sidecar trend /var/lib/vllm-sidecar --since 7d",
            "vllm-sidecar trend /var/lib/vllm-sidecar --series 'share.worker.*' --plot trend.png",
            "vllm-sidecar trend /var/lib/vllm-sidecar --format json | jq .series",
        ),
        InputError,
    ),
    "aggregate": epilog(
        (
            "vllm-sidecar aggregate /var/lib/vllm-sidecar --since 1d",
            "vllm-sidecar aggregate s3://bucket/prefix --format json | jq .hosts",
        ),
        InputError,
    ),
    "export": epilog(
        ("vllm-sidecar export tensorboard /var/lib/vllm-sidecar --logdir ./tb",),
        InputError,
        OutputError,
    ),
    "export tensorboard": epilog(
        (
            "vllm-sidecar export tensorboard /var/lib/vllm-sidecar --logdir ./tb",
            "vllm-sidecar export tensorboard OUT --logdir ./tb --host gpu-01 --format json",
        ),
        InputError,
        OutputError,
    ),
    "run": epilog(
        (
            "vllm-sidecar run --discover --out /var/lib/vllm-sidecar",
            "vllm-sidecar run --config /etc/vllm-sidecar/sidecar.yaml",
        ),
        AttachError,
        SamplerError,
        OutputError,
        ABORTED,
    ),
    "doctor": epilog(
        (
            "vllm-sidecar doctor --discover --out /var/lib/vllm-sidecar",
            "vllm-sidecar doctor --config /etc/vllm-sidecar/sidecar.yaml --format json",
        ),
        ExitStatus.CHECKS_FAILED,
    ),
    "trigger": epilog(
        (
            "vllm-sidecar trigger --out /var/lib/vllm-sidecar",
            "vllm-sidecar trigger --config /etc/vllm-sidecar/sidecar.yaml --reason 'p95 spike'",
        ),
        TriggerError,
        ABORTED,
    ),
    "rules": epilog(
        ("vllm-sidecar rules suggest ./snapshots/20261120T060000Z",),
        InputError,
    ),
    "samples": epilog(
        (
            "vllm-sidecar samples ./samples",
            "vllm-sidecar samples --force --format json ./samples | jq .next",
        ),
        OutputError,
        InputError,
    ),
    "config": epilog(
        ("vllm-sidecar config example -o /etc/vllm-sidecar/sidecar.yaml",),
        OutputError,
    ),
    "config example": epilog(
        (
            "vllm-sidecar config example -o /etc/vllm-sidecar/sidecar.yaml",
            "vllm-sidecar config example --which phases > my-phases.yaml",
        ),
        OutputError,
    ),
}
GROUP_EPILOG = epilog(
    (
        "vllm-sidecar doctor --discover",
        "vllm-sidecar snapshot --discover --out ./snapshots",
        "vllm-sidecar report ./snapshots/20261120T060000Z",
        "vllm-sidecar samples ./samples      # recorded snapshots to try it without vLLM",
        "vllm-sidecar COMMAND -h",
    ),
    ExitStatus.CHECKS_FAILED,
    TriggerError,
    InputError,
    AttachError,
    SamplerError,
    OutputError,
    ExitStatus.REGRESSION,
    ABORTED,
)


HELP_NAMES = ["-h", "--help"]


def attach(group: click.Group, prefix: str = "") -> None:
    """Each command under `group` gets its epilog (one it declares itself is kept), and `-h`
    on the command itself: click caches a command's help option on its first context, which
    need not be the group's (a test's `command.make_context`)."""
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        command.context_settings.setdefault("help_option_names", HELP_NAMES)
        if not command.epilog and path in EPILOGS:
            command.epilog = EPILOGS[path]
        if isinstance(command, click.Group):
            attach(command, f"{path} ")

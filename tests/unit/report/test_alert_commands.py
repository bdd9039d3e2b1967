"""Every `vllm-sidecar ...` command an alert of deploy/prometheus/vllm-sidecar-rules.yml tells the
on-call to run works: run in-process through the CLI's `main` on an output folder made of
recorded fixture snapshots (tests/upload_store.py), it exits 0 and prints something.

OUT in a command is the daemon's output folder, `<host>` a host folder's name in it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.cli import main
from tests.upload_store import HOST, real_output

RULES = Path(__file__).resolve().parents[3] / "deploy" / "prometheus" / "vllm-sidecar-rules.yml"
COMMAND = re.compile(r"`(vllm-sidecar\s[^`]*)`")


def alert_commands() -> list[tuple[str, str]]:
    """(alert, command) for every backquoted `vllm-sidecar ...` in the alerts' annotations."""
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text())
    found: list[tuple[str, str]] = []
    for group in doc["groups"]:
        for rule in group["rules"]:
            for text in (rule.get("annotations") or {}).values():
                for command in COMMAND.findall(" ".join(str(text).split())):
                    if (rule["alert"], command) not in found:
                        found.append((rule["alert"], command))
    return found


def args_of(command: str, out: Path) -> list[str]:
    """The command's arguments after `vllm-sidecar`, OUT and <host> filled in."""
    words = shlex.split(command)
    assert words[0] == "vllm-sidecar"
    return [w.replace("OUT", str(out)).replace("<host>", HOST) for w in words[1:]]


def test_the_alerts_name_commands() -> None:
    assert ("VllmKvCacheExhausted", "vllm-sidecar report OUT") in alert_commands()


@pytest.mark.parametrize(("alert", "command"), alert_commands())
def test_every_command_an_alert_names_runs_on_a_real_output_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], alert: str, command: str
) -> None:
    out = tmp_path / "out"
    real_output(out)
    code = main(args_of(command, out))
    captured = capsys.readouterr()
    assert code == 0, f"{alert}: `{command}` exited {code}: {captured.err}"
    assert captured.out.strip(), f"{alert}: `{command}` printed nothing"

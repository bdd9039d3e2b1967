"""What every command of the CLI does alike (issue 23): `-h` is `--help`; data is `--format
json`, on stdout alone (warnings on stderr); each help ends in examples and the exit codes, the
codes quoted from sidecar/errors.py; `doctor` creates nothing while it checks."""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import replace
from pathlib import Path

import click
import pytest

import sidecar.commands
from sidecar.cli import cli, main
from sidecar.cli.epilogs import EPILOGS, exit_codes
from sidecar.errors import BUG_EXIT, ConfigError, ExitStatus, InputError
from sidecar.store.summary_io import read_summary

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SNAPSHOT = FIXTURES / "flame" / "prefill-heavy"


def commands(group: click.Group = cli, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's path under `vllm-sidecar`, groups included (the group itself: ())."""
    found = [prefix]
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            found += commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


ALL = commands()
IDS = [" ".join(path) or "vllm-sidecar" for path in ALL]


def help_text(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main([*args, "--help"]) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_dash_h_is_help_on_every_command(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*path, "-h"]) == 0
    short = capsys.readouterr().out
    assert short.startswith("Usage: vllm-sidecar")
    assert short == help_text(capsys, *path)


def test_dash_h_survives_a_context_made_outside_the_group(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """click caches a command's help option on its first context: one made on the command
    alone (as tests do) must not lose `-h` for the CLI."""
    command = cli.commands["trend"]
    assert command.get_help_option(click.Context(command)) is not None
    assert main(["trend", "-h"]) == 0
    assert capsys.readouterr().out.startswith("Usage: vllm-sidecar trend")


@pytest.mark.parametrize("path", ALL, ids=IDS)
def test_every_help_shows_examples_and_exit_codes(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    text = help_text(capsys, *path)
    assert "Exit codes:" in text
    examples = [line.strip() for line in text.splitlines() if line.strip().startswith("vllm-")]
    assert any(line.startswith(f"vllm-sidecar {' '.join(path)}") for line in examples), text
    assert re.search(r"^\s+0\s+success$", text, re.M)
    assert re.search(rf"^\s+{BUG_EXIT}\s+an internal error", text, re.M)


def test_the_exit_codes_are_errors_py_s() -> None:
    text = exit_codes(InputError, ExitStatus.REGRESSION)
    assert [int(m) for m in re.findall(r"^\s+(\d+)", text, re.M)] == [
        ExitStatus.OK, ConfigError.exit_code, InputError.exit_code, ExitStatus.REGRESSION,
        BUG_EXIT,
    ]  # fmt: skip
    assert "an input file that cannot be read at all" in text  # InputError's docstring
    assert set(EPILOGS) >= {" ".join(p) for p in ALL if p}


def test_diff_and_doctor_name_their_own_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert re.search(r"^\s+10\s+a significant regression", help_text(capsys, "diff"), re.M)
    assert re.search(r"^\s+1\s+a check failed", help_text(capsys, "doctor"), re.M)


PRINTS_DATA = [
    ("classify",), ("rules", "suggest"), ("snapshot",), ("report",), ("diff",), ("trend",),
    ("aggregate",), ("export", "tensorboard"), ("doctor",), ("trigger",),
]  # fmt: skip


@pytest.mark.parametrize("path", PRINTS_DATA, ids=[" ".join(p) for p in PRINTS_DATA])
def test_every_command_that_prints_data_takes_format_json(
    path: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert "--format [text|json" in help_text(capsys, *path)


def fake_snapshot(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """`take_snapshot` without a server: the fixture snapshot, with two sampler warnings."""
    folder = tmp_path / SNAPSHOT.name
    shutil.copytree(SNAPSHOT, folder)
    summary = read_summary(folder)
    warned = replace(summary, sampling=replace(summary.sampling, warnings=("py-spy lagged",)))
    monkeypatch.setattr(sidecar.commands, "take_snapshot", lambda *a, **k: (folder, warned))
    return folder


def test_snapshot_warnings_go_to_stderr(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_snapshot(monkeypatch, tmp_path)
    assert main(["snapshot", "--pid", "1", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "WARNING: py-spy lagged" in err
    assert "WARNING" not in out and "snapshot:" in out


@pytest.mark.parametrize("flag", [["--format", "json"], ["--json"]])
def test_snapshot_json_is_format_json_and_json_still_works(
    flag: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    folder = fake_snapshot(monkeypatch, tmp_path)
    assert main(["snapshot", "--pid", "1", "--out", str(tmp_path), *flag]) == 0
    out = capsys.readouterr().out
    assert json.loads(out) == json.loads((folder / "summary.json").read_text())
    assert "--json" not in help_text(capsys, "snapshot")  # the old spelling is hidden


def test_doctor_creates_no_output_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    missing = tmp_path / "out" / "deeper"
    main(["doctor", "--pid", "1", "--no-gpu", "--out", str(missing)])
    assert not (tmp_path / "out").exists()
    line = next(x for x in capsys.readouterr().out.splitlines() if "] output:" in x)
    assert line.startswith("[  ok]") and f"would create {missing} under {tmp_path}" in line
    main(["doctor", "--pid", "1", "--no-gpu", "--out", str(missing), "--format", "json"])
    assert not (tmp_path / "out").exists()
    checks = {c["name"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["output"]["status"] == "ok", checks["output"]


def test_doctor_fails_an_output_folder_under_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "file").write_text("")
    code = main(["doctor", "--pid", "1", "--no-gpu", "--out", str(tmp_path / "file" / "out")])
    assert code == ExitStatus.CHECKS_FAILED
    line = next(x for x in capsys.readouterr().out.splitlines() if "] output:" in x)
    assert line.startswith("[FAIL]") and "is not a folder" in line

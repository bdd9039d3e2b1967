"""Bad inputs against real processes: each gives a clear message and the right exit code."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.cli import main
from tests.integration.targets import python_target

pytestmark = pytest.mark.integration


def test_pid_that_does_not_exist(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pid = 4_000_000  # above the default pid_max, so never a live process
    assert main(["snapshot", "--pid", str(pid), "--duration", "1", "--out", str(tmp_path)]) == 4
    assert f"no process {pid}" in capsys.readouterr().err


def test_pid_that_is_not_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], started: list[subprocess.Popen[bytes]]
) -> None:
    started.append(subprocess.Popen(["sleep", "60"]))
    code = main(
        ["snapshot", "--pid", str(started[0].pid), "--duration", "1", "--out", str(tmp_path)]
    )
    assert code == 4
    assert "is not a Python process" in capsys.readouterr().err


def test_python_but_not_vllm_needs_any_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], started: list[subprocess.Popen[bytes]]
) -> None:
    started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
    code = main(
        ["snapshot", "--pid", str(started[0].pid), "--duration", "1", "--out", str(tmp_path)]
    )
    assert code == 4
    assert "--any-python" in capsys.readouterr().err


def test_target_exiting_mid_window_keeps_a_marked_partial_snapshot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], started: list[subprocess.Popen[bytes]]
) -> None:
    pid = python_target(
        started, "end = time.time() + 2.5\nwhile time.time() < end: sum(range(1000))\n"
    )
    args = ["snapshot", "--pid", str(pid), "--any-python", "--duration", "8",
            "--rate", "50", "--out", str(tmp_path), "--json"]  # fmt: skip
    assert main(args) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sampling"]["partial"] is True
    assert "exited" in summary["sampling"]["partial_reason"]
    assert summary["sampling"]["samples"] > 20  # what was sampled before the exit is kept
    assert summary["sampling"]["duration_s"] < 7
    folders = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    assert len(folders) == 1
    assert {f.name for f in folders[0].iterdir()} == {
        "summary.json", "stacks.parquet", "stacks.collapsed",
    }  # fmt: skip


def test_missing_py_spy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], started: list[subprocess.Popen[bytes]]
) -> None:
    pid = python_target(started, "time.sleep(60)")
    args = ["snapshot", "--pid", str(pid), "--any-python", "--duration", "1",
            "--out", str(tmp_path), "--py-spy", str(tmp_path / "no-py-spy")]  # fmt: skip
    assert main(args) == 5
    assert "pip install py-spy" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop CAP_SYS_PTRACE")
def test_ptrace_refused_explains_sys_ptrace(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """The sidecar without CAP_SYS_PTRACE against a non-dumpable Python: the kernel refuses
    ptrace (as it does for another user's process), and the message says what to grant."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("setpriv (util-linux) is not installed")
    # PR_SET_DUMPABLE = 4: ptrace by the same user now needs CAP_SYS_PTRACE.
    pid = python_target(
        started, "import ctypes\nctypes.CDLL(None).prctl(4, 0, 0, 0, 0)\ntime.sleep(60)"
    )
    sidecar = Path(sys.executable).with_name("vllm-sidecar")
    result = subprocess.run(
        [setpriv, "--bounding-set", "-sys_ptrace", str(sidecar), "snapshot", "--pid", str(pid),
         "--any-python", "--duration", "1", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert result.returncode == 4, result.stderr
    assert "SYS_PTRACE" in result.stderr
    assert "ptrace_scope" in result.stderr


def test_broken_rules_file_fails_before_attaching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("rules: [{name: x, phase: prefil, match: [{function: f}]}]\n")
    args = ["snapshot", "--pid", str(os.getpid()), "--any-python", "--duration", "1",
            "--out", str(tmp_path), "--rules", str(rules)]  # fmt: skip
    assert main(args) == 2
    assert "unknown value 'prefil'" in capsys.readouterr().err

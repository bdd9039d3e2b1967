"""The error that ends `vllm-sidecar run` reaches the journal as an error: under systemd
(JOURNAL_STREAM set) the line carries `<3>`, as the daemon's log lines carry their level's
priority, so `journalctl -u vllm-sidecar -p err` shows why the service stopped. Before, journald
filed it as info (found under a real systemd, issue 24 item 4: a start refused with exit 4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar import cli as cli_module
from sidecar.daemon import logs as logs_module


@pytest.fixture
def broken_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(logs_module, "setup_logging", lambda *args, **kwargs: None)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    path = tmp_path / "sidecar.yaml"
    path.write_text("schedule:\n  window_s: 6 parsecs\n")
    return path


def test_under_journald_the_error_line_has_priority_err(
    broken_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JOURNAL_STREAM", "8:4242")
    assert cli_module.main(["run", "--config", str(broken_config)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("<3>vllm-sidecar: error: schedule.window_s: '6 parsecs'"), err


def test_elsewhere_the_error_line_is_plain(
    broken_config: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert cli_module.main(["run", "--config", str(broken_config)]) == 2
    assert capsys.readouterr().err.startswith("vllm-sidecar: error: schedule.window_s:")

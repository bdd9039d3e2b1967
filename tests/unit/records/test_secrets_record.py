"""The recorded secrets check (devtools/secrets_check.py, `make secrets-check`) holds what issue
26, item 1 asks: a real vLLM started with `--api-key` and `--hf-token`, profiled with snapshots,
an upload and a stall incident (a `py-spy dump` of every process, the command line on its first
line), and neither value, nor the key's first 12 characters, in any file under the output
folder, any uploaded object, the daemon's log or the text, JSON and HTML reports."""

from __future__ import annotations

import json
from pathlib import Path

RECORD = Path(__file__).resolve().parents[2] / "fixtures" / "secrets" / "secrets-check.json"


def test_no_secret_of_vllms_command_line_reached_anything_the_sidecar_wrote() -> None:
    record = json.loads(RECORD.read_text())
    assert record["found"] == {}
    searched = record["searched"]
    assert searched["files under the output folder"] >= 10 and searched["uploaded objects"] >= 1
    assert record["snapshots"] >= 3 and record["reports_exit_codes"] == {
        "text": 0, "json": 0, "html": 0}  # fmt: skip
    dumps = record["incident_dumps"]
    assert any(d.endswith("-api_server.txt") for d in dumps), dumps  # its title holds the key
    assert record["dumps_with_the_key_redacted"] >= 1

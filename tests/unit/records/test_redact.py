"""Secrets out of every command line and URL the sidecar stores or logs (issue 26, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.records.redact import REDACTED, redact_args, redact_text, redact_url
from sidecar.target.procfs import ProcFs

SERVE = ["/venv/bin/python3", "/venv/bin/vllm", "serve", "/models/llama"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--api-key", "sk-abc"], ["--api-key", REDACTED]),
        (["--api-key=sk-abc"], [f"--api-key={REDACTED}"]),
        (["--hf-token", "hf_abc", "--port", "8000"], ["--hf-token", REDACTED, "--port", "8000"]),
        (["HF_TOKEN=hf_abc"], [f"HF_TOKEN={REDACTED}"]),
        (["--db.password=x"], [f"--db.password={REDACTED}"]),
        # a flag without its value stays as it is, the next flag is not hidden
        (["--api-key", "--port", "8000"], ["--api-key", "--port", "8000"]),
        # names that only contain the words are not secrets
        (["--tokenizer-mode", "auto", "--max-num-batched-tokens", "8192"],
         ["--tokenizer-mode", "auto", "--max-num-batched-tokens", "8192"]),
        (["--download-dir", "https://user:pw@host/x?token=t&a=1"],
         ["--download-dir", f"https://{REDACTED}@host/x?token={REDACTED}&a=1"]),
    ],
)  # fmt: skip
def test_redact_args(args: list[str], expected: list[str]) -> None:
    assert redact_args([*SERVE, *args]) == (*SERVE, *expected)


def test_redact_text_in_a_pyspy_dump_and_a_raw_record() -> None:
    dump = (
        "Process 4242: /venv/bin/python3 /venv/bin/vllm serve /m --api-key sk-live-123 "
        "--hf-token=hf_456 --port 8000 OPENAI_API_KEY=zzz\nPython v3.12.3 (/usr/bin/python3.12)\n"
    )
    out = redact_text(dump)
    assert "sk-live-123" not in out and "hf_456" not in out and "zzz" not in out
    assert "--port 8000" in out and out.endswith("Python v3.12.3 (/usr/bin/python3.12)\n")
    raw = 'process 7:"vllm serve /m --api-key sk-1";thread (7): MainThread;main (x.py:1) 3'
    assert "sk-1" not in redact_text(raw) and redact_text(raw).endswith("main (x.py:1) 3")


def test_redact_url_keeps_what_locates_the_server() -> None:
    assert redact_url("http://admin:s3cret@10.0.0.5:8000/metrics") == (
        f"http://{REDACTED}@10.0.0.5:8000/metrics"
    )
    assert redact_url("http://10.0.0.5:8000/metrics?X-Amz-Signature=abc&page=2") == (
        f"http://10.0.0.5:8000/metrics?X-Amz-Signature={REDACTED}&page=2"
    )


def test_procfs_never_hands_out_a_secret(tmp_path: Path) -> None:
    base = tmp_path / "4242"
    base.mkdir()
    (base / "stat").write_text("4242 (vllm) S 1 4242 4242 0 -1 0 0 0 0 0 5 7 0 0 20 0 1 0 99 0 0")
    (base / "status").write_text("Name:\tvllm\nNSpid:\t4242\n")
    argv = [*SERVE, "--api-key", "sk-live-123", "--port", "8000"]
    (base / "cmdline").write_bytes("\0".join(argv).encode() + b"\0")
    process = ProcFs(tmp_path, ticks_per_s=100).read(4242)
    assert process is not None
    assert "sk-live-123" not in process.title and "sk-live-123" not in process.cmdline
    assert process.cmdline[-4:] == ("--api-key", REDACTED, "--port", "8000")

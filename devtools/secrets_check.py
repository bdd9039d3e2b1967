"""Does a secret on vLLM's command line reach anything the sidecar writes, uploads or logs?

Issue 26, item 1, on the real vLLM CPU server: vLLM is started with `--api-key` and
`--hf-token` (fresh random values each run), the daemon profiles it with snapshots every 20 s,
uploads to an S3 API server on loopback (moto), and raises a stall incident (the EngineCore
stopped while two requests, sent with the key, wait): incidents hold a `py-spy dump` of every
process, whose first line is the command line. Then every file under the output folder, every
uploaded object, the daemon's log and the text, JSON and HTML reports are searched for the two
values (and for the key's first 12 characters: a cut value is a leak too).

    .venv/bin/python -m devtools.secrets_check

Writes tests/fixtures/secrets/secrets-check.json (checked by
tests/unit/records/test_secrets_record.py). About 3 minutes; everything it starts is killed.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import suppress
from pathlib import Path
from typing import Any

from devtools import sidecar_proc
from devtools.freeze_check import engine_core
from devtools.server import VllmServer, free_port
from tests.moto_server import BUCKET, MotoServer

RECORD = sidecar_proc.REPO / "tests" / "fixtures" / "secrets" / "secrets-check.json"

CONFIG = """\
schedule:
  interval_s: 20s
  baseline_every_s: 60s
sampling:
  continuous_segment_s: 10s
hang:
  check_s: 1s
  stack_after_s: 4s
  stall_after_s: 30s
upload:
  url: s3://{bucket}/secrets
  endpoint_url: {endpoint}
  backoff_s: 1s
  timeout_s: 5s
"""


def _completion(base_url: str, key: str) -> None:
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 8}).encode()
    request = urllib.request.Request(f"{base_url}/v1/completions", data=body, headers={
        "Content-Type": "application/json", "Authorization": f"Bearer {key}"})  # fmt: skip
    with suppress(OSError), urllib.request.urlopen(request, timeout=120) as r:
        r.read()


def _until(what: Any, timeout_s: float, why: str, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if what():
            return
        time.sleep(0.5)
    raise SystemExit(f"not within {timeout_s:g} s: {why}\n{log.read_text()[-3000:]}")


def _snapshots(host: Path) -> list[Path]:
    return (
        [p for p in host.iterdir() if p.is_dir() and p.name[:1].isdigit()] if host.exists() else []
    )


def main() -> int:
    key, token = "sk-" + secrets.token_hex(16), "hf_" + secrets.token_hex(16)
    needles = {"api key": key, "hf token": token, "api key, cut": key[:12]}
    work = Path(tempfile.mkdtemp(prefix="vllm-sidecar-secrets-"))
    out, log = work / "out", work / "daemon.log"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_SHARED_CREDENTIALS_FILE": str(work / "none"),
           "AWS_CONFIG_FILE": str(work / "none")}  # fmt: skip
    os.environ.update(env)
    moto = MotoServer(work / "moto.log")
    moto.start()
    daemon = None
    server = VllmServer(
        log_path=work / "vllm.log", extra_args=["--api-key", key, "--hf-token", token]
    )
    started = time.time()
    try:
        server.start()
        core = engine_core(server)
        (work / "c.yaml").write_text(CONFIG.format(bucket=BUCKET, endpoint=moto.url))
        with log.open("w") as handle:
            daemon = sidecar_proc.start(
                ["run", "--config", str(work / "c.yaml"), "--pid", str(server.pid), "--out",
                 str(out), "--no-gpu", "--exporter-listen", f"127.0.0.1:{free_port()}"],
                stdout=handle, stderr=subprocess.STDOUT, env=sidecar_proc.env(**env))  # fmt: skip
        host = out / os.uname().nodename

        def host_dir() -> Path:
            dirs = [d for d in out.iterdir() if d.is_dir()] if out.exists() else []
            return dirs[0] if dirs else host

        _until(lambda: len(_snapshots(host_dir())) >= 1, 180, "a first snapshot", log)
        # a stall with two requests (sent with the key) waiting: an incident with every dump
        os.kill(core, signal.SIGSTOP)
        try:
            clients = [threading.Thread(target=_completion, args=(server.base_url, key))
                       for _ in range(2)]  # fmt: skip
            for c in clients:
                c.start()
            incidents = host_dir() / "incidents"
            _until(lambda: incidents.is_dir() and any(incidents.glob("*/dump-*.txt")), 90,
                   "a stall incident", log)  # fmt: skip
        finally:
            os.kill(core, signal.SIGCONT)
        for c in clients:
            c.join(60)
        _until(lambda: len(_snapshots(host_dir())) >= 3, 120, "three snapshots", log)
        _until(lambda: len(moto.objects()) > 0, 120, "an upload", log)
        time.sleep(5)
    finally:
        if daemon is not None:
            sidecar_proc.kill(daemon, 30)
        with suppress(Exception):
            os.kill(engine_core(server), signal.SIGCONT)
    try:
        found: dict[str, list[str]] = {}
        searched = {"files under the output folder": 0, "uploaded objects": 0, "bytes": 0}

        def search(where: str, data: bytes) -> None:
            searched["bytes"] += len(data)
            for what, value in needles.items():
                if value.encode() in data:
                    found.setdefault(what, []).append(where)

        for path in sorted(out.rglob("*")):
            if path.is_file() and not path.is_symlink() and not path.is_socket():
                searched["files under the output folder"] += 1
                search(str(path.relative_to(out)), path.read_bytes())
        client = moto.client()
        uploaded = moto.objects()
        for obj in uploaded:
            searched["uploaded objects"] += 1
            search(f"s3://{BUCKET}/{obj}", client.get_object(Bucket=BUCKET, Key=obj)["Body"].read())
        search("the daemon's log", log.read_bytes())
        latest = sorted(_snapshots(host_dir()))[-1]
        reports = {}
        for fmt in ("text", "json", "html"):
            extra = ["-o", str(work / "page.html")] if fmt == "html" else []
            command = sidecar_proc.argv("report", "--format", fmt, *extra, str(latest))
            done = subprocess.run(command, capture_output=True, env=sidecar_proc.env(), timeout=300)
            reports[fmt] = done.returncode
            search(f"report --format {fmt}", done.stdout + done.stderr)
        search("report --format html page", (work / "page.html").read_bytes())
        incident_dumps = sorted(str(p.relative_to(out)) for p in out.rglob("dump-*.txt"))
        redacted = sum(p.read_text(errors="replace").count("--api-key REDACTED")
                       for p in out.rglob("dump-*.txt"))  # fmt: skip
    finally:
        server.stop()
        moto.kill()
    vllm_leaks = key.encode() in (work / "vllm.log").read_bytes()
    record = {
        "what": "issue 26, item 1: devtools/secrets_check.py on the real vLLM CPU server",
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "vllm_flags": ["--api-key <random sk-...>", "--hf-token <random hf_...>"],
        "searched": searched,
        "snapshots": len(_snapshots(host_dir())),
        "incident_dumps": incident_dumps,
        "dumps_with_the_key_redacted": redacted,
        "reports_exit_codes": reports,
        "found": found,
        "note": "vLLM's own log prints its arguments, the key included"
        if vllm_leaks
        else "vLLM's own log does not print the key",
    }
    RECORD.parent.mkdir(parents=True, exist_ok=True)
    RECORD.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps(record, indent=1))
    return 1 if found or not incident_dumps else 0


if __name__ == "__main__":
    sys.exit(main())

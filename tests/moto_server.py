"""moto's S3 API server as a real process on loopback, for the upload tests and benchmark."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import boto3

from devtools.server import wait_listening

BUCKET = "profiles"


class MotoServer:
    """moto's S3 API server as a process of its own, on one port across restarts. Its state
    is in memory: a restart starts from no buckets (the tests create theirs again)."""

    def __init__(self, log: Path) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                # In the test run's process group (no start_new_session): it is one process
                # with no tree to signal, and a run killed by `timeout` or Ctrl-C, whose
                # fixtures never finish, then takes it down instead of leaving it listening.
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        try:  # readiness: the port accepts (the server binds once its app is built)
            wait_listening(self.port, self.proc, "moto server")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {self.log.read_text()[-2000:]}") from None
        self.client().create_bucket(Bucket=BUCKET)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def client(self) -> Any:
        return boto3.client("s3", endpoint_url=self.url, region_name="us-east-1")

    def objects(self) -> dict[str, int]:
        """Every object in the bucket: key -> size (boto3, not the code under test)."""
        pages = self.client().get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
        return {o["Key"]: o["Size"] for page in pages for o in page.get("Contents", [])}

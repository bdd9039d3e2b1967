"""Docker Compose v2 on docker-compose.yml with the CPU override, as one project of its own."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from devtools.deploy.engine import REPO, docker

SHIPPED = REPO / "docker-compose.yml"
CPU_OVERRIDE = REPO / "deploy" / "docker" / "docker-compose.cpu.yml"


@dataclass(frozen=True, slots=True)
class Compose:
    """`docker compose -p PROJECT -f FILE...` with the variables ENV, from the repository root."""

    binary: Path
    project: str
    files: tuple[Path, ...] = (SHIPPED, CPU_OVERRIDE)
    env: Mapping[str, str] = field(default_factory=dict)
    profiles: tuple[str, ...] = ()

    def argv(self, *args: str) -> list[str]:
        files = [a for f in self.files for a in ("-f", str(f))]
        profiles = [a for p in self.profiles for a in ("--profile", p)]
        return [str(self.binary), "-p", self.project, "--project-directory", str(REPO),
                *files, *profiles, *args]  # fmt: skip

    def call(
        self, *args: str, stdout: IO[str] | None = None, timeout_s: float = 600.0
    ) -> subprocess.CompletedProcess[str]:
        """Run it; its output goes to STDOUT (a log) or is captured."""
        import os

        env = {**os.environ, **self.env}
        return subprocess.run(
            self.argv(*args),
            cwd=REPO,
            env=env,
            text=True,
            timeout=timeout_s,
            check=False,
            **(
                {"stdout": stdout, "stderr": subprocess.STDOUT}
                if stdout
                else {"capture_output": True}
            ),
        )

    def container(self, service: str) -> str | None:
        """The ID of SERVICE's container (running or not), None if there is none."""
        result = self.call("ps", "-a", "-q", service, timeout_s=60)
        ids = result.stdout.split()
        return ids[0] if ids else None

    def inspect(self, service: str) -> dict[str, Any]:
        cid = self.container(service)
        if cid is None:
            return {}
        result = docker("inspect", cid, timeout_s=30)
        return dict(json.loads(result.stdout)[0]) if result.returncode == 0 else {}

    def volume_dir(self, volume: str) -> Path:
        """Where the engine keeps the project's named VOLUME on this host."""
        result = docker("volume", "inspect", "--format", "{{.Mountpoint}}",
                        f"{self.project}_{volume}", timeout_s=30)  # fmt: skip
        return Path(result.stdout.strip())

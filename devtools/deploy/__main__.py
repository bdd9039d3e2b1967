"""Run the Docker deployment for real and record it (issue 24): `make test-deploy`.

    .venv/bin/python -m devtools.deploy [images] [compose] [hostproc] [systemd]

From scratch: a Docker engine (the one that answers, else `dockerd` started here and stopped at
the end), the base image (debootstrap if missing), the images built by the engine, then the
scenarios, each under the live lock (/tmp/vllm-sidecar-live.lock: one vLLM on this machine at a
time). Everything it starts is removed at the end, also on failure: the compose project's
containers and volumes (`down -v`), the engine if it started one. The systemd scenario is
another module's (devtools/deploy/systemd_scenario.py, run as a subprocess when it exists; it
writes its own record). The record: tests/fixtures/deploy/docker.json and docker.log, checked
by tests/unit/project/test_deploy_record.py.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from devtools.deploy import images
from devtools.deploy.compose import CPU_OVERRIDE, SHIPPED, Compose
from devtools.deploy.engine import (
    BASE_IMAGE,
    REPO,
    DeployError,
    compose_binary,
    docker,
    engine,
    ensure_base,
    image_exists,
    live_lock,
)
from devtools.deploy.hostproc import hostproc_scenario
from devtools.deploy.scenarios import Ports, compose_scenario, test_override

RECORD_DIR = REPO / "tests" / "fixtures" / "deploy"
PROJECT = "vllm-sidecar-test"
SCENARIOS = ("images", "compose", "hostproc", "systemd")
SYSTEMD_MODULE = REPO / "devtools" / "deploy" / "systemd_scenario.py"


class Log:
    """The run's own log: one timestamped line a step (the commands' output goes to WORK)."""

    def __init__(self, path: Path) -> None:
        self.path, self.t0 = path, time.monotonic()
        path.write_text("")

    def __call__(self, message: str) -> None:
        now = time.strftime("%H:%M:%SZ", time.gmtime())
        line = f"{now} +{time.monotonic() - self.t0:6.1f}s {message}"
        print(line, flush=True)
        with self.path.open("a") as handle:
            handle.write(line + "\n")


def timed(say: Log, name: str, step: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """One scenario (the caller holds the live lock); its failure is recorded, not raised."""
    say(f"{name}: started")
    started = time.monotonic()
    try:
        out = {"ok": True, **step()}
    except (DeployError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc(limit=4)}  # fmt: skip
    out["seconds"] = round(time.monotonic() - started, 1)
    say(f"{name}: {'passed' if out['ok'] else 'FAILED: ' + out['error']} ({out['seconds']} s)")
    return out


def build_step(compose: Compose, work: Path) -> dict[str, Any]:
    built = images.build(compose, ("sidecar", "vllm", "nginx"), work / "build.log")
    base = images.image_size(BASE_IMAGE)
    return {"base": {"image": BASE_IMAGE, "size_bytes": base},
            "images": [asdict(b) for b in built]}  # fmt: skip


def systemd_step(say: Log) -> dict[str, Any]:
    """The other engineer's scenario, as a subprocess: exit 0 on success, its own record."""
    if not SYSTEMD_MODULE.exists():
        return {"ok": False, "skipped": "devtools/deploy/systemd_scenario.py does not exist yet"}
    started = time.monotonic()
    say("systemd: python -m devtools.deploy.systemd_scenario")
    try:
        code = subprocess.run([sys.executable, "-m", "devtools.deploy.systemd_scenario"],
                              cwd=REPO, check=False, timeout=3600).returncode  # fmt: skip
    except subprocess.TimeoutExpired:
        code = -9
    out = {"ok": code == 0, "exit_code": code,
           "seconds": round(time.monotonic() - started, 1),
           "record": "tests/fixtures/deploy/systemd.json"}  # fmt: skip
    say(f"systemd: exit {code} ({out['seconds']} s)")
    return out


def leftovers(compose: Compose) -> list[str]:
    """Containers and volumes of the project still there (there must be none)."""
    label = f"label=com.docker.compose.project={compose.project}"
    found = docker("ps", "-a", "-q", "--filter", label).stdout.split()
    found += docker("volume", "ls", "-q", "--filter", label).stdout.split()
    return found


def run(names: tuple[str, ...], work: Path, record_dir: Path) -> int:
    say = Log(record_dir / "docker.log")
    started = time.monotonic()
    record: dict[str, Any] = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit(),
        "machine": machine(),
        "scenarios": {},
    }
    with engine(work) as eng:
        say(f"engine: Docker {eng.version} ({'started here' if eng.started_here else 'running'})")
        record["engine"] = {"version": eng.version, "started_here": eng.started_here}
        waited, record["base_image"] = 0.0, "present"
        if not image_exists(BASE_IMAGE):  # debootstrap: CPU and disk for a minute, under the lock
            with live_lock() as waited:
                record["base_image"] = ensure_base(work)
        record["base_lock_wait_s"] = round(waited, 1)
        say(f"base image {BASE_IMAGE}: {record['base_image']}")
        binary = compose_binary()
        record["compose"] = subprocess.run([str(binary), "version", "--short"], capture_output=True,
                                           text=True, check=False).stdout.strip()  # fmt: skip
        ports = Ports.free()
        env = {**ports.env(), "VLLM_CPU_CONTEXT": str(images.VLLM_CONTEXT)}
        files = (SHIPPED, CPU_OVERRIDE, test_override(work))
        compose = Compose(binary, PROJECT, files, env)
        everything = Compose(binary, PROJECT, files, env, profiles=("*",))
        steps: dict[str, Callable[[], dict[str, Any]]] = {
            "images": lambda: build_step(compose, work),
            "compose": lambda: compose_scenario(compose, work, ports, work / "compose.log"),
            "hostproc": lambda: hostproc_scenario(
                Compose(binary, PROJECT, files, env, profiles=("host-proc", "nginx")),
                work, ports, work / "compose.log"),
        }  # fmt: skip
        try:
            # One hold of the live lock for the Docker scenarios (about 10 min with the images
            # cached): released between them, another job's vLLM run would wedge in each time.
            with live_lock() as waited:
                record["lock_wait_s"] = round(waited, 1)
                say(f"live lock taken (waited {waited:.0f} s)")
                for name in names:
                    if name in steps:
                        record["scenarios"][name] = timed(say, name, steps[name])
                        save(record, record_dir)  # so far, should a later step never end
        finally:
            everything.call("down", "-v", "--remove-orphans", timeout_s=300)
            record["left_behind"] = leftovers(compose)
            say(f"compose down -v: left behind {record['left_behind'] or 'nothing'}")
            save(record, record_dir)
        if "systemd" in names:  # it takes the live lock itself; the engine is still up
            record["scenarios"]["systemd"] = systemd_step(say)
    record["total_s"] = round(time.monotonic() - started, 1)
    waits = record.get("base_lock_wait_s", 0.0) + record.get("lock_wait_s", 0.0)
    record["total_without_lock_waits_s"] = round(record["total_s"] - waits, 1)
    failed = [n for n, s in record["scenarios"].items() if not s.get("ok") and "skipped" not in s]
    record["failed"] = failed
    save(record, record_dir)
    say(f"done in {record['total_s']} s; failed: {failed or 'none'}; work folder {work}")
    return 1 if failed or record["left_behind"] else 0


def save(record: dict[str, Any], record_dir: Path) -> None:
    (record_dir / "docker.json").write_text(json.dumps(record, indent=2) + "\n")


def commit() -> str:
    """The checkout's commit, and whether files differ from it (read only)."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                          text=True, check=False).stdout.strip()  # fmt: skip
    dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO, capture_output=True,
                           text=True, check=False).stdout.strip()  # fmt: skip
    return head + (" + uncommitted changes" if dirty else "")


def machine() -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text()
                .splitlines() if ln.startswith("model name")), None)  # fmt: skip
    return {"cpu": cpu, "kernel": platform.release(), "python": platform.python_version()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.deploy",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "scenarios", nargs="*", help=f"some of {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--work", type=Path, default=None, help="default: a new temporary folder")
    parser.add_argument("--record", type=Path, default=RECORD_DIR)
    args = parser.parse_args(argv)
    names = tuple(args.scenarios) or SCENARIOS
    if unknown := sorted(set(names) - set(SCENARIOS)):
        parser.error(f"unknown scenario {', '.join(unknown)}: choose from {', '.join(SCENARIOS)}")
    work = args.work or Path(tempfile.mkdtemp(prefix="vllm-sidecar-deploy-"))
    work.mkdir(parents=True, exist_ok=True)
    args.record.mkdir(parents=True, exist_ok=True)
    try:
        return run(names, work, args.record)
    except DeployError as exc:
        print(f"python -m devtools.deploy: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

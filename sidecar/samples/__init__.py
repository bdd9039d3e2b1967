"""The snapshots shipped with the package, and writing them out (`vllm-sidecar samples DIR`).

`data/` is a daemon's output folder, recorded from real runs of `vllm-sidecar run` against the
tiny vLLM CPU server (devtools/record_samples.py): a host folder of two-minute snapshots under
three loads (steady, prefill-heavy, KV-starved), the baseline of the steady ones, and a stall's
incident. `recording.json` says how and when, and what each folder is; `README.md` says it for
people and is written out beside the host folder. Each folder's stacks.collapsed is not shipped
but written out from its stacks.parquet by the store's own function (the same rows in the same
order: byte for byte the file the daemon wrote, which the recorder checked and whose sha256
recording.json keeps): they are 2.5 of the 3.1 MiB written, the package holds 0.6 MB.

They are read through importlib.resources, never from a path beside this file, so they are
found in a wheel, a zip or a `pip install --target` folder alike. Each top-level entry appears
whole or not at all (written under a temporary name, then renamed).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from sidecar.errors import InputError, OutputError
from sidecar.store.atomic import replace_folder, write_file, write_folder
from sidecar.store.layout import parse_name
from sidecar.store.stacks import COLLAPSED, PARQUET

PACKAGE = __name__
DATA = "data"  # the output folder: <host>/<snapshot folders>, <host>/incidents/<incident>
README = "README.md"
RECORDING = "recording.json"
SKIPPED = ("__pycache__",)  # never shipped data, should a build leave one


@dataclass(frozen=True, slots=True)
class Sample:
    """One shipped folder: `path` under DIR (`vm/20261207T010003Z`), `kind` (snapshot,
    baseline or incident), `sample` (prefill-heavy, steady, kv-starved, incident: what it
    shows) and a line `about` it."""

    path: str
    kind: str
    sample: str
    about: str

    @property
    def started(self) -> datetime | None:
        """The window's start (UTC), from the folder's name; None for an incident."""
        named = parse_name(Path(self.path).name)
        return None if named is None else datetime.fromtimestamp(named[1], tz=UTC)


@dataclass(frozen=True, slots=True)
class Samples:
    """What was written (or would be): the folder, its host folder, the samples oldest first,
    and how they were recorded."""

    dest: Path
    host: str
    samples: tuple[Sample, ...]
    files: int
    size_bytes: int
    recorded: str  # when (UTC)
    vllm: str  # the vLLM version recorded against

    def of(self, sample: str, kind: str = "snapshot") -> list[Sample]:
        return [s for s in self.samples if s.sample == sample and s.kind == kind]


def write_samples(dest: Path, *, force: bool = False, package: str = PACKAGE) -> Samples:
    """Write the shipped output folder into DEST (made if missing), with README.md beside the
    host folder. DEST must be missing or empty; with `force`, the samples' own entries (the
    host folder and README.md) replace what is there under those names and nothing else is
    touched. OutputError names the fix."""
    root = resources.files(package)
    data = root / DATA
    hosts = [entry for entry in data.iterdir() if entry.is_dir() and _shipped(entry.name)]
    if len(hosts) != 1:
        raise InputError(f"the package's samples are missing or broken ({len(hosts)} host "
                         f"folders in {package}/{DATA}): reinstall vllm-sidecar")  # fmt: skip
    host = hosts[0]
    _check_dest(dest, force, (host.name, README))
    write: Callable[..., None] = replace_folder if force else write_folder
    try:
        dest.mkdir(parents=True, exist_ok=True)
        write(dest / host.name, lambda tmp: _copy(host, tmp), durable=False)
        write_file(dest / README, (root / README).read_bytes(), durable=False)
    except OSError as exc:
        raise OutputError(f"cannot write the samples to {dest}: {exc}: give a writable folder "
                          "with about 2 MB free") from exc  # fmt: skip
    return described(dest, package)


def described(dest: Path, package: str = PACKAGE) -> Samples:
    """The samples as recording.json lists them, for DEST, with the files and bytes written
    under DEST's host folder (none where it is not there)."""
    root = resources.files(package)
    try:
        record = json.loads((root / RECORDING).read_text())
        folders = record["folders"]
        samples = [Sample(path, f["kind"], f["sample"], f["about"]) for path, f in folders.items()]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InputError(f"the package's {RECORDING} cannot be read ({exc}): reinstall "
                         "vllm-sidecar") from None  # fmt: skip
    samples.sort(key=lambda s: (s.started or datetime.max.replace(tzinfo=UTC), s.path))
    host = samples[0].path.split("/", 1)[0] if samples else ""
    files = [p for p in (dest / host).rglob("*") if p.is_file()] if host else []
    size = sum(p.stat().st_size for p in files)
    vllm = str(record.get("healthy", {}).get("vllm_log", {}).get("version") or "unknown")
    return Samples(dest, host, tuple(samples), len(files), size, str(record.get("recorded")), vllm)


def next_commands(written: Samples, shown: str) -> list[tuple[str, str]]:
    """The commands to try on the written folder, each with what it shows; SHOWN is the
    folder as the user named it (kept relative), quoted for a POSIX shell."""

    def at(path: str) -> str:
        return shlex.quote(f"{shown.rstrip('/')}/{path}")

    top = shlex.quote(shown)
    steady, prefill = written.of("steady"), written.of("prefill-heavy")
    incidents = written.of("incident", "incident")
    first = min((s.started for s in written.samples if s.started), default=None)
    out = [
        (f"vllm-sidecar report {top}", "the latest snapshot: the KV-starved server"),
        (f"vllm-sidecar diff --baseline {top}",
         "the latest baseline (steady) against it: what changed, and is it real"),
    ]  # fmt: skip
    if steady and prefill:
        out.append((f"vllm-sidecar diff {at(steady[-1].path)} {at(prefill[-1].path)}",
                    "one server under two workloads"))  # fmt: skip
    if prefill:
        out.append((f"vllm-sidecar flamegraph {at(prefill[-1].path)} -o {at('flame')}",
                    "a flame graph (SVG) and a speedscope profile, by phase"))  # fmt: skip
    if incidents:
        out.append((f"vllm-sidecar report {at(incidents[-1].path)}",
                    "the stall's incident: where each process was"))  # fmt: skip
    if first is not None:
        out.append((f"vllm-sidecar trend {top} --since {first:%Y-%m-%dT%H:%M}",
                    "shares and vLLM's figures over the recording, level changes"))  # fmt: skip
    out.append((f"vllm-sidecar report --format html -o {at('report.html')} {top}",
                "one page: findings, phases, flame graph, trend, the diff"))  # fmt: skip
    return out


# ---------------------------------------------------------------------------------- helpers


def _shipped(name: str) -> bool:
    return not name.startswith(".") and name not in SKIPPED


def _check_dest(dest: Path, force: bool, entries: tuple[str, ...]) -> None:
    if dest.exists() and not dest.is_dir():
        raise OutputError(f"{dest} is not a folder: give a new or empty folder for the samples")
    if force or not dest.exists():
        return
    present = sorted(p.name for p in dest.iterdir())
    if present:
        clash = [name for name in entries if name in present]
        hint = (f"add --force to replace the samples there ({', '.join(clash)}; nothing else "
                "is touched)" if clash else "give a new or empty folder")  # fmt: skip
        shown = ", ".join(present[:3]) + (", ..." if len(present) > 3 else "")
        raise OutputError(f"{dest} is not empty ({shown}): {hint}")


def collapsed_of(folder: Path) -> str:
    """stacks.collapsed as the store writes it (sidecar/store/writers.py), from FOLDER's
    stacks.parquet: its rows in their order."""
    from sidecar.dataframes import read_stacks
    from sidecar.store.stacks import collapsed_text

    return collapsed_text(read_stacks(folder / PARQUET).to_dict("records"))


def _copy(source: Traversable, dest: Path) -> None:
    """SOURCE's tree into the folder DEST (which exists), dot entries and caches left out;
    stacks.collapsed written beside each stacks.parquet."""
    for entry in source.iterdir():
        if not _shipped(entry.name):
            continue
        target = dest / entry.name
        if entry.is_dir():
            target.mkdir()
            _copy(entry, target)
        else:
            target.write_bytes(entry.read_bytes())
    if (dest / PARQUET).is_file() and not (dest / COLLAPSED).exists():
        (dest / COLLAPSED).write_text(collapsed_of(dest))

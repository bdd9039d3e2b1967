"""The output folder's layout, the one module that knows it; the store writes it
(sidecar/store/folders.py) and every reader finds its way through it here:

    OUT/                               the daemon's output.dir (--out)
      <host>/                          a host folder; a daemon with `targets:` writes one
        <deployment>/                  deployment folder per server, read as a host folder
          index.json                   the store's index (latest, latest_baseline, gaps, and
                                       `folders`: the snapshot folders the daemon wrote)
          .daemon.lock                 the running daemon's lock and PID (one daemon a folder)
          snapshots.parquet, .table/   the trend table (sidecar/store/trend_table.py)
          .uploads/                    the upload markers (sidecar/store/upload.py)
          <UTC>[-baseline][-<n>]/      a snapshot folder: summary.json, stacks.parquet, ...

`snapshot --out OUT` writes snapshot folders straight into OUT, which then reads as a host
folder. Standard library only: the daemon's uploader reads it, and loads no reader's library.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

from sidecar.errors import InputError

INDEX_NAME = "index.json"
LOCK_NAME = ".daemon.lock"
SUMMARY_NAME = "summary.json"
TABLE_NAME = "snapshots.parquet"
PARTS_DIR = ".table"
MARKERS_DIR = ".uploads"
TS_FORMAT = "%Y%m%dT%H%M%SZ"
# `write_snapshot` appends `-1`, `-2` to a taken name, so a baseline collision is `TS-baseline-1`.
SNAPSHOT_NAME = re.compile(r"^(?P<ts>\d{8}T\d{6}Z)(?P<baseline>-baseline)?(?:-(?P<seq>\d+))?$")
# A folder dated further ahead of the clock than this is not taken as the latest, and the
# store's retention neither counts nor deletes it until the clock reaches it (issue 26, item 11:
# written by a clock that ran ahead, it stayed "latest" for ever).
CLOCK_SLACK_S = 86_400.0


class SnapshotKind(StrEnum):
    """What the store keeps a window as: a regular snapshot, or a baseline (its own retention,
    `-baseline` in its folder's name, what `diff --baseline` compares against)."""

    SNAPSHOT = "snapshot"
    BASELINE = "baseline"


@dataclass(frozen=True, slots=True)
class SnapshotFolder:
    """One complete snapshot folder, as its name tells it."""

    path: Path
    kind: SnapshotKind
    started: float  # Unix seconds of the window start, from the folder name
    seq: int  # the collision suffix

    @property
    def name(self) -> str:
        return self.path.name


def folder_name(snapshot: str, kind: SnapshotKind) -> str:
    """The folder a snapshot named SNAPSHOT (its UTC start) is kept in, as KIND."""
    return snapshot + ("-baseline" if kind is SnapshotKind.BASELINE else "")


def parse_name(name: str) -> tuple[SnapshotKind, float, int] | None:
    """A snapshot folder's name -> (kind, window start in Unix seconds, collision suffix), or
    None when it is no snapshot folder's name."""
    m = SNAPSHOT_NAME.match(name)
    if m is None:
        return None
    try:
        started = datetime.strptime(m["ts"], TS_FORMAT).replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None
    kind = SnapshotKind.BASELINE if m["baseline"] else SnapshotKind.SNAPSHOT
    return kind, started, int(m["seq"] or 0)


def snapshot_folder(path: Path) -> SnapshotFolder | None:
    named = parse_name(path.name)
    return None if named is None else SnapshotFolder(path, *named)


def snapshot_names(host_dir: Path) -> set[str]:
    """The names of every complete snapshot folder in a host folder (a scandir: no stat of
    their files, and no Path object per folder: 9,000 of them cost 0.2 s)."""
    with os.scandir(host_dir) as entries:
        return {
            e.name
            for e in entries
            if SNAPSHOT_NAME.match(e.name) and e.is_dir(follow_symlinks=False)
        }


def is_host_folder(folder: Path) -> bool:
    """Whether FOLDER holds snapshots (or the store's index or trend table) itself."""
    if (folder / INDEX_NAME).is_file() or (folder / TABLE_NAME).is_file():
        return True
    try:
        with os.scandir(folder) as entries:
            return any(SNAPSHOT_NAME.match(e.name) and e.is_dir() for e in entries)
    except OSError:
        return False


def indexed_host(folder: Path) -> str | None:
    """The host the store's index.json names, when it names one beside a deployment (the
    folder is then a deployment folder, `OUT/<host>/<deployment>`)."""
    doc = _index(folder)
    if doc.get("deployment") and isinstance(doc.get("host"), str):
        return str(doc["host"])
    return None


def folder_label(host_dir: Path) -> str:
    """What a host folder is called in a report: its name, or `<host>/<deployment>` for a
    deployment folder of a daemon with `targets:` (its index.json names both)."""
    doc = _index(host_dir)
    if doc.get("deployment") and doc.get("host"):
        return f"{doc['host']}/{doc['deployment']}"
    return host_dir.name


def summary_deployment(folder: Path) -> str | None:
    """The `model@port` a snapshot folder's summary.json names (plain JSON: the daemon, which
    reads it to upload the folder, does not load pydantic)."""
    try:
        doc = json.loads((folder / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return None
    value = doc.get("deployment") if isinstance(doc, dict) else None
    return value if isinstance(value, str) and value else None


@dataclass(frozen=True, slots=True)
class OutputTree:
    """A folder a reader is pointed at: the daemon's output.dir, one host (or deployment)
    folder in it, or any folder of snapshot folders."""

    root: Path

    def hosts(self) -> list[str]:
        """The host folders under the root: `<host>`, or `<host>/<deployment>` for each
        deployment of a daemon with several targets (sidecar/daemon/multi_target.py)."""
        found: list[str] = []
        with os.scandir(self.root) as entries:
            for e in entries:
                if not e.is_dir():
                    continue
                if is_host_folder(Path(e.path)):
                    found.append(e.name)
                else:
                    found.extend(f"{e.name}/{d}" for d in OutputTree(Path(e.path)).deployments())
        return sorted(found)

    def deployments(self) -> list[str]:
        """The deployment folders in the root, a host folder of a daemon with `targets:`."""
        try:
            with os.scandir(self.root) as entries:
                return [e.name for e in entries if e.is_dir() and not e.name.startswith(".")
                        and is_host_folder(Path(e.path))]  # fmt: skip
        except OSError:
            return []

    def host_folder(self, host: str | None) -> Path:
        """The root itself when it is a host folder, else root/<host>: the one host under it,
        or the one `host` names."""
        out = self.root
        if not out.is_dir():
            raise InputError(f"{out} is not a folder: point at the daemon's output.dir (--out)")
        if host is not None:
            folder = out / host if not (is_host_folder(out) and out.name == host) else out
            if not is_host_folder(folder):
                raise InputError(f"no snapshots of host {host!r} under {out}: {self._hint()}")
            return folder
        if is_host_folder(out):
            return out
        hosts = self.hosts()
        if len(hosts) == 1:
            return out / hosts[0]
        if not hosts:
            raise InputError(
                f"no snapshot folders under {out}: point at the daemon's output.dir (--out) or "
                "one host folder in it"
            )
        raise InputError(f"{out} holds several hosts: pick one with --host ({', '.join(hosts)})")

    def host_folders(self, host: str | None) -> list[Path]:
        """Every host folder the root names: itself when it is one, the one `host` picks, else
        each host under it (readers that take them all, such as the exports)."""
        out = self.root
        if host is not None or not out.is_dir() or is_host_folder(out):
            return [self.host_folder(host)]
        hosts = self.hosts()
        if not hosts:
            self.host_folder(None)  # raises: it says what to point at
        return [out / h for h in hosts]

    def snapshots(self, kind: SnapshotKind | None = None) -> list[SnapshotFolder]:
        """The snapshot folders (of KIND; None: both) with a summary.json in the root or one
        level down (the host folders of an output root), oldest first."""
        out = []
        for parent in (self.root, *sorted(p for p in _children(self.root) if p.is_dir())):
            for path in _children(parent):
                folder = snapshot_folder(path)
                if folder is not None and (path / SUMMARY_NAME).is_file():
                    out.append(folder)
        out.sort(key=lambda f: (f.started, f.name))
        return [f for f in out if kind is None or f.kind is kind]

    def latest(
        self, kind: SnapshotKind | None = None, now: float | None = None
    ) -> SnapshotFolder | None:
        """The newest of `snapshots(kind)` not dated more than CLOCK_SLACK_S ahead of `now`
        (the clock); None when there is none."""
        limit = (time.time() if now is None else now) + CLOCK_SLACK_S
        found = [f for f in self.snapshots(kind) if f.started <= limit]
        return found[-1] if found else None

    def _hint(self) -> str:
        hosts = self.hosts() if self.root.is_dir() else []
        return f"hosts there: {', '.join(hosts)}" if hosts else "give the daemon's output.dir"


def _index(folder: Path) -> dict[str, object]:
    try:
        doc = json.loads((folder / INDEX_NAME).read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:
        return []

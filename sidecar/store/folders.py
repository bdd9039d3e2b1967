"""The snapshot store: `OUT/<host>/<UTC timestamp>[-baseline]/` folders (the layout:
sidecar/store/layout.py), their index, retention and the disk-space policy. A full disk is
data, not a crash (STYLE.md 7): a write that would leave less than `min_free`, or that the
kernel refuses, is skipped with a reason and logged once per transition. Folders appear
atomically, deletions rename to a hidden name first and the index is replaced atomically, so a
reader only ever sees complete snapshots. Each write also adds the snapshot's row to the trend
table (`sidecar.store.trend_table`); a table that cannot be written costs no snapshot: `trend`
rebuilds the rows it lacks from the summaries."""

from __future__ import annotations

import bisect
import contextlib
import errno
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sidecar import outproc
from sidecar.errors import OutputError
from sidecar.store.atomic import aside_path, write_file
from sidecar.store.layout import (
    INDEX_NAME,
    MARKERS_DIR,
    PARTS_DIR,
    SNAPSHOT_NAME,
    TABLE_NAME,
    SnapshotKind,
    folder_name,
    snapshot_folder,
)
from sidecar.store.writers import write_snapshot
from sidecar.window.snapshot import Snapshot

log = logging.getLogger("vllm_sidecar")

INDEX_SCHEMA = 1
MAX_GAPS = 100
# What a killed process leaves: the temporary `.<name>.tmp-<pid>` of a write and the
# `.<name>.del-<pid>` of a delete (every writer names them so: sidecar/store/atomic.py).
_LEFTOVER = re.compile(r"^\.(?P<name>.+)\.(?:tmp|del)-(?P<pid>\d+)$")
_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def _writes_here(leftover: str) -> bool:
    """Whether `.NAME.tmp-PID` / `.NAME.del-PID` names what the store writes in a host folder."""
    m = _LEFTOVER.match(leftover)
    return m is not None and (
        SNAPSHOT_NAME.match(m["name"]) is not None or m["name"] in (INDEX_NAME, TABLE_NAME)
    )


DiskUsage = Callable[[Path], tuple[int, int, int]]  # (total, used, free), as shutil.disk_usage


class DiskState(StrEnum):
    OK = "ok"
    LOW = "low"


@dataclass(frozen=True, slots=True)
class Retention:
    max_age_s: float | None
    baseline_max_age_s: float | None
    max_total_bytes: int | None
    min_free_bytes: int


@dataclass(frozen=True, slots=True)
class WriteOutcome:
    path: Path | None
    skipped_reason: str | None = None
    deleted: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """One complete snapshot folder as the store accounts for it (one scan, then kept current)."""

    path: Path
    kind: SnapshotKind
    started: float  # Unix seconds of the window start, from the folder name
    seq: int  # the collision suffix
    bytes: int

    @classmethod
    def parse(cls, folder: Path) -> StoredSnapshot | None:
        named = snapshot_folder(folder)
        if named is None:
            return None
        return cls(folder, named.kind, named.started, named.seq, _folder_bytes(folder))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def created_at(self) -> str:
        return _iso(self.started)

    def as_index(self) -> dict[str, str]:
        return {"name": self.name, "kind": self.kind.value, "created_at": self.created_at}


def check_writable(folder: Path) -> None:
    """Whether the daemon may start (or reload) with `folder` as its output: it must be a folder
    that can be created and written. A full disk passes: that is data, a skipped write (STYLE.md
    7); a path under a file, a read-only mount or a folder of another user is configuration."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if _is_space_error(exc):
            return
        raise OutputError(
            f"cannot create the output folder {folder}: {exc.strerror or exc}; set output.dir "
            "(--out) to a folder the sidecar may write"
        ) from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(
            f"the output folder {folder} is not writable by this user (uid {os.getuid()}); "
            "fix its owner or mode, or set output.dir (--out) elsewhere"
        )


class SnapshotStore:
    def __init__(
        self,
        root: Path,
        host: str,
        retention: Retention,
        disk_usage: DiskUsage = shutil.disk_usage,
        clock: Callable[[], float] = time.time,
        deployment: str | None = None,
    ) -> None:
        """`deployment`: one of several vLLM servers on the host
        (sidecar/daemon/multi_target.py); its folders go under `root/<host>/<deployment>/`, a
        folder every reader takes as it takes
        a host folder. None: `root/<host>/`, as a daemon with one target has always written."""
        self.root = Path(root)
        self.host = host
        self.deployment = deployment
        self.dir = self.root / host / deployment if deployment else self.root / host
        self.retention = retention
        self._disk_usage = disk_usage
        self._clock = clock
        # Folders retention and the disk guard must keep: those waiting for their upload.
        self._held: Callable[[str], bool] | None = None
        self._lock = threading.RLock()
        self.disk_state = DiskState.OK
        self.free_bytes = 0
        self.snapshots_written = self.writes_skipped = self.deleted_total = 0
        self._failing: str | None = None  # the write failure last logged: each is logged once
        self._index_failing = False
        self._table_failing = False
        self._entries = self._scan()
        self._estimate = self._entries[-1].bytes if self._entries else 0
        gaps = (self._read_index() or {}).get("gaps")
        self._gaps: list[dict[str, Any]] = gaps[-MAX_GAPS:] if isinstance(gaps, list) else []
        self._probe()
        self._write_index()

    def set_hold(self, held: Callable[[str], bool] | None) -> None:
        """`held(name)`: True while a folder may not be deleted (its upload is not confirmed,
        sidecar/store/upload.py); None: every folder is retention's to delete."""
        with self._lock:
            self._held = held

    def _deletable(self) -> list[StoredSnapshot]:
        held = self._held
        return [e for e in self._entries if held is None or not held(e.name)]

    def write(self, snapshot: Snapshot, kind: SnapshotKind) -> WriteOutcome:
        """Retention, room for the snapshot, then an atomic write; never raises on a full disk."""
        with self._lock:
            deleted = self._retire(reserve=self._estimate) + self._make_room()
            shortfall = self._shortfall()
            if shortfall is not None:
                return self._skipped(shortfall, space=True, deleted=deleted)
            name = folder_name(snapshot.name, kind)
            keep = {e.name for e in self._entries} | {name}
            try:
                # The folder and its trend-table row: in a forked child in the daemon, so that
                # pandas and pyarrow never stay loaded in it (sidecar/outproc.py).
                written, table_error = outproc.call(
                    lambda: _write_files(snapshot, self.dir, name, kind, keep)
                )
            except (OutputError, OSError) as exc:
                return self._skipped(str(exc), space=_is_space_error(exc), deleted=deleted)
            path = Path(written)
            self._added(path)
            self._tabulated(table_error)
            return WriteOutcome(path, None, tuple(deleted))

    def _tabulated(self, error: str | None) -> None:
        """Say when the trend table cannot be updated (once), and when it can again."""
        if error is not None:
            if not self._table_failing:
                log.warning("cannot update the trend table under %s (the snapshots are written; "
                            "`vllm-sidecar trend` rebuilds its rows from them): %s",
                            self.dir, error)  # fmt: skip
            self._table_failing = True
            return
        if self._table_failing:
            log.info("updating the trend table under %s again", self.dir)
        self._table_failing = False

    def record_gap(self, start_wall: float, end_wall: float | None, reason: str) -> None:
        """Note a time without snapshots (target down); a gap left open (`end_wall` None) is
        closed by the next call with the same start."""
        gap = {"from": _iso(start_wall), "to": _iso(end_wall) if end_wall is not None else None,
               "reason": reason}  # fmt: skip
        with self._lock:
            last = self._gaps[-1] if self._gaps else None
            if last is not None and last["from"] == gap["from"] and last["to"] is None:
                self._gaps[-1] = gap
            else:
                self._gaps.append(gap)
            del self._gaps[:-MAX_GAPS]
            self._write_index()

    def cleanup_temp(self) -> tuple[str, ...]:
        """Remove what a killed writer left (`kill -9` mid-write); called at start. A leftover of
        a dead pid goes, and one with our own pid (we hold the write lock, so it is not in flight;
        in a container the sidecar is PID 1 on every run); another live process's is kept."""
        removed: list[str] = []
        with self._lock:
            # In the host folder only the names the store writes there (a snapshot folder, the
            # index, the table), not a user's `.notes.tmp-123` (issue 26, item 5); the parts
            # and markers folders hold nothing but the store's own files.
            ours = [p for p in _children(self.dir) if _writes_here(p.name)]
            for path in [*ours, *_children(self.dir / PARTS_DIR),
                         *_children(self.dir / MARKERS_DIR)]:  # fmt: skip
                m = _LEFTOVER.match(path.name)
                pid = int(m["pid"]) if m else None
                if pid is None or (pid != os.getpid() and _pid_alive(pid)):
                    continue
                _remove(path)
                removed.append(path.name)
        if removed:
            log.info("removed %d leftover temporary folders under %s", len(removed), self.dir)
        return tuple(removed)

    def latest(self) -> StoredSnapshot | None:
        """The newest folder of either kind, as the index names it (a scan if it cannot)."""
        return self._from_index("latest")

    def latest_baseline(self) -> StoredSnapshot | None:
        return self._from_index("latest_baseline")

    def snapshots(self) -> tuple[StoredSnapshot, ...]:
        """Every complete snapshot folder, oldest first (from memory, no scan)."""
        with self._lock:
            return tuple(self._entries)

    @property
    def total_bytes_used(self) -> int:
        return sum(e.bytes for e in self._entries)

    def _retire(self, reserve: int) -> list[str]:
        return self._delete_all(self._expired()) + self._delete_all(self._over_size(reserve))

    def _expired(self) -> list[StoredSnapshot]:
        now, keep, r = self._clock(), self._newest(SnapshotKind.BASELINE), self.retention
        ages = {SnapshotKind.SNAPSHOT: r.max_age_s, SnapshotKind.BASELINE: r.baseline_max_age_s}
        return [
            e
            for e in self._deletable()
            if e is not keep and (age := ages[e.kind]) is not None and now - e.started > age
        ]

    def _over_size(self, reserve: int) -> list[StoredSnapshot]:
        """Oldest regular snapshots first, then old baselines; never the newest baseline.
        `reserve` makes room for the coming write, unless one snapshot is over the limit alone."""
        limit = self.retention.max_total_bytes
        if limit is None:
            return []
        excess = self.total_bytes_used + (reserve if reserve < limit else 0) - limit
        keep = self._newest(SnapshotKind.BASELINE)
        candidates = [e for e in self._deletable() if e is not keep]
        out = []
        for e in sorted(
            candidates, key=lambda e: e.kind is SnapshotKind.BASELINE
        ):  # stable: by age
            if excess <= 0:
                break
            out.append(e)
            excess -= e.bytes
        return out

    def _make_room(self) -> list[str]:
        """Delete the oldest regular snapshots while free space is short, but only when that can
        make room: a disk filled by something else must not cost the whole history."""
        free, need = self._probe(), self._need()
        if free is None or free >= need:
            return []
        regular = [e for e in self._deletable() if e.kind is SnapshotKind.SNAPSHOT]
        if free + sum(e.bytes for e in regular) < need:
            return []
        deleted: list[str] = []
        for e in regular:
            if free is None or free >= need or not self._delete(e):
                break
            deleted.append(e.name)
            free = self._probe()
        if deleted:
            log.info("deleted %d old snapshots under %s to make room", len(deleted), self.dir)
        return deleted

    def _shortfall(self) -> str | None:
        free, need, floor = self._probe(), self._need(), self.retention.min_free_bytes
        if free is None or free >= need:
            self.disk_state = DiskState.OK
            return None
        return (
            f"disk nearly full: {_size(free)} free under {self.root}, need {_size(need)} "
            f"({_size(floor)} min_free + {_size(self._estimate)} for the snapshot); keeping the "
            "baselines: free space there or lower output.min_free_mb"
        )

    def _need(self) -> int:
        return self.retention.min_free_bytes + self._estimate

    def _skipped(self, reason: str, *, space: bool, deleted: list[str]) -> WriteOutcome:
        self.writes_skipped += 1
        if space:
            self.disk_state = DiskState.LOW
        key = "space" if space else reason
        if self._failing != key:
            log.warning("snapshots are not being written: %s", reason)
            self._failing = key
        self._write_index()
        return WriteOutcome(None, reason, tuple(deleted))

    def _added(self, path: Path) -> None:
        entry = StoredSnapshot.parse(path)
        assert entry is not None, path  # the name comes from Snapshot.name: a UTC timestamp
        bisect.insort(self._entries, entry, key=_order)
        self.snapshots_written += 1
        self._estimate = entry.bytes
        self._probe()
        self.disk_state = DiskState.OK
        if self._failing is not None:
            log.info("writing snapshots again under %s (%s free)", self.dir,
                     _size(self.free_bytes))  # fmt: skip
            self._failing = None
        self._write_index()

    def _delete_all(self, doomed: list[StoredSnapshot]) -> list[str]:
        return [e.name for e in doomed if self._delete(e)]

    def _delete(self, e: StoredSnapshot) -> bool:
        """Rename to a hidden name first, so no reader sees a half-deleted folder."""
        hidden = aside_path(self.dir / e.name)
        try:
            os.replace(self.dir / e.name, hidden)
        except FileNotFoundError:
            pass  # deleted by hand: only the accounting is left to fix
        except OSError as exc:
            log.warning("cannot delete old snapshot %s: %s", self.dir / e.name, exc)
            return False
        shutil.rmtree(hidden, ignore_errors=True)  # a leftover goes at the next cleanup_temp
        self._entries.remove(e)
        self.deleted_total += 1
        return True

    def _newest(self, kind: SnapshotKind | None) -> StoredSnapshot | None:
        of_kind = [e for e in self._entries if kind is None or e.kind is kind]
        return of_kind[-1] if of_kind else None

    def _probe(self) -> int | None:
        """Free bytes where the snapshots go (the nearest folder that exists yet)."""
        path = self.dir
        while not path.exists() and path != path.parent:
            path = path.parent
        try:
            self.free_bytes = int(self._disk_usage(path)[2])  # (total, used, free)
        except OSError as exc:
            log.debug("cannot read free space under %s: %s", path, exc)
            return None
        return self.free_bytes

    def _scan(self) -> list[StoredSnapshot]:
        found = (StoredSnapshot.parse(p) for p in _children(self.dir) if p.is_dir())
        return sorted((e for e in found if e is not None), key=_order)

    def _index_doc(self) -> dict[str, Any]:
        latest, baseline = self._newest(None), self._newest(SnapshotKind.BASELINE)
        return {
            "schema": INDEX_SCHEMA,
            "host": self.host,
            **({"deployment": self.deployment} if self.deployment else {}),
            "updated_at": _iso(self._clock()),
            "latest": latest.as_index() if latest else None,
            "latest_baseline": baseline.as_index() if baseline else None,
            "counts": {k.value: sum(e.kind is k for e in self._entries) for k in SnapshotKind},
            "bytes": self.total_bytes_used,
            "gaps": self._gaps[-MAX_GAPS:],
            "disk": {"state": self.disk_state.value, "free_bytes": self.free_bytes},
        }

    def _write_index(self) -> None:
        """Written atomically (sidecar/store/atomic.py): readers see the old or the new."""
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_file(self.dir / INDEX_NAME, json.dumps(self._index_doc(), indent=2) + "\n")
        except OSError as exc:
            if not self._index_failing:
                log.warning("cannot update %s (the previous one stays): %s",
                            self.dir / INDEX_NAME, exc)  # fmt: skip
            self._index_failing = True
            return
        self._index_failing = False

    def _read_index(self) -> dict[str, Any] | None:
        try:
            doc = json.loads((self.dir / INDEX_NAME).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) and doc.get("schema") == INDEX_SCHEMA else None

    def _from_index(self, key: str) -> StoredSnapshot | None:
        with self._lock:
            try:
                return _entry(self._read_index(), key, self.dir)
            except ValueError as exc:
                log.info("rebuilding %s from a scan: %s", self.dir / INDEX_NAME, exc)
            self._entries = self._scan()
            self._write_index()
            return _entry(self._index_doc(), key, self.dir)


def _entry(doc: dict[str, Any] | None, key: str, folder: Path) -> StoredSnapshot | None:
    """The folder the index names under `key`; ValueError when the index is missing, bad or
    stale (names a folder that is gone)."""
    if doc is None or key not in doc:
        raise ValueError("missing or unreadable")
    if doc[key] is None:
        return None
    name = doc[key].get("name") if isinstance(doc[key], dict) else None
    entry = StoredSnapshot.parse(folder / name) if isinstance(name, str) else None
    if entry is None or not entry.path.is_dir():
        raise ValueError(f"{key!r} names {name!r}, which is not a snapshot folder")
    return entry


def _write_files(
    snapshot: Snapshot, folder: Path, name: str, kind: SnapshotKind, keep: set[str]
) -> tuple[str, str | None]:
    """The snapshot's folder, then its row in the trend table (every `COMPACT_EVERY` rows the
    parts are folded into the main file, dropping the rows of folders deleted since): the
    folder, and why the table could not be updated (None: it was)."""
    from sidecar.store.trend_table import COMPACT_EVERY, TableError, TrendTable, summary_row

    path = write_snapshot(snapshot, folder, name=name, kind=kind.value)
    table = TrendTable(folder)
    try:
        table.append(summary_row(snapshot.summary(kind.value), name=path.name))
        if len(table.parts()) >= COMPACT_EVERY:
            table.compact(keep=keep | {path.name})
    except (OSError, TableError) as exc:
        return str(path), str(exc)
    return str(path), None


def _is_space_error(exc: BaseException) -> bool:
    for e in (exc, exc.__cause__):
        if isinstance(e, OSError) and (e.errno in _SPACE_ERRNOS or "No space left" in str(e)):
            return True
    return False


def _children(folder: Path) -> list[Path]:
    try:
        return list(folder.iterdir())
    except OSError:  # not there yet, or not a folder
        return []


def _folder_bytes(folder: Path) -> int:
    total = 0
    for path in _children(folder):
        with contextlib.suppress(OSError):
            total += _folder_bytes(path) if path.is_dir() else path.stat().st_size
    return total


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, as another user's
    return True


def _order(e: StoredSnapshot) -> tuple[float, int]:
    return (e.started, e.seq)


def _iso(wall: float) -> str:
    return datetime.fromtimestamp(wall, tz=UTC).isoformat(timespec="seconds")


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**24 else f"{n / 2**20:.2f} MiB"

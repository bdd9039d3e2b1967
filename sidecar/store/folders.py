"""The snapshot store: `OUT/<host>/<UTC timestamp>[-baseline]/` folders (the layout:
sidecar/store/layout.py), their index, retention and the disk-space policy. A full disk is
data, not a crash (STYLE.md 7): a write that would leave less than `min_free`, or that the
kernel refuses, is skipped with a reason and logged once per transition. Folders appear
atomically, deletions rename to a hidden name first and the index is replaced atomically, so a
reader only ever sees complete snapshots. Each write also adds the snapshot's row to the trend
table (`sidecar.store.trend_table`); a table that cannot be written costs no snapshot: `trend`
rebuilds the rows it lacks from the summaries.

Retention deletes only the daemon's own folders, the ones its index lists (`SnapshotStore._scan`
says how a folder is counted as the daemon's when there is no list), never follows a link, and
ages folders by the time that passed, not by how far the clock was set (`ClockStep`). One daemon
writes a host folder at a time (`hold_folder`)."""

from __future__ import annotations

import bisect
import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

from sidecar import outproc
from sidecar.errors import ConfigError, OutputError
from sidecar.store.atomic import FILE_MODE, aside_path, make_folder, write_file
from sidecar.store.layout import (
    CLOCK_SLACK_S,
    INDEX_NAME,
    LOCK_NAME,
    MARKERS_DIR,
    PARTS_DIR,
    SNAPSHOT_NAME,
    SUMMARY_NAME,
    TABLE_NAME,
    SnapshotKind,
    folder_name,
    parse_name,
    snapshot_folder,
)
from sidecar.store.writers import free_name, write_snapshot
from sidecar.window.snapshot import Snapshot

log = logging.getLogger("vllm_sidecar")

INDEX_SCHEMA = 1
MAX_GAPS = 100
# A forward step of the wall clock that retention takes out of the folders' ages: smaller ones
# (NTP's everyday corrections, a leap second) cost a folder at most an hour of its life.
STEP_MIN_S = 3600.0
DAY_S = 86_400.0
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


@dataclass(frozen=True, slots=True)
class ClockStep:
    """A forward jump of the wall clock the store saw happen (issue 26, item 11: NTP fixing a
    host a week behind made a week-old history of every folder, and retention deleted it): the
    wall clock moved `by_s` more than the time that passed (`SnapshotStore`'s `steady` clock).
    A folder dated up to `at`, the last reading before the jump could have come, was named by
    the clock before the jump, and retention takes `by_s` out of its age. Kept in the index, so
    a restart keeps them."""

    at: float
    by_s: float

    def as_index(self) -> dict[str, object]:
        return {"at": _iso(self.at), "by_s": round(self.by_s, 3)}

    @classmethod
    def parse(cls, doc: object) -> ClockStep | None:
        if not isinstance(doc, dict):
            return None
        try:
            at = datetime.fromisoformat(str(doc["at"])).timestamp()
            return cls(at, float(doc["by_s"]))
        except (KeyError, TypeError, ValueError):
            return None


def check_writable(folder: Path) -> None:
    """Whether the daemon may start (or reload) with `folder` as its output: it must be a folder
    that can be created and written. A full disk passes: that is data, a skipped write (STYLE.md
    7); a path under a file, a read-only mount or a folder of another user is configuration.
    The folders it makes are 0750 whatever the umask (sidecar/store/atomic.py); one another
    user owns or may write is refused (issue 26, item 3): `_check_trusted`."""
    _check_trusted(folder)  # before anything is made in it
    try:
        make_folder(folder)
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
    _check_trusted(folder)


def _check_trusted(folder: Path) -> None:
    """An OutputError unless FOLDER (where it exists) is the daemon's own (its effective uid)
    and not writable by other users, and every folder above it is the daemon's or root's and
    writable by others only when sticky (as /tmp: others add names there, but cannot rename or
    remove the daemon's). Another user who can write where the daemon writes (root, in a
    container) could plant a link there and have the daemon overwrite any file it may write."""
    euid = os.geteuid()
    folder = Path(os.path.abspath(folder))
    for at in (folder, *folder.parents):
        try:
            info = at.stat()
        except OSError:
            continue  # not made yet, or not reachable: make_folder and os.access say so
        own = at == folder
        where = f"the output folder {at}" if own else f"{at}, above the output folder {folder},"
        if info.st_uid != euid and (own or info.st_uid != 0):
            raise OutputError(
                f"{where} is owned by uid {info.st_uid}, not by the daemon's user (uid {euid}), "
                "and its owner could have the daemon overwrite any file it may write; chown it "
                f"to the daemon's user (chown {euid} {at}), or set output.dir (--out) to "
                "another folder"
            )
        if info.st_mode & stat.S_IWOTH and (own or not info.st_mode & stat.S_ISVTX):
            raise OutputError(
                f"{where} is writable by other users (mode {stat.S_IMODE(info.st_mode):04o}), "
                "who could have the daemon overwrite any file it may write; chmod o-w "
                f"{at}, or set output.dir (--out) to another folder"
            )


class FolderLock:
    """An exclusive lock on a host folder (OUT/<host>/.daemon.lock, `flock`), the PID of its
    holder written in the file: a second daemon on the folder would replace the first's control
    socket, and each one's retention would run over the other's folders (issue 26, item 9).
    The kernel drops it when its holder ends, however it ends: a `kill -9` leaves no stale
    lock. A lock is its open file: two of one folder in one process exclude each other too."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take it, or a ConfigError (exit 2) naming the holder's PID; an OutputError when the
        lock file cannot be made. A file system without `flock` (some network mounts) runs
        unlocked, with a warning."""
        if self._fd is not None:
            return
        try:
            make_folder(self.folder)
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = os.open(self.path, flags, FILE_MODE)
        except OSError as exc:
            raise OutputError(
                f"cannot make the lock file {self.path}: {exc.strerror or exc}; set output.dir "
                "(--out) to a folder the sidecar may write"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"PID {holder}" if holder is not None else "PID not known yet"
            raise ConfigError(
                f"another vllm-sidecar daemon ({who}) is already writing to {self.folder} (it "
                f"holds {self.path}); stop it first, or give this one another output folder "
                "(output.dir, --out)"
            ) from None
        except OSError as exc:
            log.warning("cannot lock %s (%s): nothing stops a second daemon from writing to "
                        "%s meanwhile", self.path, exc.strerror or exc, self.folder)  # fmt: skip
        with contextlib.suppress(OSError):
            os.fchmod(fd, FILE_MODE)  # whatever the umask, as every file of the store
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _forget(self) -> None:
        """In a forked child: its copy of the descriptor closed (the parent's keeps the lock)."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


# This process's locks, by folder: every store of one daemon over the same host folder (the
# fleet's deployment stores, a store a reload rebuilds) shares its one lock.
_HELD: dict[str, FolderLock] = {}
_HELD_LOCK = threading.Lock()


def hold_folder(folder: Path) -> FolderLock:
    """This process's lock on FOLDER, taken once and held until the process ends (the daemon's
    life): a second daemon is refused (ConfigError naming the first one's PID), a second store
    of this one is not. A one-shot `snapshot` takes none: it writes one folder under a free
    name, atomically, and deletes nothing, so it cannot hurt a daemon's folders nor they it."""
    key = os.path.realpath(folder)
    with _HELD_LOCK:
        lock = _HELD.get(key)
        if lock is None or not lock.held:
            lock = FolderLock(Path(folder))
            lock.acquire()
            _HELD[key] = lock
        return lock


def _forget_locks_in_child() -> None:
    """A forked child (the daemon's write child, sidecar/outproc.py) does not keep the locks:
    a daemon killed while its child writes is not refused a restart until the child ends."""
    for lock in _HELD.values():
        lock._forget()
    _HELD.clear()


os.register_at_fork(after_in_child=_forget_locks_in_child)


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 64, 0).decode(errors="replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


class SnapshotStore:
    def __init__(
        self,
        root: Path,
        host: str,
        retention: Retention,
        disk_usage: DiskUsage = shutil.disk_usage,
        clock: Callable[[], float] = time.time,
        deployment: str | None = None,
        steady: Callable[[], float] | None = None,
    ) -> None:
        """`deployment`: one of several vLLM servers on the host
        (sidecar/daemon/multi_target.py); its folders go under `root/<host>/<deployment>/`, a
        folder every reader takes as it takes
        a host folder. None: `root/<host>/`, as a daemon with one target has always written.
        `clock`: the wall clock, which names the folders; `steady`: a clock no one sets,
        against which a step of `clock` shows (None: the seconds since boot, suspend included,
        beside the real wall clock; `clock` itself beside an injected one: no step is seen)."""
        self.root = Path(root)
        self.host = host
        self.deployment = deployment
        self.dir = self.root / host / deployment if deployment else self.root / host
        self.retention = retention
        self._disk_usage = disk_usage
        self._clock = clock
        self._steady = steady or (_since_boot if clock is time.time else clock)
        # Folders retention and the disk guard must keep: those waiting for their upload.
        self._held: Callable[[str], bool] | None = None
        self._lock = threading.RLock()
        self.disk_state = DiskState.OK
        self.free_bytes = 0
        self.snapshots_written = self.writes_skipped = self.deleted_total = 0
        self._failing: str | None = None  # the write failure last logged: each is logged once
        self._index_failing = False
        self._table_failing = False
        self._ahead_logged: set[str] = set()  # future-dated folders said once each
        doc = self._read_index() or {}
        self._entries = self._scan(_listed(doc))
        self._estimate = self._entries[-1].bytes if self._entries else 0
        gaps = doc.get("gaps")
        self._gaps: list[dict[str, Any]] = gaps[-MAX_GAPS:] if isinstance(gaps, list) else []
        steps = doc.get("clock_steps")
        found = (ClockStep.parse(s) for s in (steps if isinstance(steps, list) else []))
        self._steps = [s for s in found if s is not None][-MAX_GAPS:]
        self._seen = (clock(), self._steady())  # (wall, steady) at the last look for a step
        self._probe()
        self._write_index()

    def set_hold(self, held: Callable[[str], bool] | None) -> None:
        """`held(name)`: True while a folder may not be deleted (its upload is not confirmed,
        sidecar/store/upload.py); None: every folder is retention's to delete."""
        with self._lock:
            self._held = held

    def _deletable(self) -> list[StoredSnapshot]:
        held = self._held
        return [e for e in self._current() if held is None or not held(e.name)]

    def _current(self) -> list[StoredSnapshot]:
        """The folders retention, the disk guard and `latest` see: all but those dated more than
        CLOCK_SLACK_S ahead of the clock (issue 26, item 11), which wait for the clock."""
        limit = self._clock() + CLOCK_SLACK_S
        return [e for e in self._entries if e.started <= limit]

    def _look_at_the_clock(self) -> None:
        """Note a forward step of the wall clock since the last look (`ClockStep`), and say
        once each folder dated more than CLOCK_SLACK_S ahead of it."""
        wall, steady = self._clock(), self._steady()
        jump = (wall - self._seen[0]) - (steady - self._seen[1])
        self._seen = (wall, steady)
        if jump > STEP_MIN_S:
            self._steps.append(ClockStep(wall - jump, jump))
            del self._steps[:-MAX_GAPS]
            before = sum(e.started <= wall - jump for e in self._entries)
            log.warning("the clock jumped %.1f h forward (NTP setting it?): retention ages the "
                        "%d folders under %s dated before the jump without it",
                        jump / 3600, before, self.dir)  # fmt: skip
        ahead = [e.name for e in self._entries if e.started > wall + CLOCK_SLACK_S]
        new = [n for n in ahead if n not in self._ahead_logged]
        if new:
            log.warning("%d snapshot folders under %s are dated more than a day ahead of the "
                        "clock (%s): they are not the latest, and retention neither counts nor "
                        "deletes them until the clock reaches them; is the host's clock right?",
                        len(new), self.dir, _names(new))  # fmt: skip
            self._ahead_logged.update(new)

    def _age(self, e: StoredSnapshot, now: float) -> float:
        """How long ago the folder's window started, less every forward step of the clock
        since (`ClockStep`)."""
        return now - e.started - sum(s.by_s for s in self._steps if e.started <= s.at)

    def write(self, snapshot: Snapshot, kind: SnapshotKind) -> WriteOutcome:
        """Retention, room for the snapshot, then an atomic write; never raises on a full disk."""
        with self._lock:
            self._look_at_the_clock()
            deleted = self._retire(reserve=self._estimate) + self._make_room()
            shortfall = self._shortfall()
            if shortfall is not None:
                return self._skipped(shortfall, space=True, deleted=deleted)
            # The name is chosen here, before the child: a child killed after its rename (the
            # OOM killer) leaves the folder under this very name, and the write done again in
            # this process finds it there and keeps it, not a copy as NAME-1 (issue 26, item 8).
            name = free_name(self.dir, folder_name(snapshot.name, kind)).name
            keep = {e.name for e in self._entries} | {name}
            try:
                # The folder and its trend-table row: in a forked child in the daemon, so that
                # pandas and pyarrow never stay loaded in it (sidecar/outproc.py).
                written, table_error, kept = outproc.call(
                    lambda: _write_files(snapshot, self.dir, name, kind, keep)
                )
            except (OutputError, OSError) as exc:
                return self._skipped(str(exc), space=_is_space_error(exc), deleted=deleted)
            path = Path(written)
            if kept:
                log.info("%s was already written whole (by a write child that died after it): "
                         "kept as it is", path)  # fmt: skip
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
        """Retention: the folders past their age, then the oldest over the size limit, each
        deletion logged with its reason (issue 26, item 4)."""
        now, r = self._clock(), self.retention
        settings = {
            SnapshotKind.SNAPSHOT: ("retention_days", r.max_age_s),
            SnapshotKind.BASELINE: ("baseline_retention_days", r.baseline_max_age_s),
        }

        def too_old(e: StoredSnapshot) -> str:
            key, limit = settings[e.kind]
            return (f"{self._age(e, now) / DAY_S:.1f} days old, over output.{key} "
                    f"({(limit or 0) / DAY_S:g})")  # fmt: skip

        def too_big(e: StoredSnapshot) -> str:
            return f"the folders are over output.max_total_mb ({_size(r.max_total_bytes or 0)})"

        expired = self._delete_all(self._expired(), too_old)
        return expired + self._delete_all(self._over_size(reserve), too_big)

    def _expired(self) -> list[StoredSnapshot]:
        now, keep, r = self._clock(), self._newest(SnapshotKind.BASELINE), self.retention
        ages = {SnapshotKind.SNAPSHOT: r.max_age_s, SnapshotKind.BASELINE: r.baseline_max_age_s}
        return [
            e
            for e in self._deletable()
            if e is not keep and (age := ages[e.kind]) is not None and self._age(e, now) > age
        ]

    def _over_size(self, reserve: int) -> list[StoredSnapshot]:
        """Oldest regular snapshots first, then old baselines; never the newest baseline.
        `reserve` makes room for the coming write, unless one snapshot is over the limit alone."""
        limit = self.retention.max_total_bytes
        if limit is None:
            return []
        used = sum(e.bytes for e in self._current())  # a future-dated folder waits
        excess = used + (reserve if reserve < limit else 0) - limit
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

    def _delete_all(
        self, doomed: list[StoredSnapshot], why: Callable[[StoredSnapshot], str]
    ) -> list[str]:
        deleted = []
        for e in doomed:
            reason = why(e)  # before the folder leaves the accounting
            if self._delete(e):
                log.info("retention deleted %s under %s: %s", e.name, self.dir, reason)
                deleted.append(e.name)
        return deleted

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
        of_kind = [e for e in self._current() if kind is None or e.kind is kind]
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

    def _scan(self, listed: Collection[str] | None) -> list[StoredSnapshot]:
        """The daemon's own snapshot folders here, which alone retention and the guards delete
        (issue 26, item 4: a user's `20200101T000000Z/precious.txt` went, for its name). Only a
        real folder with a snapshot's name counts, never a link (item 7). It is the daemon's
        when the index lists it (`listed`: its `folders`), or when it holds a snapshot's
        summary.json (`_summary_of`) and either
        - there is no list: the index is missing, unreadable, or written by a version before
          the list; every folder a daemon ever wrote holds that summary, and a user's folder
          that merely has the name does not, or
        - it is newer than every folder listed: written after the index last was, by a daemon
          killed before it could add it (snapshots and baselines are written in time order).
        What is left out is said once, and left alone; a snapshot folder copied in by hand,
        summary and all, counts as the daemon's under the same rules."""
        found = [p for p in _real_dirs(self.dir) if snapshot_folder(p) is not None]
        names = set(listed or ())
        newest = max((_rank(n) for n in names), default=None)

        def unlisted_ours(path: Path) -> bool:
            return (newest is None or _rank(path.name) > newest) and _summary_of(path) is not None

        ours = [p for p in found if p.name in names or unlisted_ours(p)]
        others = sorted({p.name for p in found} - {p.name for p in ours})
        if listed is None and ours:
            log.info("%s lists no folders: counted the %d under %s that hold a snapshot's %s as "
                     "the daemon's", INDEX_NAME, len(ours), self.dir, SUMMARY_NAME)  # fmt: skip
        if others:
            log.info("leaving alone %d folders under %s named like snapshots that are not the "
                     "daemon's (not in its %s, no snapshot %s): %s", len(others), self.dir,
                     INDEX_NAME, SUMMARY_NAME, _names(others))  # fmt: skip
        entries = (StoredSnapshot.parse(p) for p in ours)
        return sorted((e for e in entries if e is not None), key=_order)

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
            # The daemon's own folders, oldest first: all that retention may delete (_scan).
            "folders": [e.name for e in self._entries],
            **({"clock_steps": [s.as_index() for s in self._steps]} if self._steps else {}),
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
            self._entries = self._scan({e.name for e in self._entries})  # ours, as we know
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
    if entry is None or not _is_real_dir(entry.path):
        raise ValueError(f"{key!r} names {name!r}, which is not a snapshot folder")
    return entry


def _write_files(
    snapshot: Snapshot, folder: Path, name: str, kind: SnapshotKind, keep: set[str]
) -> tuple[str, str | None, bool]:
    """The snapshot's folder, then its row in the trend table (every `COMPACT_EVERY` rows the
    parts are folded into the main file, dropping the rows of folders deleted since): the
    folder, why the table could not be updated (None: it was), and whether the folder was
    there already. A write child killed after its rename leaves the folder whole under NAME,
    and the write is done again in the daemon's process (sidecar/outproc.py): the folder is
    kept, not written again as NAME-1, a copy that `trend` counted twice (issue 26, item 8);
    the row is written again, under the same part name (a no-op when the child had)."""
    from sidecar.store.trend_table import COMPACT_EVERY, TableError, TrendTable, summary_row

    path = folder / name
    summary = _summary_of(path) if _is_real_dir(path) else None
    there = summary is not None and (summary.get("name"), summary.get("kind"),
                                     summary.get("created_at")) == (
        snapshot.name, kind.value, snapshot.created_at)  # fmt: skip
    if not there:
        path = write_snapshot(snapshot, folder, name=name, kind=kind.value)
    table = TrendTable(folder)
    try:
        table.append(summary_row(snapshot.summary(kind.value), name=path.name))
        if len(table.parts()) >= COMPACT_EVERY:
            table.compact(keep=keep | {path.name})
    except (OSError, TableError) as exc:
        return str(path), str(exc), there
    return str(path), None, there


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


def _real_dirs(folder: Path) -> list[Path]:
    """The folders in FOLDER, never a link to one."""
    try:
        with os.scandir(folder) as entries:
            return [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:  # not there yet, or not a folder
        return []


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _summary_of(folder: Path) -> dict[str, Any] | None:
    """The folder's summary.json when it is a snapshot's, what every version of the daemon
    writes: a JSON object with the snapshot's `name` and its `phases` (the test the summary's
    reader makes first, sidecar/store/summary_io.py; the daemon loads no pydantic). Read only
    as a regular file, never through a link."""
    path = folder / SUMMARY_NAME
    try:
        if not stat.S_ISREG(os.lstat(path).st_mode):
            return None
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(doc, dict) and isinstance(doc.get("name"), str) and "phases" in doc
    return doc if ok else None


def _folder_bytes(folder: Path) -> int:
    """The bytes of the files under FOLDER. A link counts as itself, never what it points to
    (issue 26, item 7: a link to a 20 MB folder made the size guard delete every snapshot, and
    two links to `.` hung the scan)."""
    total, todo = 0, [folder]
    while todo:
        try:
            with os.scandir(todo.pop()) as entries:
                for e in entries:
                    with contextlib.suppress(OSError):
                        if e.is_dir(follow_symlinks=False):
                            todo.append(Path(e.path))
                        else:
                            total += e.stat(follow_symlinks=False).st_size
        except OSError:
            continue
    return total


def _listed(doc: dict[str, Any]) -> list[str] | None:
    """The index's list of the daemon's folders; None when it has none (missing, unreadable,
    or written before the list was)."""
    listed = doc.get("folders")
    if isinstance(listed, list) and all(isinstance(n, str) for n in listed):
        return listed
    return None


def _rank(name: str) -> tuple[float, int]:
    """A folder name's place in time (as `_order`); names that are no snapshot's come first."""
    named = parse_name(name)
    return (named[1], named[2]) if named else (float("-inf"), 0)


def _names(names: list[str], most: int = 5) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _since_boot() -> float:
    """Seconds since boot, suspend included: a clock no one sets (CLOCK_BOOTTIME, Linux)."""
    return time.clock_gettime(getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC))


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

"""Snapshots to object storage: each finished snapshot folder, with its row of the trend table,
copied under `URL/host=<host>/deployment=<model@port>/date=<YYYY-MM-DD>/<snapshot>/` (Hive-style
partitions, so DuckDB, Athena or Spark prune by host, deployment and day).

The local folder stays the truth until the copy is confirmed: after the objects are put, the
remote folder is listed and every object's size compared with the local file; only then is a
marker written, atomically, to `OUT/<host>/.uploads/<snapshot>.json`. A marker names the
destination it confirms (upload.url and upload.endpoint_url, without credentials): a folder
confirmed for another bucket or prefix counts as not uploaded (issue 26, item 10), so after
upload.url changes it is sent to the new one. The store's retention and disk guard keep every
folder without a marker for the current destination (`Uploader.held`), so an outage of the
object store only delays uploads. The backlog is the folders without a marker, oldest first: a
restart resumes it from disk, and an upload cut off midway is redone whole (the keys are the
same, so a folder never lands twice under two names).

Uploads run on a thread of their own (`UploadThread`), not between windows: one request to a
store that is down can block for its whole timeout, and a window's deadline must not wait on
it (STYLE.md 8). The thread's work is I/O; it takes the store's lock only to copy its list of
folders. The object store is a seam (`ObjectStore`): `sidecar.store.objectstore` adapts fsspec/s3fs,
unit tests use fsspec's in-memory filesystem.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from sidecar.errors import UploadError
from sidecar.records.redact import redact_url
from sidecar.store.atomic import make_folder, write_file
from sidecar.store.folders import StoredSnapshot
from sidecar.store.layout import MARKERS_DIR, summary_deployment

log = logging.getLogger("vllm_sidecar")

ROW_NAME = "row.parquet"  # the snapshot's row of the trend table, beside its files
# Put last, in this order: a remote folder with `row.parquet` is complete, so a reader that
# globs `*/row.parquet` never meets a half-uploaded folder.
LAST = ("summary.json", ROW_NAME)
UNKNOWN = "unknown"  # the partition value of a summary without a deployment (schema 1 and 2)
POLL_S = 60.0  # the thread looks for work this often even when no write woke it
STOP_WAIT_S = 30.0  # at stop, how long the daemon waits for uploads to finish their object


class _Stopped(Exception):
    """The daemon is stopping: the folder is left unconfirmed, to be redone whole; no failure."""


class ObjectStore(Protocol):
    """Where uploads go: keys are relative to the configured URL."""

    url: str  # for messages and markers
    endpoint_url: str | None  # an S3-compatible store's API; None: AWS's own

    def put(self, local: Path, key: str) -> None: ...
    def sizes(self, prefix: str) -> Mapping[str, int]:
        """Every object under `prefix` (a fresh listing, no cache): key -> size in bytes."""
        ...


class SnapshotSource(Protocol):
    """What the uploader needs of the store (store.SnapshotStore)."""

    host: str
    dir: Path

    def snapshots(self) -> tuple[StoredSnapshot, ...]: ...


@dataclass(frozen=True, slots=True)
class UploadStatus:
    """What the exporter shows; replaced whole after each step."""

    backlog: int  # folders without a confirmed upload
    uploaded_total: int
    failures_total: int
    last_success_wall: float | None
    failing: str | None  # the last failure while it lasts


def partition_prefix(host: str, deployment: str | None, started: float) -> str:
    """`host=H/deployment=D/date=YYYY-MM-DD`; values are percent-encoded as Hive does, so a
    model name with a `/` (org/model) stays one path segment."""
    day = datetime.fromtimestamp(started, tz=UTC).strftime("%Y-%m-%d")
    return f"host={_part(host)}/deployment={_part(deployment or UNKNOWN)}/date={day}"


def _part(value: str) -> str:
    return quote(value, safe="@.-_+")


@dataclass(frozen=True, slots=True)
class FolderPlan:
    name: str
    prefix: str  # partitions/<snapshot>
    files: tuple[tuple[Path, str], ...]  # (local file, key under the prefix), in upload order

    @property
    def bytes(self) -> int:
        return sum(path.stat().st_size for path, _ in self.files)


def plan_folder(entry: StoredSnapshot, host: str, row: Path | None) -> FolderPlan:
    """The objects of one snapshot folder; `row`: its trend-table row as a file, if any."""
    files = sorted((p, p.relative_to(entry.path).as_posix()) for p in _files(entry.path))
    files = [f for f in files if f[1] not in LAST] + [f for f in files if f[1] in LAST]
    if row is not None:
        files.append((row, ROW_NAME))
    prefix = f"{partition_prefix(host, summary_deployment(entry.path), entry.started)}/{entry.name}"
    return FolderPlan(entry.name, prefix, tuple(files))


def _files(folder: Path) -> Iterator[Path]:
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.name.startswith("."):
            yield path


def destination(remote: ObjectStore) -> dict[str, str | None]:
    """Where `remote` puts folders, as a marker records it: the URL (bucket and prefix) and the
    endpoint, without credentials (the config refuses them; this is the second line)."""
    endpoint = None if remote.endpoint_url is None else redact_url(remote.endpoint_url)
    return {"url": _dest_url(remote.url), "endpoint_url": endpoint}


def _dest_url(url: str) -> str:
    return redact_url(url).rstrip("/")


class UploadLedger:
    """The durable markers: `<host dir>/.uploads/<snapshot>.json`, one per confirmed folder,
    each naming the destination it was confirmed for (`destination`)."""

    def __init__(self, host_dir: Path, dest: Mapping[str, str | None]) -> None:
        self.dir = Path(host_dir) / MARKERS_DIR
        self.dest = dict(dest)
        # name -> (the marker's inode, mtime and size, whether it confirms `dest`): backlog()
        # asks for every folder at every step, so a marker is parsed again only once rewritten.
        self._seen: dict[str, tuple[tuple[int, int, int], bool]] = {}

    def confirmed(self, name: str) -> bool:
        """Whether `name` is confirmed uploaded to this ledger's destination."""
        path = self.dir / f"{name}.json"
        try:
            st = path.stat()
        except OSError:
            self._seen.pop(name, None)
            return False
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        seen = self._seen.get(name)
        if seen is not None and seen[0] == stamp:
            return seen[1]
        ok = self.confirms(_read_marker(path))
        self._seen[name] = (stamp, ok)
        return ok

    def confirms(self, doc: Mapping[str, object] | None) -> bool:
        """Whether a marker confirms its folder for this ledger's destination.

        - `gone`: the folder was deleted by hand; there is nothing to send anywhere.
        - `destination` (issue 26, item 10 on): that destination's URL and endpoint must both
          be this one's; a folder sent to another bucket or prefix is sent again.
        - Markers of earlier versions name no destination, but their `url` is the folder's
          own URL, `<upload.url>/host=.../<snapshot>/`: its part before `/host=` is the
          upload.url they were confirmed for, and must be this one's. Their endpoint was not
          recorded: it is taken to be this one, as it was when this version first started
          (an endpoint changed at the upgrade itself goes unseen, once).
        - Anything else (unreadable, not JSON, no destination and no URL) confirms nothing:
          the folder is sent again and kept until then. Sending twice writes the same keys;
          deleting a folder that was never sent loses it.
        """
        if doc is None:
            return False
        if doc.get("gone") is True:
            return True
        dest = doc.get("destination")
        if isinstance(dest, Mapping):
            return dict(dest) == self.dest
        url = doc.get("url")
        if isinstance(url, str) and (cut := url.rfind("/host=")) > 0:
            return _dest_url(url[:cut]) == self.dest["url"]
        return False

    def elsewhere(self, names: Iterable[str]) -> list[str]:
        """Those of `names` whose marker confirms them for another destination only."""
        out = []
        for name in names:
            path = self.dir / f"{name}.json"
            if path.is_file() and not self.confirmed(name):
                doc = _read_marker(path)
                if doc is not None and ("destination" in doc or "url" in doc):
                    out.append(name)
        return out

    def confirm(self, name: str, doc: Mapping[str, object]) -> None:
        """Written atomically (sidecar/store/atomic.py): a crash leaves a marker or none."""
        make_folder(self.dir)  # 0750, as every folder of the store
        write_file(self.dir / f"{name}.json", json.dumps(doc, indent=2) + "\n")

    def prune(self, present: set[str]) -> int:
        """Remove the markers of folders that retention deleted since."""
        removed = 0
        with contextlib.suppress(OSError):
            for path in self.dir.glob("*.json"):
                if path.stem not in present:
                    with contextlib.suppress(OSError):
                        path.unlink()
                        removed += 1
        return removed


def _read_marker(path: Path) -> Mapping[str, object] | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


RowSource = Callable[[Path, str, Path], Path | None]  # (host dir, snapshot, temp dir) -> file


def table_row(host_dir: Path, name: str, dest: Path) -> Path | None:
    """The snapshot's row of the trend table, written to a file in `dest` (None: no row)."""
    from sidecar.store.trend_table import TableError, TrendTable

    try:
        return TrendTable(host_dir).row_file(name, dest / ROW_NAME)
    except (OSError, TableError) as exc:
        log.debug("no trend-table row for %s: %s", name, exc)
        return None


class Uploader:
    """The backlog, drained oldest first, one folder per `step`, with exponential backoff."""

    def __init__(
        self,
        store: SnapshotSource,
        remote: ObjectStore,
        backoff_s: float,
        backoff_max_s: float,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        row_source: RowSource = table_row,
    ) -> None:
        self.store, self.remote = store, remote
        self.ledger = UploadLedger(store.dir, destination(remote))
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.clock, self.wall = clock, wall_clock
        self._row = row_source
        self.on_change: Callable[[UploadStatus], None] = lambda status: None
        self.uploaded_total = self.failures_total = 0
        self.last_success_wall: float | None = None
        self._failing: str | None = None
        self._delay = 0.0
        self._not_before = float("-inf")  # monotonic: no try before this after a failure
        self._told_elsewhere = False

    def held(self, name: str) -> bool:
        """Whether retention must keep the folder: its upload to this destination is not
        confirmed (one confirmed for another bucket or prefix is held until sent here)."""
        return not self.ledger.confirmed(name)

    def backlog(self) -> list[StoredSnapshot]:
        return [e for e in self.store.snapshots() if not self.ledger.confirmed(e.name)]

    def status(self, backlog: int | None = None) -> UploadStatus:
        pending = len(self.backlog()) if backlog is None else backlog
        return UploadStatus(pending, self.uploaded_total, self.failures_total,
                            self.last_success_wall, self._failing)  # fmt: skip

    def wait_s(self) -> float:
        """Seconds until the next try is allowed (0: now)."""
        return max(0.0, self._not_before - self.clock())

    def step(self, stop: Callable[[], bool] = lambda: False) -> bool:
        """Upload the oldest folder of the backlog; True when one left the backlog (confirmed,
        or deleted by hand). Nothing is tried while backing off; a failure counts, logs once
        and doubles the delay."""
        if self.wait_s() > 0:
            return False
        pending = self.backlog()
        if not pending:
            return False
        entry = pending[0]
        try:
            if not (entry.path / "summary.json").is_file():  # deleted by hand meanwhile
                log.info("snapshot %s is gone; not uploading it", entry.name)
                self.ledger.confirm(entry.name, {"gone": True})
                return True
            self._upload(entry, stop)
        except _Stopped:
            return False
        except (UploadError, OSError) as exc:
            self._failed(entry, exc)
            self.on_change(self.status(len(pending)))
            return False
        self._succeeded(entry, len(pending) - 1)
        return True

    def drain(self, stop: Callable[[], bool] = lambda: False) -> int:
        """Steps until the backlog is empty, a try fails or `stop`; the folders confirmed."""
        if not self._told_elsewhere:
            self._told_elsewhere = True
            self._tell_elsewhere()
        done = 0
        while not stop() and self.step(stop):
            done += 1
        self.ledger.prune({e.name for e in self.store.snapshots()})
        self.on_change(self.status())
        return done

    def _upload(self, entry: StoredSnapshot, stop: Callable[[], bool]) -> None:
        with tempfile.TemporaryDirectory(prefix=".upload-", dir=_tmp_root(self.store.dir)) as tmp:
            plan = plan_folder(entry, self.store.host, self._row(self.store.dir, entry.name,
                                                                 Path(tmp)))  # fmt: skip
            for local, key in plan.files:
                if stop():
                    raise _Stopped
                self.remote.put(local, f"{plan.prefix}/{key}")
            self._verify(plan)
            when = datetime.fromtimestamp(self.wall(), UTC).isoformat(timespec="seconds")
            self.ledger.confirm(entry.name, {"destination": self.ledger.dest,
                                             "url": f"{_dest_url(self.remote.url)}/{plan.prefix}/",
                                             "objects": len(plan.files), "bytes": plan.bytes,
                                             "uploaded_at": when})  # fmt: skip

    def _tell_elsewhere(self) -> None:
        """Once per uploader: the folders that were confirmed for another destination (a changed
        upload.url) and are therefore in the backlog again, so the jump of the backlog gauge and
        the disk kept for it are explained."""
        names = self.ledger.elsewhere(e.name for e in self.store.snapshots())
        if names:
            log.info("%d snapshot folders were uploaded to another destination than %s (upload.url "
                     "or upload.endpoint_url changed): they are uploaded here too, and kept "
                     "locally until they are", len(names), self.ledger.dest["url"])  # fmt: skip

    def _verify(self, plan: FolderPlan) -> None:
        """Every object listed with its local size; a missing or short one fails the folder."""
        found = self.remote.sizes(plan.prefix)
        for local, key in plan.files:
            want, got = local.stat().st_size, found.get(f"{plan.prefix}/{key}")
            if got != want:
                raise UploadError(f"{self.remote.url}/{plan.prefix}/{key}: listed "
                                  f"{'missing' if got is None else f'{got} bytes'}, "
                                  f"expected {want}")  # fmt: skip

    def _failed(self, entry: StoredSnapshot, exc: BaseException) -> None:
        self.failures_total += 1
        self._delay = min(self.backoff_max_s, self._delay * 2 if self._delay else self.backoff_s)
        self._not_before = self.clock() + self._delay
        reason = str(exc) if isinstance(exc, UploadError) else f"{type(exc).__name__}: {exc}"
        if self._failing is None:
            # A wrong bucket or missing permission fails like an outage: name the check.
            log.warning("cannot upload snapshot %s to %s (%s); the backlog waits and is "
                        "retried with backoff; nothing is deleted locally until it is "
                        "uploaded (logged again once uploads work). If the store is up, "
                        "`vllm-sidecar doctor` checks the bucket, upload.endpoint_url and "
                        "the credentials", entry.name, self.remote.url, reason)  # fmt: skip
        log.debug("upload of %s failed; next try in %.0f s: %s", entry.name, self._delay, reason)
        self._failing = reason

    def _succeeded(self, entry: StoredSnapshot, left: int) -> None:
        self.uploaded_total += 1
        self.last_success_wall = self.wall()
        self._delay, self._not_before = 0.0, float("-inf")
        if self._failing is not None:
            log.info("uploading to %s again (%d folders left in the backlog)",
                     self.remote.url, left)  # fmt: skip
            self._failing = None
        log.debug("uploaded %s", entry.name)
        self.on_change(self.status(left))


def _tmp_root(host_dir: Path) -> Path:
    """Row files are staged in the host folder's marker dir (same disk, cleaned at start)."""
    root = Path(host_dir) / MARKERS_DIR
    make_folder(root)
    return root


class UploadThread:
    """Runs `Uploader.drain` on a thread: woken by each write (`wake`), at least every
    `poll_s`, and when a backoff ends. `stop` ends it after the current object."""

    def __init__(self, uploader: Uploader, poll_s: float = POLL_S) -> None:
        self.uploader, self.poll_s = uploader, poll_s
        self._wake, self._stop = threading.Event(), threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, clean_staging: bool = True) -> None:
        """Start the thread; first remove the staging a killed uploader left in the store's
        `.uploads/` (`clean_staging`), which only the caller knows to be safe: no other
        thread of this process uploads that folder any more (at start, or after a reload's
        old thread ended)."""
        if clean_staging:
            remove_staging(self.uploader.store.dir)
        self._thread = threading.Thread(target=self._run, name="uploader", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = STOP_WAIT_S) -> bool:
        """Ask the thread to stop and wait for it, at most `timeout`; True when it ended."""
        self.request_stop()
        return self.join(timeout)

    def request_stop(self) -> None:
        """Ask the thread to stop after the current object; returns at once."""
        self._stop.set()
        self._wake.set()

    def join(self, timeout: float) -> bool:
        """Wait at most `timeout` for the thread to end; True when it has (or never started)."""
        if self._thread is not None:
            self._thread.join(timeout)
            return not self._thread.is_alive()
        return True

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            try:
                self.uploader.drain(self._stop.is_set)
            except Exception:  # a bug in the uploader must not end the sampling; it is logged
                # with its traceback and retried (the backlog waits, nothing is deleted)
                log.exception("the uploader failed; retrying in %.0f s", self.poll_s)
            wait = self.uploader.wait_s() or self.poll_s
            self._wake.wait(min(wait, self.poll_s))


class Stoppable(Protocol):
    def request_stop(self) -> None: ...
    def join(self, timeout: float) -> bool: ...


def stop_all(
    threads: Iterable[Stoppable],
    timeout_s: float = STOP_WAIT_S,
    clock: Callable[[], float] = time.monotonic,
) -> list[Stoppable]:
    """Ask every thread to stop, then wait for them together, `timeout_s` in all: a fleet's N
    upload threads stop in one bounded wait, not N in turn. The ones still running after it
    (a request the store has not answered) are returned and logged; they are daemon threads,
    and their folder, unconfirmed, is redone whole at the next start."""
    threads = list(threads)
    for thread in threads:
        thread.request_stop()
    deadline = clock() + timeout_s
    running = [t for t in threads if not t.join(max(0.0, deadline - clock()))]
    if running:
        log.warning("%d upload threads still busy after %g s; their folders are uploaded "
                    "again at the next start", len(running), timeout_s)  # fmt: skip
    return running


def remove_staging(host_dir: Path) -> None:
    """What a killed uploader left: its staging folders (`.uploads/.upload-*`). Never while
    an upload thread over `host_dir` runs: it may be putting a row staged there."""
    for path in (Path(host_dir) / MARKERS_DIR).glob(".upload-*"):
        shutil.rmtree(path, ignore_errors=True)

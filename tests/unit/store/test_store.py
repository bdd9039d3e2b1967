"""The snapshot store: layout, index, retention and the disk-space policy, with real Snapshot
objects (or hand-made folders for retention) on tmp_path, a fake clock and an injected
disk_usage. No processes."""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.errors import OutputError
from sidecar.records.window import Window
from sidecar.store.folders import DiskState, Retention, SnapshotStore, check_writable
from sidecar.store.layout import SnapshotKind
from sidecar.store.trend_table import PARTS_DIR, TABLE_NAME
from sidecar.window.snapshot import Snapshot, build_snapshot

HOST = "gpu-node-1"
T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
DAY = 86_400.0
NO_LIMITS = Retention(max_age_s=None, baseline_max_age_s=None, max_total_bytes=None,
                      min_free_bytes=0)  # fmt: skip
TABLE_FILES = (PARTS_DIR, TABLE_NAME)
DEAD_PID = 2**22 + 1  # above the kernel's largest pid_max: never a live process


@cache
def classifier() -> Classifier:
    return Classifier(load_rules())


def snapshot(started: float = T0) -> Snapshot:
    window = Window(started_at=started, duration_s=8.0, rate_hz=5.0, stacks=(), samples=0,
                    errors=0, sampler_cpu_s=0.0, segments=1)  # fmt: skip
    return build_snapshot(window, (), classifier(), host=HOST)


def name(wall: float, suffix: str = "") -> str:
    return datetime.fromtimestamp(wall, tz=UTC).strftime("%Y%m%dT%H%M%SZ") + suffix


def folder(root: Path, folder_name: str, size: int = 1000) -> Path:
    """A complete snapshot folder made by hand: only its name and size matter to retention,
    and its summary.json (`size` bytes) has the `name` and `phases` of a daemon's (a store
    without an index takes only such folders as its own: issue 26, item 4)."""
    path = root / HOST / folder_name
    path.mkdir(parents=True)
    head, tail = f'{{"name": "{folder_name}", "phases": {{}}, "pad": "', '"}'
    (path / "summary.json").write_text(head + "x" * (size - len(head) - len(tail)) + tail)
    return path


class FakeDisk:
    """A disk of `capacity` bytes holding `other` bytes besides the store's real files."""

    def __init__(self, root: Path, capacity: int, other: int = 0) -> None:
        self.root, self.capacity, self.other = root, capacity, other

    def __call__(self, path: Path) -> tuple[int, int, int]:
        used = self.other + sum(f.stat().st_size for f in self.root.rglob("*") if f.is_file())
        return self.capacity, used, max(self.capacity - used, 0)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def index(root: Path) -> dict[str, object]:
    doc: dict[str, object] = json.loads((root / HOST / "index.json").read_text())
    return doc


def visible(root: Path) -> list[str]:
    """The host folder's entries, less the trend table (tests/unit/store/test_trend_table.py)."""
    return sorted(p.name for p in (root / HOST).iterdir() if p.name not in TABLE_FILES)


# ---------------------------------------------------------------- layout, index, latest


def test_layout_kind_and_index(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS, clock=Clock(T0 + 100))
    regular = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    baseline = store.write(snapshot(T0 + 60), SnapshotKind.BASELINE)
    assert regular.path == tmp_path / HOST / name(T0)
    assert baseline.path == tmp_path / HOST / name(T0 + 60, "-baseline")
    for outcome, kind in ((regular, "snapshot"), (baseline, "baseline")):
        assert outcome.path is not None and outcome.skipped_reason is None
        assert sorted(p.name for p in outcome.path.iterdir()) == [
            "stacks.collapsed",
            "stacks.parquet",
            "summary.json",
        ]
        assert json.loads((outcome.path / "summary.json").read_text())["kind"] == kind
    sizes = sum(f.stat().st_size for f in (tmp_path / HOST).glob("2*/*"))  # the folders only
    newest = {
        "name": name(T0 + 60, "-baseline"),
        "kind": "baseline",
        "created_at": "2026-05-28T20:27:40+00:00",
    }
    assert index(tmp_path) == {
        "schema": 1,
        "host": HOST,
        "updated_at": "2026-05-28T20:28:20+00:00",
        "latest": newest,
        "latest_baseline": newest,
        "counts": {"snapshot": 1, "baseline": 1},
        "bytes": sizes,
        "gaps": [],
        "disk": {"state": "ok", "free_bytes": store.free_bytes},
        "folders": [name(T0), name(T0 + 60, "-baseline")],
    }
    assert store.total_bytes_used == sizes and store.snapshots_written == 2
    assert visible(tmp_path) == sorted([name(T0), name(T0 + 60, "-baseline"), "index.json"])


def test_index_is_replaced_not_rewritten_in_place(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    before = (tmp_path / HOST / "index.json").stat().st_ino
    store.write(snapshot(), SnapshotKind.SNAPSHOT)
    assert (tmp_path / HOST / "index.json").stat().st_ino != before  # a new file, renamed in
    assert not [p for p in visible(tmp_path) if p.startswith(".")]


def test_latest_and_latest_baseline(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    assert store.latest() is None and store.latest_baseline() is None
    store.write(snapshot(T0), SnapshotKind.BASELINE)
    store.write(snapshot(T0 + 60), SnapshotKind.SNAPSHOT)
    latest, baseline = store.latest(), store.latest_baseline()
    assert latest is not None and baseline is not None
    assert (latest.name, latest.kind, latest.path) == (
        name(T0 + 60),
        SnapshotKind.SNAPSHOT,
        tmp_path / HOST / name(T0 + 60),
    )
    assert (baseline.name, baseline.kind) == (name(T0, "-baseline"), SnapshotKind.BASELINE)
    assert baseline.created_at == "2026-05-28T20:26:40+00:00"


def test_collisions_get_numbered_and_sort_by_number(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    paths = [store.write(snapshot(T0), SnapshotKind.SNAPSHOT).path for _ in range(3)]
    paths += [store.write(snapshot(T0), SnapshotKind.BASELINE).path for _ in range(2)]
    assert [p.name for p in paths if p] == [
        name(T0),
        name(T0, "-1"),
        name(T0, "-2"),
        name(T0, "-baseline"),
        name(T0, "-baseline-1"),
    ]
    for n in range(3, 11):
        folder(tmp_path, name(T0, f"-{n}"))
    rescanned = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    regular = [e.name for e in rescanned.snapshots() if e.kind is SnapshotKind.SNAPSHOT]
    assert regular[-2:] == [name(T0, "-9"), name(T0, "-10")]  # by number, not by text


def test_a_restarted_store_finds_what_is_there(tmp_path: Path) -> None:
    first = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    first.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    first.write(snapshot(T0 + 60), SnapshotKind.BASELINE)
    (tmp_path / HOST / "notes").mkdir()  # not ours: ignored, never deleted
    again = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    assert [e.name for e in again.snapshots()] == [name(T0), name(T0 + 60, "-baseline")]
    assert again.total_bytes_used == first.total_bytes_used


@pytest.mark.parametrize("damage", ["garbage", "missing", "stale", "wrong schema"])
def test_a_bad_index_is_rebuilt_by_a_scan(tmp_path: Path, damage: str) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    store.write(snapshot(T0), SnapshotKind.BASELINE)
    store.write(snapshot(T0 + 60), SnapshotKind.SNAPSHOT)
    path = tmp_path / HOST / "index.json"
    if damage == "garbage":
        path.write_text('{"schema": 1, "latest": {"na')
    elif damage == "missing":
        path.unlink()
    elif damage == "stale":
        folder(tmp_path, name(T0 + 120))  # written behind the store's back
        doc = index(tmp_path) | {
            "latest": {"name": name(T0 + 999), "kind": "snapshot", "created_at": "x"}
        }
        path.write_text(json.dumps(doc))
    else:
        path.write_text(json.dumps(index(tmp_path) | {"schema": 99}))
    latest = store.latest()
    newest = name(T0 + 120) if damage == "stale" else name(T0 + 60)
    assert latest is not None and latest.name == newest
    assert index(tmp_path)["latest"] == {
        "name": newest,
        "kind": "snapshot",
        "created_at": latest.created_at,
    }
    baseline = store.latest_baseline()
    assert baseline is not None and baseline.name == name(T0, "-baseline")


# ---------------------------------------------------------------- gaps


def test_gaps_are_recorded_closed_capped_and_kept_across_restarts(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    store.record_gap(T0, None, "target down")
    store.record_gap(T0, T0 + 30, "target down")  # closes the open gap
    assert index(tmp_path)["gaps"] == [
        {
            "from": "2026-05-28T20:26:40+00:00",
            "to": "2026-05-28T20:27:10+00:00",
            "reason": "target down",
        }
    ]
    for i in range(150):
        store.record_gap(T0 + 100 * i, T0 + 100 * i + 5, f"restart {i}")
    gaps = index(tmp_path)["gaps"]
    assert isinstance(gaps, list) and len(gaps) == 100 and gaps[-1]["reason"] == "restart 149"
    SnapshotStore(tmp_path, HOST, NO_LIMITS).write(snapshot(), SnapshotKind.SNAPSHOT)
    assert index(tmp_path)["gaps"] == gaps


# ---------------------------------------------------------------- retention


def test_retention_by_age_keeps_the_newest_baseline(tmp_path: Path) -> None:
    for age_days, suffix in [(10, "-baseline"), (9, ""), (3, ""), (2, "-baseline"), (0.5, "")]:
        folder(tmp_path, name(T0 - age_days * DAY, suffix))
    store = SnapshotStore(tmp_path, HOST, Retention(1 * DAY, 1 * DAY, None, 0), clock=Clock(T0))
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == (
        name(T0 - 10 * DAY, "-baseline"),
        name(T0 - 9 * DAY),
        name(T0 - 3 * DAY),
    )
    assert visible(tmp_path) == sorted(
        [name(T0 - 2 * DAY, "-baseline"), name(T0 - 0.5 * DAY), name(T0), "index.json"]
    )  # the only baseline left is older than its limit, but it is the newest
    assert store.deleted_total == 3 and index(tmp_path)["counts"] == {"snapshot": 2, "baseline": 1}


def test_baselines_live_longer_than_snapshots(tmp_path: Path) -> None:
    for age_days, suffix in [(60, "-baseline"), (20, "-baseline"), (8, ""), (6, "")]:
        folder(tmp_path, name(T0 - age_days * DAY, suffix))
    store = SnapshotStore(tmp_path, HOST, Retention(7 * DAY, 30 * DAY, None, 0), clock=Clock(T0))
    outcome = store.write(snapshot(T0), SnapshotKind.BASELINE)
    assert outcome.deleted == (name(T0 - 60 * DAY, "-baseline"), name(T0 - 8 * DAY))


SIZED = [(5, "-baseline"), (4, ""), (3, "-baseline"), (2, ""), (1, "")]  # 1000 bytes each


@pytest.mark.parametrize(
    ("limit", "deleted"),
    [
        # 5000 stored + 1000 reserved for the write (the newest folder's size) - 4500
        (4500, [(4, ""), (2, "")]),
        # every regular snapshot, then the old baseline; the newest baseline never goes
        (2500, [(4, ""), (2, ""), (1, ""), (5, "-baseline")]),
        # no room to reserve under the limit: the folders alone are over it, the same result
        (500, [(4, ""), (2, ""), (1, ""), (5, "-baseline")]),
    ],
)
def test_retention_by_size_oldest_regular_first_then_old_baselines(
    tmp_path: Path, limit: int, deleted: list[tuple[int, str]]
) -> None:
    for age, suffix in SIZED:
        folder(tmp_path, name(T0 - age * DAY, suffix), size=1000)
    store = SnapshotStore(tmp_path, HOST, Retention(None, None, limit, 0), clock=Clock(T0))
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == tuple(name(T0 - age * DAY, suffix) for age, suffix in deleted)
    kept = [name(T0 - a * DAY, x) for a, x in SIZED if (a, x) not in deleted]
    assert visible(tmp_path) == sorted([*kept, name(T0), "index.json"])


def test_a_write_under_the_size_limit_deletes_nothing(tmp_path: Path) -> None:
    for age, suffix in SIZED:
        folder(tmp_path, name(T0 - age * DAY, suffix), size=1000)
    store = SnapshotStore(tmp_path, HOST, Retention(None, None, 6000, 0), clock=Clock(T0))
    assert store.write(snapshot(T0), SnapshotKind.SNAPSHOT).deleted == ()


def test_write_applies_retention_first_and_reports_it(tmp_path: Path) -> None:
    folder(tmp_path, name(T0 - 2 * DAY))
    folder(tmp_path, name(T0 - 2 * DAY, "-baseline"))
    store = SnapshotStore(tmp_path, HOST, Retention(DAY, DAY, None, 0), clock=Clock(T0))
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.path is not None and outcome.deleted == (name(T0 - 2 * DAY),)
    assert visible(tmp_path) == sorted([name(T0 - 2 * DAY, "-baseline"), name(T0), "index.json"])


def test_size_retention_leaves_room_for_the_coming_write(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS, clock=Clock(T0))
    store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    one = store.total_bytes_used
    limited = SnapshotStore(tmp_path, HOST, Retention(None, None, int(one * 2.5), 0))
    limited.write(snapshot(T0 + 60), SnapshotKind.SNAPSHOT)
    outcome = limited.write(snapshot(T0 + 120), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == (name(T0),)
    assert limited.total_bytes_used <= one * 2.5


# ---------------------------------------------------------------- disk space


def test_a_nearly_full_disk_skips_logs_once_and_resumes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    disk = FakeDisk(tmp_path, capacity=100 << 20, other=99 << 20)  # 1 MiB free
    store = SnapshotStore(tmp_path, HOST, Retention(None, None, None, 2 << 20), disk_usage=disk)
    first, second = (
        store.write(snapshot(T0), SnapshotKind.SNAPSHOT),
        store.write(snapshot(T0 + 60), SnapshotKind.BASELINE),
    )
    assert first.path is None and second.path is None
    assert first.skipped_reason is not None and first.skipped_reason.startswith(
        f"disk nearly full: 1.00 MiB free under {tmp_path}, need 2.00 MiB"
    )
    assert "keeping the baselines" in first.skipped_reason
    assert store.disk_state is DiskState.LOW and store.writes_skipped == 2
    assert index(tmp_path)["disk"] == {"state": "low", "free_bytes": store.free_bytes}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "disk nearly full" in warnings[0].getMessage()

    disk.other = 10 << 20  # an operator freed space
    resumed = store.write(snapshot(T0 + 120), SnapshotKind.SNAPSHOT)
    assert resumed.path is not None and store.disk_state is DiskState.OK
    assert index(tmp_path)["disk"] == {"state": "ok", "free_bytes": store.free_bytes}
    assert any("writing snapshots again" in r.getMessage() for r in caplog.records)
    store.write(snapshot(T0 + 180), SnapshotKind.SNAPSHOT)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_low_space_deletes_the_oldest_regular_snapshots_never_baselines(tmp_path: Path) -> None:
    for age, suffix in [(4, "-baseline"), (3, ""), (2, ""), (1, "")]:
        folder(tmp_path, name(T0 - age * DAY, suffix), size=40_000)
    disk = FakeDisk(tmp_path, capacity=1_000_000)  # 840 kB free
    store = SnapshotStore(tmp_path, HOST, Retention(None, None, None, 900_000), disk_usage=disk)
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    # 940 kB needed (min_free + the newest folder's 40 kB): three 40 kB deletions make room
    assert outcome.deleted == (name(T0 - 3 * DAY), name(T0 - 2 * DAY), name(T0 - DAY))
    assert outcome.path is not None and store.deleted_total == 3
    assert visible(tmp_path) == sorted([name(T0 - 4 * DAY, "-baseline"), name(T0), "index.json"])


def test_a_disk_full_of_other_files_costs_no_history(tmp_path: Path) -> None:
    for age in (3, 2, 1):
        folder(tmp_path, name(T0 - age * DAY), size=1000)
    disk = FakeDisk(tmp_path, capacity=10 << 20, other=(10 << 20) - 5000)
    store = SnapshotStore(tmp_path, HOST, Retention(None, None, None, 1 << 20), disk_usage=disk)
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.path is None and outcome.deleted == () and len(store.snapshots()) == 3


def test_an_unwritable_output_is_a_skipped_write_not_a_crash(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / HOST).write_text("a file where the host folder should be")
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    outcomes = [store.write(snapshot(T0 + i), SnapshotKind.SNAPSHOT) for i in range(3)]
    assert all(o.path is None for o in outcomes) and store.writes_skipped == 3
    assert outcomes[0].skipped_reason and "cannot write" in outcomes[0].skipped_reason
    assert store.disk_state is DiskState.OK  # not a space problem
    snapshot_warnings = [r for r in caplog.records if "not being written" in r.getMessage()]
    assert len(snapshot_warnings) == 1


# ---------------------------------------------------------------- leftovers


def test_check_writable_passes_a_folder_it_can_make(tmp_path: Path) -> None:
    check_writable(tmp_path / "out" / HOST)
    assert (tmp_path / "out" / HOST).is_dir()


def test_check_writable_refuses_a_path_under_a_file(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("a file where the output folder should be")
    with pytest.raises(OutputError, match=r"set output\.dir"):
        check_writable(tmp_path / "out" / HOST)


@pytest.mark.skipif(os.getuid() == 0, reason="root writes through any mode")
def test_check_writable_refuses_a_folder_without_write_permission(tmp_path: Path) -> None:
    (tmp_path / HOST).mkdir(mode=0o500)
    with pytest.raises(OutputError, match="not writable"):
        check_writable(tmp_path / HOST)


def test_cleanup_temp_removes_what_a_killed_writer_left(tmp_path: Path) -> None:
    complete = folder(tmp_path, name(T0))
    host = tmp_path / HOST
    dead = host / f".{name(T0 + 60)}.tmp-{DEAD_PID}"
    ours = host / f".{name(T0 + 120)}.tmp-{os.getpid()}"  # a previous life with our pid
    deleting = host / f".{name(T0 - 60)}.del-{DEAD_PID}"
    live = host / f".{name(T0 + 180)}.tmp-1"  # pid 1 is alive: maybe another writer's
    for path in (dead, ours, deleting, live):
        path.mkdir()
        (path / "summary.json").write_text("{")
    (host / f".index.json.tmp-{DEAD_PID}").write_text("{")
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    removed = store.cleanup_temp()
    assert sorted(removed) == sorted(
        [dead.name, ours.name, deleting.name, f".index.json.tmp-{DEAD_PID}"]
    )
    assert sorted(p.name for p in host.iterdir()) == sorted(
        [complete.name, live.name, "index.json"]
    )
    assert [e.name for e in store.snapshots()] == [complete.name]  # leftovers were never counted


def test_cleanup_temp_leaves_what_the_store_did_not_write(tmp_path: Path) -> None:
    # Issue 26, item 5: a user's hidden `.precious.tmp-<dead pid>` in the host folder went.
    folder(tmp_path, name(T0))
    host = tmp_path / HOST
    theirs = [host / f".precious.tmp-{DEAD_PID}", host / f".backup.del-{DEAD_PID}"]
    for path in theirs:
        path.mkdir()
        (path / "notes.txt").write_text("keep me")
    ours = host / f".{name(T0 + 60)}-baseline.tmp-{DEAD_PID}"
    ours.mkdir()
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    assert store.cleanup_temp() == (ours.name,)
    assert all((p / "notes.txt").read_text() == "keep me" for p in theirs)


def test_stack_rows_of_many_snapshots_concatenate_without_joins(tmp_path: Path) -> None:
    """Every Parquet row says where and when it was taken: host, deployment, snapshot, time and
    kind, so a folder of snapshots reads into one table (here pandas) that groups by them."""
    import pandas as pd

    from sidecar.parsers import parse_file

    raw = Path(__file__).resolve().parents[2] / "fixtures" / "recorded"
    stacks = parse_file(raw / "v0.32.0-cpu-record-mixed.raw.txt").stacks
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    for started, kind in ((T0, SnapshotKind.BASELINE), (T0 + 300, SnapshotKind.SNAPSHOT)):
        window = Window(started_at=started, duration_s=8.0, rate_hz=50.0, stacks=stacks,
                        samples=sum(s.weight for s in stacks), errors=0, sampler_cpu_s=0.3,
                        segments=1)  # fmt: skip
        snap = build_snapshot(window, (), classifier(), host=HOST, deployment="tiny-llama@8000")
        assert store.write(snap, kind).path is not None
    table = pd.concat(
        pd.read_parquet(p) for p in sorted((tmp_path / HOST).glob("*/stacks.parquet"))
    )
    assert set(table["host"]) == {HOST} and set(table["deployment"]) == {"tiny-llama@8000"}
    by = table.groupby(["snapshot", "kind", "time"])["weight"].sum()
    assert list(by.index) == [
        (name(T0), "baseline", datetime.fromtimestamp(T0, UTC).isoformat(timespec="seconds")),
        (name(T0 + 300), "snapshot",
         datetime.fromtimestamp(T0 + 300, UTC).isoformat(timespec="seconds")),
    ]  # fmt: skip
    assert list(by) == [sum(s.weight for s in stacks if s.frames)] * 2

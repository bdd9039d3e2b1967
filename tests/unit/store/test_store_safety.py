"""Issue 26, items 4, 7, 8, 9 and 11: the store deletes only the daemon's own folders and says
so, never follows a link, keeps no second copy of a write whose child died after its rename,
lets one daemon at a time write a host folder, and is not fooled by a clock set far forward or
a folder dated in the future. On tmp_path, with fake clocks; no processes."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sidecar.errors import ConfigError
from sidecar.store import folders
from sidecar.store.folders import Retention, SnapshotStore
from sidecar.store.layout import OutputTree, SnapshotKind
from tests.unit.store.test_store import (
    DAY,
    HOST,
    NO_LIMITS,
    T0,
    Clock,
    folder,
    index,
    name,
    snapshot,
    visible,
)

HOUR = 3600.0


def users_folder(root: Path, folder_name: str) -> Path:
    """A folder of the user's with a snapshot's name: no summary.json the daemon wrote."""
    path = root / HOST / folder_name
    path.mkdir(parents=True)
    (path / "precious.txt").write_text("keep me")
    return path


def deletions(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "retention deleted" in r.getMessage()]


# ---------------------------------------------------------------- item 4: only the daemon's own


def test_retention_leaves_a_users_folder_named_like_a_snapshot(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    old = T0 - 10 * DAY
    SnapshotStore(tmp_path, HOST, NO_LIMITS, clock=Clock(old)).write(
        snapshot(old), SnapshotKind.SNAPSHOT
    )
    theirs = users_folder(tmp_path, "20200101T000000Z")
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    store = SnapshotStore(tmp_path, HOST, Retention(7 * DAY, 7 * DAY, None, 0), clock=Clock(T0))
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == (name(old),)
    assert (theirs / "precious.txt").read_text() == "keep me"
    assert [e.name for e in store.snapshots()] == [name(T0)]
    assert index(tmp_path)["folders"] == [name(T0)]
    assert any("leaving alone 1 folders" in r.getMessage() and theirs.name in r.getMessage()
               for r in caplog.records)  # fmt: skip


@pytest.mark.parametrize("index_file", ["missing", "of an earlier version"])
def test_without_a_list_only_folders_with_a_snapshot_summary_are_the_daemons(
    tmp_path: Path, index_file: str
) -> None:
    """Folders of an earlier daemon (its index lists none, or is gone) are still retention's:
    each holds the summary.json every version writes; a user's folder does not."""
    ours = folder(tmp_path, name(T0 - 9 * DAY))
    theirs = users_folder(tmp_path, name(T0 - 8 * DAY))
    odd = users_folder(tmp_path, name(T0 - 8 * DAY, "-baseline"))
    (odd / "summary.json").write_text('{"notes": "a summary of my own"}')
    if index_file != "missing":
        doc = {"schema": 1, "host": HOST, "latest": None, "latest_baseline": None, "gaps": []}
        (tmp_path / HOST / "index.json").write_text(json.dumps(doc))
    store = SnapshotStore(tmp_path, HOST, Retention(DAY, DAY, None, 0), clock=Clock(T0))
    assert [e.name for e in store.snapshots()] == [ours.name]
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == (ours.name,)
    assert theirs.is_dir() and odd.is_dir()


def test_a_folder_written_after_the_index_last_was_is_still_the_daemons(tmp_path: Path) -> None:
    """A daemon killed between a folder's rename and the index's update: at the restart the
    folder, newer than every one listed and with its summary, is taken back; a user's is not."""
    SnapshotStore(tmp_path, HOST, NO_LIMITS).write(snapshot(T0), SnapshotKind.SNAPSHOT)
    unlisted = folder(tmp_path, name(T0 + 300))
    users_folder(tmp_path, name(T0 + 600))
    again = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    assert [e.name for e in again.snapshots()] == [name(T0), unlisted.name]


def test_every_retention_deletion_is_logged_with_its_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    for age_days in (9, 3, 2):
        folder(tmp_path, name(T0 - age_days * DAY), size=1000)
    store = SnapshotStore(tmp_path, HOST, Retention(5 * DAY, None, 2500, 0), clock=Clock(T0))
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == (name(T0 - 9 * DAY), name(T0 - 3 * DAY))
    lines = deletions(caplog)
    assert len(lines) == 2
    assert lines[0].startswith(f"retention deleted {name(T0 - 9 * DAY)} under {tmp_path / HOST}")
    assert "9.0 days old, over output.retention_days (5)" in lines[0]
    assert name(T0 - 3 * DAY) in lines[1] and "over output.max_total_mb" in lines[1]


# ---------------------------------------------------------------- item 7: links are not followed


def test_a_link_to_a_big_folder_counts_for_nothing_and_deletes_nothing(tmp_path: Path) -> None:
    big = tmp_path / "elsewhere"
    big.mkdir()
    (big / "model.bin").write_bytes(b"\0" * 200_000)
    for age_days in (5, 4, 3):
        folder(tmp_path, name(T0 - age_days * DAY), size=1000)
    (tmp_path / HOST / name(T0 - 6 * DAY)).symlink_to(big, target_is_directory=True)
    (tmp_path / HOST / name(T0 - 5 * DAY) / "weights").symlink_to(big)
    store = SnapshotStore(tmp_path, HOST, Retention(None, None, 20_000, 0), clock=Clock(T0))
    assert [e.name for e in store.snapshots()] == [name(T0 - d * DAY) for d in (5, 4, 3)]
    assert store.total_bytes_used < 4000  # three 1000-byte folders and a link's own bytes
    outcome = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert outcome.deleted == ()
    assert (big / "model.bin").stat().st_size == 200_000
    assert (tmp_path / HOST / name(T0 - 6 * DAY)).is_symlink()


def test_links_to_the_folder_itself_do_not_hang_the_scan(tmp_path: Path) -> None:
    looped = folder(tmp_path, name(T0), size=1000)
    (looped / "a").symlink_to(".")
    (looped / "b").symlink_to(".")
    opened: list[SnapshotStore] = []
    scan = threading.Thread(
        target=lambda: opened.append(SnapshotStore(tmp_path, HOST, NO_LIMITS)), daemon=True
    )
    scan.start()
    scan.join(timeout=10.0)
    assert not scan.is_alive(), "the store's scan followed the links round and round"
    assert [e.name for e in opened[0].snapshots()] == [looped.name]
    assert opened[0].total_bytes_used < 1100


# ---------------------------------------------------------------- item 8: no copy as NAME-1


def test_a_write_child_killed_after_its_rename_leaves_no_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def child_dies_after_writing(fn: Callable[[], Any], timeout_s: float = 0.0) -> Any:
        fn()  # the child: its folder renamed into place, then the OOM killer
        return fn()  # outproc's fallback: the write done again in the daemon's own process

    monkeypatch.setattr(folders.outproc, "call", child_dies_after_writing)
    caplog.set_level(logging.INFO, logger="vllm_sidecar")
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS, clock=Clock(T0))
    first = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert first.path == tmp_path / HOST / name(T0)
    # The same window written again is a true collision: numbered, and again one copy.
    second = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    assert second.path == tmp_path / HOST / name(T0, "-1")
    assert [p for p in visible(tmp_path) if p != "index.json"] == [name(T0), name(T0, "-1")]
    assert [e.name for e in store.snapshots()] == [name(T0), name(T0, "-1")]
    parts = {p.name for p in (tmp_path / HOST / ".table").iterdir()}
    assert parts == {f"{name(T0)}.parquet", f"{name(T0, '-1')}.parquet"}
    assert sum("already written whole" in r.getMessage() for r in caplog.records) == 2


# ---------------------------------------------------------------- item 9: one daemon a folder


def test_a_second_lock_on_the_folder_is_refused_naming_the_first_pid(tmp_path: Path) -> None:
    from sidecar.store.folders import FolderLock

    first = FolderLock(tmp_path / HOST)
    first.acquire()
    assert (tmp_path / HOST / ".daemon.lock").read_text() == f"{os.getpid()}\n"
    second = FolderLock(tmp_path / HOST)
    with pytest.raises(ConfigError, match=rf"daemon \(PID {os.getpid()}\)") as refused:
        second.acquire()
    assert "stop it first, or give this one another output folder" in str(refused.value)
    assert refused.value.exit_code == 2 and not second.held
    first.release()
    second.acquire()  # the first gone, the folder is free
    second.release()


def test_the_stores_of_one_daemon_share_its_lock(tmp_path: Path) -> None:
    from sidecar.store.folders import FolderLock, hold_folder

    held = hold_folder(tmp_path / HOST)
    try:
        assert hold_folder(tmp_path / HOST) is held  # a fleet's deployments, a reload
        with pytest.raises(ConfigError, match=f"PID {os.getpid()}"):
            FolderLock(tmp_path / HOST).acquire()  # another daemon
    finally:
        held.release()


def test_a_daemon_refused_the_folder_does_not_touch_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sidecar.config.load import load_config
    from sidecar.daemon.parts import open_store
    from sidecar.store.folders import FolderLock

    monkeypatch.setattr("socket.gethostname", lambda: HOST)
    first = FolderLock(tmp_path / HOST)  # the first daemon's
    first.acquire()
    try:
        config = load_config(environ={}, flags={"output.dir": str(tmp_path)})
        with pytest.raises(ConfigError, match=f"PID {os.getpid()}"):
            open_store(config)
        assert sorted(p.name for p in (tmp_path / HOST).iterdir()) == [".daemon.lock"]
    finally:
        first.release()


# ---------------------------------------------------------------- item 11: the clock


def test_a_forward_clock_step_of_a_week_costs_no_history(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host a week behind writes for five days, then NTP sets its clock a week forward: the
    folders look twelve days old by their names, but are at most five, and a 7-day retention
    keeps them until they are seven, even across a restart."""
    wall, steady = Clock(T0), Clock(1000.0)
    week = Retention(7 * DAY, 7 * DAY, None, 0)
    store = SnapshotStore(tmp_path, HOST, week, clock=wall, steady=steady)
    for i in range(11):  # every 12 hours for five days
        wall.now, steady.now = T0 + i * 12 * HOUR, 1000.0 + i * 12 * HOUR
        assert store.write(snapshot(wall.now), SnapshotKind.SNAPSHOT).deleted == ()
    written = [e.name for e in store.snapshots()]
    caplog.set_level(logging.WARNING, logger="vllm_sidecar")
    wall.now += 7 * DAY + 300
    steady.now += 300
    assert store.write(snapshot(wall.now), SnapshotKind.SNAPSHOT).deleted == ()
    assert any("the clock jumped 168.0 h forward" in r.getMessage() for r in caplog.records)
    assert index(tmp_path)["clock_steps"] == [{"at": "2026-06-02T20:31:40+00:00", "by_s": 7 * DAY}]
    # Three days later (a restart meanwhile): what is over seven days old goes, no more.
    wall.now += 3 * DAY
    steady.now += 3 * DAY
    again = SnapshotStore(tmp_path, HOST, week, clock=wall, steady=steady)
    assert again.write(snapshot(wall.now), SnapshotKind.SNAPSHOT).deleted == tuple(written[:3])


def test_a_folder_dated_ahead_of_the_clock_is_not_latest_and_waits_for_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ahead = folder(tmp_path, name(T0 + 3 * DAY), size=1000)
    caplog.set_level(logging.WARNING, logger="vllm_sidecar")
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS, clock=Clock(T0))
    store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
    latest = store.latest()
    assert latest is not None and latest.name == name(T0)
    assert index(tmp_path)["latest"]["name"] == name(T0)  # type: ignore[index]
    tree_latest = OutputTree(tmp_path / HOST).latest(now=T0)
    assert tree_latest is not None and tree_latest.name == name(T0)
    # Retention neither counts it nor deletes it: over a 1-byte limit, the others go.
    tight = SnapshotStore(tmp_path, HOST, Retention(DAY, DAY, 1, 0), clock=Clock(T0))
    assert tight.write(snapshot(T0 + 60), SnapshotKind.SNAPSHOT).deleted == (name(T0),)
    assert ahead.is_dir() and ahead.name in index(tmp_path)["folders"]  # type: ignore[operator]
    said = [r for r in caplog.records if "more than a day ahead" in r.getMessage()]
    assert len(said) == 2 and ahead.name in said[0].getMessage()  # once by each store
    tight.write(snapshot(T0 + 120), SnapshotKind.SNAPSHOT)
    assert len([r for r in caplog.records if "more than a day ahead" in r.getMessage()]) == 2
    later = SnapshotStore(tmp_path, HOST, NO_LIMITS, clock=Clock(T0 + 2.5 * DAY))
    latest = later.latest()  # the clock has nearly reached it: it is the latest now
    assert latest is not None and latest.name == ahead.name

"""The store on a really full disk: a 2 MiB tmpfs, filled, so the kernel itself answers ENOSPC.

A write that runs out of space mid-way is a skipped write, never an exception; readers see only
complete snapshot folders and a valid index; freeing space lets the next write through.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.parsers import parse_file
from sidecar.records.window import Window
from sidecar.store.folders import DiskState, Retention, SnapshotStore
from sidecar.store.layout import SnapshotKind
from sidecar.store.trend_table import PARTS_DIR, TABLE_NAME
from sidecar.window.snapshot import Snapshot, build_snapshot

pytestmark = pytest.mark.integration

HOST = "h"
T0 = 1_780_000_000.0
RAW = Path(__file__).resolve().parents[1] / "fixtures" / "recorded"
RAW = RAW / "v0.32.0-cpu-record-mixed.raw.txt"
PAGE = 4096


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards even when the test fails."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (run the integration tests in the dev container)")
    mnt = tmp_path / "disk"
    mnt.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)]
    done = subprocess.run(mount, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs CAP_SYS_ADMIN): {done.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], check=True)


def snapshot(started: float, *, stacks: bool) -> Snapshot:
    """A real snapshot: about 6 kB without stacks, about 150 kB with the recorded ones."""
    found = parse_file(RAW).stacks if stacks else ()
    window = Window(started_at=started, duration_s=8.0, rate_hz=50.0, stacks=found,
                    samples=sum(s.weight for s in found), errors=0, sampler_cpu_s=0.1,
                    segments=1)  # fmt: skip
    return build_snapshot(window, (), Classifier(load_rules()), host=HOST)


def fill(disk: Path, leave: int) -> Path:
    """Write zeros until about `leave` bytes (at most a page more) are free."""
    filler = disk / "filler"
    with filler.open("wb") as handle:
        for chunk in (1 << 16, PAGE):
            while shutil.disk_usage(disk).free - chunk >= leave:
                handle.write(b"\0" * chunk)
                handle.flush()
    assert leave <= shutil.disk_usage(disk).free < leave + PAGE
    return filler


def assert_readers_see_only_complete_snapshots(host: Path, expected: list[str]) -> None:
    """The snapshots, the index and the trend table (the store's own), nothing half-written:
    no temporary folder, and no table part but of a snapshot that is there."""
    names = [p.name for p in host.iterdir() if p.name not in (PARTS_DIR, TABLE_NAME)]
    assert sorted(names) == sorted([*expected, "index.json"])
    parts = sorted((host / PARTS_DIR).iterdir()) if (host / PARTS_DIR).is_dir() else []
    assert not [p.name for p in parts if p.name.startswith(".")]
    assert {p.name.removesuffix(".parquet") for p in parts} <= set(expected)
    for name in expected:
        files = sorted(p.name for p in (host / name).iterdir())
        assert files == ["stacks.collapsed", "stacks.parquet", "summary.json"]
        assert json.loads((host / name / "summary.json").read_text())["name"]
    json.loads((host / "index.json").read_text())  # valid, whatever happened


def test_enospc_mid_write_is_a_skipped_write(small_disk: Path) -> None:
    store = SnapshotStore(small_disk, HOST, Retention(None, None, None, min_free_bytes=0))
    first = store.write(snapshot(T0, stacks=False), SnapshotKind.SNAPSHOT)
    assert first.path is not None
    # Room for one more small snapshot by the store's estimate, so the store lets the write
    # through; the real one is ~25x bigger and the kernel refuses it part-way.
    filler = fill(small_disk, leave=store.snapshots()[-1].bytes)

    outcome = store.write(snapshot(T0 + 60, stacks=True), SnapshotKind.SNAPSHOT)
    assert outcome.path is None
    assert outcome.skipped_reason is not None and "no space left" in outcome.skipped_reason
    assert store.disk_state is DiskState.LOW and store.writes_skipped == 1
    assert_readers_see_only_complete_snapshots(small_disk / HOST, [first.path.name])
    assert json.loads((small_disk / HOST / "index.json").read_text())["latest"]["name"] == (
        first.path.name
    )

    filler.unlink()
    again = store.write(snapshot(T0 + 120, stacks=True), SnapshotKind.SNAPSHOT)
    assert again.path is not None and store.disk_state is DiskState.OK
    assert_readers_see_only_complete_snapshots(
        small_disk / HOST, [first.path.name, again.path.name]
    )
    index = json.loads((small_disk / HOST / "index.json").read_text())
    assert index["latest"]["name"] == again.path.name and index["disk"]["state"] == "ok"


def test_a_full_disk_is_refused_before_writing_and_baselines_stay(small_disk: Path) -> None:
    retention = Retention(None, None, None, min_free_bytes=256 << 10)
    store = SnapshotStore(small_disk, HOST, retention)
    baseline = store.write(snapshot(T0, stacks=False), SnapshotKind.BASELINE)
    regular = store.write(snapshot(T0 + 60, stacks=False), SnapshotKind.SNAPSHOT)
    assert baseline.path is not None and regular.path is not None
    filler = fill(small_disk, leave=0)

    outcome = store.write(snapshot(T0 + 120, stacks=True), SnapshotKind.SNAPSHOT)
    assert outcome.path is None and outcome.deleted == ()  # deleting could not make room
    assert outcome.skipped_reason is not None
    assert outcome.skipped_reason.startswith(f"disk nearly full: 0.00 MiB free under {small_disk}")
    assert store.disk_state is DiskState.LOW
    assert_readers_see_only_complete_snapshots(
        small_disk / HOST, [baseline.path.name, regular.path.name]
    )

    filler.unlink()
    again = store.write(snapshot(T0 + 180, stacks=False), SnapshotKind.BASELINE)
    assert again.path is not None and store.disk_state is DiskState.OK
    latest = store.latest_baseline()
    assert latest is not None and latest.name == again.path.name

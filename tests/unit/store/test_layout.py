"""sidecar/store/layout.py: the output folder's layout, read the way the store writes it:
OUT/<host>/[<deployment>/]<UTC>[-baseline][-<n>]/."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.errors import InputError
from sidecar.store.layout import (
    INDEX_NAME,
    SUMMARY_NAME,
    OutputTree,
    SnapshotKind,
    folder_label,
    folder_name,
    indexed_host,
    parse_name,
    snapshot_names,
    summary_deployment,
)

T = "20261201T120000Z"
T_LATER = "20261201T130000Z"
WALL = datetime(2026, 12, 1, 12, tzinfo=UTC).timestamp()


def _snap(parent: Path, name: str, deployment: str | None = None) -> Path:
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / SUMMARY_NAME).write_text(json.dumps({"deployment": deployment}))
    return folder


def _fleet(out: Path) -> None:
    """OUT/h/<two deployments>, each with its index naming the host, and OUT/old (one target)."""
    for d in ("m@8000", "m@8001"):
        _snap(out / "h" / d, T)
        (out / "h" / d / INDEX_NAME).write_text(json.dumps({"host": "h", "deployment": d}))
    _snap(out / "old", T)


def test_folder_names_round_trip() -> None:
    assert folder_name(T, SnapshotKind.BASELINE) == f"{T}-baseline"
    assert folder_name(T, SnapshotKind.SNAPSHOT) == T
    assert parse_name(f"{T}-baseline-2") == (SnapshotKind.BASELINE, WALL, 2)
    assert parse_name(T) == (SnapshotKind.SNAPSHOT, WALL, 0)
    for name in (f".{T}.tmp-12", "20261399T120000Z", "index.json"):
        assert parse_name(name) is None


def test_hosts_and_deployments(tmp_path: Path) -> None:
    _fleet(tmp_path)
    tree = OutputTree(tmp_path)
    assert tree.hosts() == ["h/m@8000", "h/m@8001", "old"]
    assert OutputTree(tmp_path / "h").deployments() == ["m@8000", "m@8001"]
    assert OutputTree(tmp_path / "old").deployments() == []
    assert tree.host_folder("h/m@8001") == tmp_path / "h" / "m@8001"
    assert tree.host_folders(None) == [tmp_path / p for p in ("h/m@8000", "h/m@8001", "old")]
    assert OutputTree(tmp_path / "old").host_folder(None) == tmp_path / "old"
    with pytest.raises(InputError, match="several hosts: pick one with --host"):
        tree.host_folder(None)
    with pytest.raises(InputError, match=r"no snapshots of host 'x' .* hosts there: h/m@8000"):
        tree.host_folder("x")
    with pytest.raises(InputError, match="is not a folder"):
        OutputTree(tmp_path / "missing").host_folder(None)


def test_what_the_index_names(tmp_path: Path) -> None:
    _fleet(tmp_path)
    assert indexed_host(tmp_path / "h" / "m@8000") == "h"
    assert folder_label(tmp_path / "h" / "m@8000") == "h/m@8000"
    assert indexed_host(tmp_path / "old") is None
    assert folder_label(tmp_path / "old") == "old"


def test_snapshots_by_kind_oldest_first_and_the_latest(tmp_path: Path) -> None:
    host = tmp_path / "out" / "h"
    _snap(host, f"{T}-baseline")
    _snap(host, T_LATER)
    _snap(host, T)
    (host / f".{T}.tmp-99").mkdir()  # a writer's leftover is not a snapshot
    (host / "20261201T140000Z").mkdir()  # no summary.json: not complete
    tree = OutputTree(tmp_path / "out")  # the host folders one level down are read too
    assert [f.name for f in tree.snapshots()] == [T, f"{T}-baseline", T_LATER]  # by time, name
    assert [f.name for f in tree.snapshots(SnapshotKind.BASELINE)] == [f"{T}-baseline"]
    latest = tree.latest(SnapshotKind.SNAPSHOT)
    assert latest is not None and latest.path == host / T_LATER
    assert latest.kind is SnapshotKind.SNAPSHOT and latest.seq == 0
    assert OutputTree(tmp_path / "empty").latest() is None
    assert snapshot_names(host) == {f"{T}-baseline", T, T_LATER, "20261201T140000Z"}


def test_the_summary_names_the_deployment(tmp_path: Path) -> None:
    assert summary_deployment(_snap(tmp_path, T, "m@8000")) == "m@8000"
    assert summary_deployment(_snap(tmp_path, T_LATER)) is None
    assert summary_deployment(tmp_path / "missing") is None

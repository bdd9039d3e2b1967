"""What each side of a diff reads (sidecar/diff/sides.py), on the shipped samples."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.diff.sides import Range, side_from
from sidecar.samples import write_samples
from sidecar.store.layout import OutputTree, SnapshotKind


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("samples")
    write_samples(dest)
    return dest


def test_a_range_with_snapshots_leaves_the_baselines_out_and_says_so(samples: Path) -> None:
    folders = OutputTree(samples).snapshots()
    kinds = {f.kind for f in folders}
    assert SnapshotKind.BASELINE in kinds and SnapshotKind.SNAPSHOT in kinds
    side = side_from(f"{samples}@..", Range(None, None), now=2e9, label="A")
    regular = [f for f in folders if f.kind is not SnapshotKind.BASELINE]
    assert {s.name for s in side.summaries} == {f.name for f in regular}
    baselines = len(folders) - len(regular)
    assert f"({baselines} baselines left out: they repeat these windows)" in side.label

"""A daemon's output folder made of real snapshots, for the upload tests (unit and integration).

The folders are copied unmodified from tests/fixtures: the ten summaries of
fixtures/diff/steady-mixed (a real `tiny@59399` deployment, 2026-12-01) and the two complete
folders of fixtures/flame (summary.json, stacks.parquet, stacks.collapsed; schema 3 without a
deployment, so they land under `deployment=unknown`). Each folder's trend-table row is written
as the daemon's store writes it (a part under `.table/`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from sidecar.store.folders import Retention, SnapshotStore
from sidecar.store.summary_io import read_summary
from sidecar.store.trend_table import TrendTable, summary_row

FIXTURES = Path(__file__).parent / "fixtures"
HOST = "gpu-node-1"
KEEP_ALL = Retention(max_age_s=None, baseline_max_age_s=None, max_total_bytes=None,
                     min_free_bytes=0)  # fmt: skip


def source_folders() -> list[Path]:
    flame = [FIXTURES / "flame" / "prefill-heavy", FIXTURES / "flame" / "decode-heavy"]
    return [*sorted((FIXTURES / "diff" / "steady-mixed").iterdir()), *flame]


def real_output(root: Path, retention: Retention = KEEP_ALL, **kw: object) -> SnapshotStore:
    """OUT/<HOST>/ with the twelve real folders and their table rows; the store over it."""
    host_dir = root / HOST
    host_dir.mkdir(parents=True)
    table = TrendTable(host_dir)
    for src in source_folders():
        name = json.loads((src / "summary.json").read_text())["name"]
        dst = host_dir / name
        shutil.copytree(src, dst)
        table.append(summary_row(read_summary(dst), name=name))
    return SnapshotStore(root, HOST, retention, **kw)  # type: ignore[arg-type]


def folder_files(store: SnapshotStore, name: str) -> dict[str, int]:
    """The files of one local folder: relative path -> size."""
    folder = store.dir / name
    return {p.relative_to(folder).as_posix(): p.stat().st_size
            for p in folder.rglob("*") if p.is_file()}  # fmt: skip

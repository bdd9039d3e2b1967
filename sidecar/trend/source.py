"""Where `trend` gets its rows: the host folder's trend table, checked against the folders.

The folders are the truth. The table is read whole (main file and parts); a row whose folder
retention deleted is dropped, a folder without a row (a table write that failed, a table
deleted or garbled, folders copied in by hand) gets its row from its summary.json, and the
repaired table is saved for the next reader. A summary that cannot be read is skipped with a
warning that names it: the rest of the trend stands.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from sidecar.errors import InputError
from sidecar.records.summary import SnapshotSummary
from sidecar.store.layout import OutputTree, snapshot_names
from sidecar.store.layout import folder_label as folder_label  # `trend`'s title names it
from sidecar.store.trend_table import (
    TableError,
    TrendTable,
    rows_to_table,
    select_names,
    summary_row,
)

Note = Callable[[str], None]


def host_folder(out: Path, host: str | None) -> Path:
    """OUT itself when it is a host folder (`OUT/<host>`), else OUT/<host>: the one host under
    OUT, or the one `host` names (sidecar/store/layout.py)."""
    return OutputTree(out).host_folder(host)


def host_folders(out: Path, host: str | None) -> list[Path]:
    """Every host folder `out` names (sidecar/store/layout.py)."""
    return OutputTree(out).host_folders(host)


def load_table(host_dir: Path, note: Note) -> pa.Table:
    """The host's rows, one per snapshot folder, repaired and saved when out of step."""
    started = time.perf_counter()
    folders = snapshot_names(host_dir)
    table = TrendTable(host_dir)
    try:
        current, parts, warnings = table.read()
    except TableError as exc:
        current, parts, warnings = None, [], [str(exc)]
    for warning in warnings:
        note(f"warning: {warning}")
    have = set(current["name"].to_pylist()) if current is not None else set()
    missing = sorted(n for n in folders if n not in have)
    stale = have - folders
    if current is not None and not missing and not stale:
        return current
    from sidecar.store.summary_io import (
        read_summary,  # pydantic: only when there are rows to rebuild
    )

    rows = []
    for name in missing:
        try:
            rows.append(summary_row(read_summary(host_dir / name), name=name))
        except InputError as exc:
            note(f"warning: skipped {host_dir / name}: {exc}")
    merged = select_names(_concat(current, rows_to_table(rows)), folders)
    try:
        table.save(merged, parts)
    except (OSError, TableError) as exc:
        note(f"warning: cannot save {table.path} ({exc}); the next trend reads the summaries again")
    took = time.perf_counter() - started
    if current is None:
        note(f"rebuilt the table from {len(rows)} summaries in {took:.1f} s")
    else:
        note(f"brought the table up to date: {len(rows)} rows added from their summaries, "
             f"{len(stale)} rows of deleted folders dropped, in {took:.1f} s")  # fmt: skip
    return merged


def summary_reader(host_dir: Path, note: Note) -> Callable[[str], SnapshotSummary | None]:
    """A window's summary by its folder name under HOST_DIR, for diff's test of a level change
    (sidecar.trend.levels); None, with a warning that names it, when it cannot be read."""

    def read(name: str) -> SnapshotSummary | None:
        from sidecar.store.summary_io import read_summary  # pydantic: only when a change is tested

        try:
            return read_summary(host_dir / name)
        except InputError as exc:
            note(f"warning: {host_dir / name} left out of the level changes' tests: {exc}")
            return None

    return read


def _concat(current: pa.Table | None, new: pa.Table) -> pa.Table:
    if current is None:
        return new
    return pa.concat_tables([current, new], promote_options="permissive").sort_by(
        [("time", "ascending"), ("name", "ascending")]
    )

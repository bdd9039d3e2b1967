"""sidecar/store/stacks.py owns the stacks files: the rows a snapshot gives carry exactly its
columns, the writers write them, and the readers read back what was written."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.parsers import parse_file
from sidecar.records.window import Window
from sidecar.store.stacks import (
    COLLAPSED,
    COLUMNS,
    PARQUET,
    STACK_COLUMNS,
    STACK_TYPES,
    collapsed_text,
    read_collapsed,
    read_stack_rows,
    stack_table,
)
from sidecar.store.writers import write_snapshot
from sidecar.window.snapshot import Snapshot, build_snapshot

RAW = Path(__file__).resolve().parents[2] / "fixtures" / "recorded"


def _snapshot() -> Snapshot:
    stacks = parse_file(RAW / "v0.32.0-cpu-record-mixed.raw.txt").stacks
    window = Window(started_at=1_780_000_000.0, duration_s=8.0, rate_hz=50.0, stacks=stacks,
                    samples=sum(s.weight for s in stacks), errors=0, sampler_cpu_s=0.3,
                    segments=1)  # fmt: skip
    return build_snapshot(window, (), Classifier(load_rules()), host="h", deployment="m@8000")


def test_a_snapshots_stack_rows_carry_exactly_the_files_columns() -> None:
    rows = _snapshot().stack_rows("baseline")
    assert rows and all(tuple(row) == STACK_COLUMNS for row in rows)
    assert set(COLUMNS) <= set(STACK_COLUMNS) and set(STACK_TYPES) <= set(STACK_COLUMNS)


def test_the_table_has_the_columns_in_order_with_their_types() -> None:
    table = stack_table(_snapshot().stack_rows())
    assert tuple(table.schema.names) == STACK_COLUMNS
    assert {n: str(table.schema.field(n).type) for n in STACK_TYPES} == STACK_TYPES
    empty = stack_table([])
    assert tuple(empty.schema.names) == STACK_COLUMNS and empty.num_rows == 0


def test_what_the_writers_write_the_readers_read_back(tmp_path: Path) -> None:
    snap = _snapshot()
    folder = write_snapshot(snap, tmp_path, ("parquet", "collapsed"))
    assert tuple(pq.read_schema(folder / PARQUET).names) == STACK_COLUMNS
    from_parquet = read_stack_rows(folder)
    from_collapsed = read_collapsed((folder / COLLAPSED).read_text())
    assert sorted(from_parquet, key=repr) == sorted(from_collapsed, key=repr)
    assert sum(r.weight for r in from_parquet) == sum(r["weight"] for r in snap.stack_rows())


def test_collapsed_lines() -> None:
    rows = [{"role": "worker", "phase": "decode", "stack": "a;b", "weight": 3}]
    assert collapsed_text(rows) == "worker;decode;a;b 3\n"
    assert collapsed_text([]) == ""

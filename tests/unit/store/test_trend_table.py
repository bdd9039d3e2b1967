"""The trend table: rows from real summaries of every schema, part files, compaction, the
store's append path, and the reader's repair of a table out of step with the folders.
No processes."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from datetime import UTC, datetime
from functools import cache
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.errors import InputError
from sidecar.records.summary import Fingerprint
from sidecar.records.window import Window
from sidecar.store.folders import Retention, SnapshotStore
from sidecar.store.layout import SnapshotKind
from sidecar.store.summary_io import read_summary
from sidecar.store.trend_table import (
    COMPACT_EVERY,
    SERVING,
    TABLE_NAME,
    TrendTable,
    fingerprint_digest,
    rows_to_table,
    summary_row,
    table_schema,
)
from sidecar.trend.source import host_folder, load_table
from sidecar.window.snapshot import Snapshot, build_snapshot

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SCHEMA1 = FIXTURES / "schema1" / "20261201T112537Z"
SCHEMA2 = FIXTURES / "trend" / "schema2" / "20261201T133909Z"
SCHEMA3 = FIXTURES / "trend" / "schema3" / "20261201T140758Z"
HOST = "gpu-node-1"
T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z
DAY = 86_400.0
NO_LIMITS = Retention(max_age_s=None, baseline_max_age_s=None, max_total_bytes=None,
                      min_free_bytes=0)  # fmt: skip
FP = Fingerprint(vllm="0.32.0", torch="2.9.0", python="3.12.3", model="tiny",
                 serving={"max_num_seqs": "256"}, notes={"cuda": "no NVML"})  # fmt: skip


@cache
def classifier() -> Classifier:
    return Classifier(load_rules())


def snapshot(started: float) -> Snapshot:
    """A real (empty) window's snapshot, as the store's own tests make them."""
    window = Window(started_at=started, duration_s=8.0, rate_hz=5.0, stacks=(), samples=0,
                    errors=0, sampler_cpu_s=0.0, segments=1)  # fmt: skip
    return build_snapshot(window, (), classifier(), host=HOST)


def name(wall: float, suffix: str = "") -> str:
    return datetime.fromtimestamp(wall, tz=UTC).strftime("%Y%m%dT%H%M%SZ") + suffix


# ---------------------------------------------------------------------------------- rows


@pytest.mark.parametrize("folder", [SCHEMA1, SCHEMA2, SCHEMA3], ids=["schema1", "2", "3"])
def test_a_real_summary_of_every_schema_flattens_to_one_row(folder: Path) -> None:
    summary = read_summary(folder)
    row = summary_row(summary, name=folder.name)
    assert row["name"] == folder.name and row["kind"] == "snapshot" and row["host"] == "vm"
    assert row["time"].isoformat() == summary.created_at
    assert row["samples"] == summary.samples > 0
    for role, shares in summary.by_role.items():
        for phase, share in shares.items():
            assert row[f"share.{role}.{phase}"] == share
    for role, shares in summary.main_thread.items():
        for phase, share in shares.items():
            assert row[f"main.{role}.{phase}"] == share
    assert {f: row[f] for f in SERVING} == {f: getattr(summary.serving, f) for f in SERVING}
    assert row["generation_tokens_per_s"] > 0 and row["kv_bytes"] == 1073741824
    assert row["fingerprint"] == "" and row["vllm"] is None  # none of them has one
    table = rows_to_table([row])
    assert table.schema.names[: len(table_schema())] == table_schema().names


def test_a_baseline_folder_name_gives_the_kind_when_the_summary_has_none() -> None:
    row = summary_row(read_summary(SCHEMA1), name="20261201T112537Z-baseline")
    assert row["kind"] == "baseline" and row["name"] == "20261201T112537Z-baseline"


def test_the_fingerprint_digest_is_stable_and_ignores_the_notes() -> None:
    assert fingerprint_digest(None) == ""
    digest = fingerprint_digest(FP)
    assert len(digest) == 12
    assert fingerprint_digest(dataclasses.replace(FP, notes={})) == digest
    assert fingerprint_digest(dataclasses.replace(FP, vllm="0.31.0")) != digest
    # read back from JSON (lists, dicts), the same fingerprint gives the same digest
    summary = dataclasses.replace(read_summary(SCHEMA3), fingerprint=FP)
    row = summary_row(summary)
    assert row["fingerprint"] == digest and row["vllm"] == "0.32.0" and row["model"] == "tiny"
    assert row["serving_flags"] == "max_num_seqs=256"


def test_old_and_new_rows_concatenate_and_an_unknown_column_is_kept() -> None:
    old = summary_row(read_summary(SCHEMA1))
    new = dict(summary_row(read_summary(SCHEMA3)), **{"share.worker.new_phase": 0.5})
    table = rows_to_table([old, new])
    assert table.num_rows == 2 and table["share.worker.new_phase"].to_pylist() == [None, 0.5]


# ---------------------------------------------------------------------------------- parts


def _rows(n: int) -> list[dict[str, object]]:
    base = summary_row(read_summary(SCHEMA3))
    return [dict(base, name=name(T0 + 300 * i), time=base["time"]) for i in range(n)]


def test_parts_are_read_with_the_main_file_and_compaction_folds_them(tmp_path: Path) -> None:
    table = TrendTable(tmp_path)
    rows = _rows(4)
    for row in rows:
        table.append(row)
    assert len(table.parts()) == 4 and not table.path.exists()
    read, parts, warnings = table.read()
    assert read is not None and read.num_rows == 4 and len(parts) == 4 and not warnings
    compacted = table.compact(keep={r["name"] for r in rows[1:]})  # the first folder is gone
    assert compacted["name"].to_pylist() == [r["name"] for r in rows[1:]]
    assert table.parts() == [] and pq.read_table(table.path).num_rows == 3
    table.append(dict(rows[1], samples=1.0))  # a rewrite of a folder's row: the last one wins
    read, _, _ = table.read()
    assert read is not None and read.num_rows == 3 and read["samples"].to_pylist()[0] == 1.0


def test_a_garbled_part_is_skipped_with_a_warning(tmp_path: Path) -> None:
    table = TrendTable(tmp_path)
    table.append(_rows(1)[0])
    (table.parts_dir / "20260101T000000Z.parquet").write_bytes(b"not parquet")
    read, parts, warnings = table.read()
    assert read is not None and read.num_rows == 1 and len(parts) == 1
    assert len(warnings) == 1 and "20260101T000000Z.parquet" in warnings[0]


# ---------------------------------------------------------------------------------- the store


def test_each_write_appends_its_row_and_every_nth_compacts(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    outcome = store.write(snapshot(T0), SnapshotKind.BASELINE)
    assert outcome.path is not None
    table = TrendTable(tmp_path / HOST)
    read, _, _ = table.read()
    assert read is not None
    assert read["name"].to_pylist() == [name(T0, "-baseline")]
    assert read["kind"].to_pylist() == ["baseline"]
    for i in range(1, COMPACT_EVERY):
        store.write(snapshot(T0 + 300 * i), SnapshotKind.SNAPSHOT)
    assert table.parts() == [] and pq.read_table(table.path).num_rows == COMPACT_EVERY


def test_rows_of_deleted_folders_go_at_the_next_compaction(tmp_path: Path) -> None:
    clock_now = [T0]
    retention = Retention(max_age_s=DAY, baseline_max_age_s=None, max_total_bytes=None,
                          min_free_bytes=0)  # fmt: skip
    store = SnapshotStore(tmp_path, HOST, retention, clock=lambda: clock_now[0])
    for i in range(COMPACT_EVERY):
        clock_now[0] = T0 + 3600 * i  # hourly: the first day's go after 24 writes
        store.write(snapshot(clock_now[0]), SnapshotKind.SNAPSHOT)
    kept = [e.name for e in store.snapshots()]
    assert len(kept) < COMPACT_EVERY
    assert pq.read_table(TrendTable(tmp_path / HOST).path)["name"].to_pylist() == kept


def test_a_table_that_cannot_be_written_costs_no_snapshot_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = SnapshotStore(tmp_path, HOST, NO_LIMITS)
    (tmp_path / HOST / ".table").write_text("a file where the parts folder goes")
    with caplog.at_level(logging.WARNING, logger="vllm_sidecar"):
        first = store.write(snapshot(T0), SnapshotKind.SNAPSHOT)
        second = store.write(snapshot(T0 + 300), SnapshotKind.SNAPSHOT)
    assert first.path is not None and second.path is not None
    warnings = [r for r in caplog.records if "trend table" in r.getMessage()]
    assert len(warnings) == 1 and "rebuilds its rows" in warnings[0].getMessage()


# ---------------------------------------------------------------------------------- reading


def _host_dir(tmp_path: Path, n: int = 3) -> Path:
    """`n` copies of the schema-3 summary as folders of one host, 5 minutes apart."""
    host = tmp_path / "out" / "vm"
    doc = json.loads((SCHEMA3 / "summary.json").read_text())
    for i in range(n):
        folder = host / name(T0 + 300 * i)
        folder.mkdir(parents=True)
        (folder / "summary.json").write_text(json.dumps(dict(doc, name=folder.name)))
    return host


def test_a_missing_table_is_rebuilt_from_the_summaries_and_saved(tmp_path: Path) -> None:
    host, notes = _host_dir(tmp_path), []
    table = load_table(host, notes.append)
    assert table.num_rows == 3 and (host / TABLE_NAME).exists()
    assert len(notes) == 1 and notes[0].startswith("rebuilt the table from 3 summaries in ")
    notes.clear()
    assert load_table(host, notes.append).num_rows == 3 and notes == []  # in step: read only


def test_a_table_out_of_step_gains_new_folders_and_loses_deleted_ones(tmp_path: Path) -> None:
    host, notes = _host_dir(tmp_path), []
    load_table(host, notes.append)
    shutil.rmtree(host / name(T0))
    shutil.copytree(host / name(T0 + 300), host / name(T0 + 900))
    notes.clear()
    table = load_table(host, notes.append)
    assert table["name"].to_pylist() == [name(T0 + 300), name(T0 + 600), name(T0 + 900)]
    assert "1 rows added" in notes[0] and "1 rows of deleted folders dropped" in notes[0]


def test_a_garbled_table_or_summary_is_named_and_the_rest_stands(tmp_path: Path) -> None:
    host, notes = _host_dir(tmp_path), []
    (host / TABLE_NAME).write_bytes(b"garbage")
    (host / name(T0) / "summary.json").write_text('{"phases": {"idle": "many"}')
    table = load_table(host, notes.append)
    assert table.num_rows == 2
    assert any(TABLE_NAME in n and n.startswith("warning: cannot read") for n in notes)
    assert any(f"skipped {host / name(T0)}" in n for n in notes)
    assert notes[-1].startswith("rebuilt the table from 2 summaries")


def test_the_host_folder_is_found_under_the_output_root(tmp_path: Path) -> None:
    host = _host_dir(tmp_path)
    out = host.parent
    assert host_folder(out, None) == host == host_folder(host, None) == host_folder(out, "vm")
    with pytest.raises(InputError, match=r"no snapshots of host 'other'.*hosts there: vm"):
        host_folder(out, "other")
    shutil.copytree(host, out / "vm2")
    with pytest.raises(InputError, match="several hosts: pick one with --host"):
        host_folder(out, None)
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no snapshot folders under"):
        host_folder(tmp_path / "empty", None)

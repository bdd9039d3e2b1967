"""The trend table: one row per snapshot folder, kept beside the folders so that `trend` never
re-reads thousands of summary.json files.

`OUT/<host>/snapshots.parquet` holds the rows as of the last compaction; each write since then
adds one small part file, `OUT/<host>/.table/<folder>.parquet` (a temporary name, fsync,
os.replace: a reader sees a whole part or none). Every `COMPACT_EVERY` parts the store folds
them into the main file (again written to a temporary name and replaced) and drops the rows of
folders that retention deleted. A write costs one tiny file; a compaction rewrites a few MB
every few hours. The summaries stay the truth: a reader that finds the table missing, garbled
or out of step with the folders rebuilds the rows it lacks from them (`sidecar.trend.source`).

The columns are a fixed pyarrow schema (every role x phase for both share kinds, the serving
figures, the fingerprint's digest and readable fields), so parts of any age concatenate; a
column a later version adds reads as null in older rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Collection, Iterable, Mapping
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from sidecar.records import Phase, Role
from sidecar.records.summary import Fingerprint, SnapshotSummary
from sidecar.store.atomic import make_folder, write_file
from sidecar.store.layout import PARTS_DIR, TABLE_NAME
from sidecar.store.writers import to_jsonable

COMPACT_EVERY = 48  # parts: four hours of 5-minute snapshots
# In the file's metadata; a reader rebuilds a table of another version from the summaries.
# 2: `samples.<role>`, each role's samples (fleet shares are weighted by them: `aggregate`).
TABLE_VERSION = 2

# vLLM's figures over the window (ServingFigures), each a column of the same name.
SERVING = (
    "requests_per_s", "prompt_tokens_per_s", "generation_tokens_per_s",
    "ttft_mean_s", "ttft_p50_s", "ttft_p95_s", "itl_mean_s", "itl_p50_s", "itl_p95_s",
    "prefill_time_mean_s", "decode_time_mean_s", "kv_cache_usage", "preemptions",
    "requests_running", "requests_waiting",
)  # fmt: skip
CUSTOM_PREFIX = "custom."  # + the custom metric's name (config custom_metrics)
# Share columns: `share.<role>.<phase>` over all the role's threads (the summary's by_role),
# `main.<role>.<phase>` over each process's main thread (main_thread).
SHARE_PREFIXES = {"share": "by_role", "main": "main_thread"}
# `samples.<role>`: the role's samples, the weight of its `share.<role>.*` columns when shares
# of many snapshots are pooled (a fleet's share is a ratio of sums, not a mean of shares).
ROLE_SAMPLES = "samples"


class TableError(Exception):
    """The table cannot be read or written (garbled file, a schema pyarrow refuses)."""


@cache
def table_schema() -> pa.Schema:
    text = ("name", "kind", "host", "deployment", "fingerprint", "vllm", "model", "torch",
            "attention_backend", "gpus", "serving_flags")  # fmt: skip
    fields = [pa.field("time", pa.timestamp("s", tz="UTC"))]
    fields += [pa.field(n, pa.string()) for n in text]
    fields += [pa.field(n, pa.float64()) for n in ("samples", "duration_s", "sampler_cpu_share")]
    fields += [pa.field(n, pa.float64()) for n in SERVING]
    fields += [pa.field(n, pa.float64()) for n in ("kv_bytes", "gpu_util_pct", "partial")]
    fields += [pa.field(f"{ROLE_SAMPLES}.{role.value}", pa.float64()) for role in Role]
    fields += [
        pa.field(f"{prefix}.{role.value}.{phase.value}", pa.float64())
        for prefix in SHARE_PREFIXES
        for role in Role
        for phase in Phase
    ]
    return pa.schema(fields, metadata={"vllm_sidecar_table": str(TABLE_VERSION)})


def summary_row(summary: SnapshotSummary, name: str | None = None) -> dict[str, Any]:
    """One snapshot as one flat row. `name` is the folder's (a baseline's carries `-baseline`,
    which the summary's own name does not); missing figures are None, never 0."""
    s, fp = summary.serving, summary.fingerprint
    row: dict[str, Any] = {
        "time": _utc(summary.created_at),
        "name": name or summary.name,
        "kind": summary.kind or ("baseline" if "-baseline" in (name or "") else "snapshot"),
        "host": summary.host,
        "deployment": summary.deployment,
        "samples": float(summary.samples),
        "duration_s": summary.sampling.duration_s,
        "sampler_cpu_share": summary.sampling.sampler_cpu_share,
        "partial": float(summary.sampling.partial),
        "kv_bytes": summary.kv_cache.bytes if summary.kv_cache else None,
        "gpu_util_pct": _gpu_util(summary),
        **{f: getattr(s, f) for f in SERVING},
        **fingerprint_columns(fp),
        # The operator's custom metrics (schema 4): a float column each, `custom.<name>`,
        # added to the fixed schema as the rows bring them (rows_to_table).
        **{f"{CUSTOM_PREFIX}{m.name}": m.value for m in summary.custom},
        **{f"{ROLE_SAMPLES}.{role}": float(n) for role, n in summary.role_samples.items()},
    }
    for prefix, section in SHARE_PREFIXES.items():
        for role, shares in getattr(summary, section).items():
            row.update({f"{prefix}.{role}.{phase}": v for phase, v in shares.items()})
    return row


def fingerprint_digest(fp: Fingerprint | None) -> str:
    """A short stable digest of what the target ran; "" when unknown. Left out: `notes` (why a
    field is missing: the same software read more or less completely is the same) and
    `attention_backend`, which is read from the window's stacks and so is None in a window
    that ran no attention (an idle one): the digest would change with the load. The backend
    has a column of its own, and `trend` compares it across idle windows."""
    if fp is None:
        return ""
    doc = to_jsonable(fp)
    doc.pop("notes", None)
    doc.pop("attention_backend", None)
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def fingerprint_columns(fp: Fingerprint | None) -> dict[str, str | None]:
    if fp is None:
        return {"fingerprint": "", "vllm": None, "model": None, "torch": None,
                "attention_backend": None, "gpus": None, "serving_flags": None}  # fmt: skip
    flags = " ".join(f"{k}={v}" for k, v in sorted(fp.serving.items())) or None
    return {"fingerprint": fingerprint_digest(fp), "vllm": fp.vllm, "model": fp.model,
            "torch": fp.torch, "attention_backend": fp.attention_backend,
            "gpus": ", ".join(fp.gpus) or None, "serving_flags": flags}  # fmt: skip


def rows_to_table(rows: Iterable[Mapping[str, Any]]) -> pa.Table:
    """Rows -> a table of the fixed schema; a key the schema lacks (a phase a later version
    names) becomes a float column of its own rather than being dropped."""
    rows = list(rows)
    schema = table_schema()
    extra = sorted({k for r in rows for k in r} - set(schema.names))
    schema = schema.append(pa.field(extra[0], pa.float64())) if extra else schema
    for name in extra[1:]:
        schema = schema.append(pa.field(name, pa.float64()))
    try:
        return pa.Table.from_pylist([dict(r) for r in rows], schema=schema)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise TableError(f"cannot tabulate the rows: {exc}") from exc


class TrendTable:
    """The table of one host folder: the compacted main file and the parts written since."""

    def __init__(self, host_dir: Path) -> None:
        self.dir = Path(host_dir)
        self.path = self.dir / TABLE_NAME
        self.parts_dir = self.dir / PARTS_DIR

    def append(self, row: Mapping[str, Any]) -> Path:
        """One part file for one row; OSError (a full disk) and TableError go to the caller."""
        make_folder(self.parts_dir)  # 0750, as every folder of the store
        part = self.parts_dir / f"{row['name']}.parquet"
        self._write(rows_to_table([row]), part)
        return part

    def parts(self) -> list[Path]:
        try:
            return sorted(p for p in self.parts_dir.iterdir() if p.suffix == ".parquet")
        except OSError:
            return []

    def read(self) -> tuple[pa.Table | None, list[Path], list[str]]:
        """(main file + parts, the parts read, warnings). The main table is None when it is
        missing, unreadable or of another version; a garbled part is skipped with a warning
        (its folder's summary restores the row)."""
        main, warnings = None, []
        if self.path.exists():
            try:
                main = pq.read_table(self.path)
                version = (main.schema.metadata or {}).get(b"vllm_sidecar_table", b"")
                if version != str(TABLE_VERSION).encode():
                    warnings.append(f"{self.path} is of table version {version.decode()!r}")
                    main = None
            except (OSError, pa.ArrowException) as exc:
                warnings.append(f"cannot read {self.path}: {exc}")
        tables, read = [main] if main is not None else [], []
        for part in self.parts():
            try:
                tables.append(pq.read_table(part))
                read.append(part)
            except (OSError, pa.ArrowException) as exc:
                warnings.append(f"skipped the garbled table part {part}: {exc}")
        if main is None and not tables:
            return None, read, warnings
        return _dedupe(_concat(tables)), read, warnings

    def row_file(self, name: str, dest: Path) -> Path | None:
        """The row of folder `name` alone, written to `dest` (its part, or the main file's row
        after a compaction); None when the table has no row for it."""
        part = self.parts_dir / f"{name}.parquet"
        try:
            table = pq.read_table(part)
        except FileNotFoundError:
            main, _, _ = self.read()
            table = select_names(main, {name}) if main is not None else None
        except (OSError, pa.ArrowException) as exc:
            raise TableError(f"cannot read {part}: {exc}") from exc
        if table is None or table.num_rows == 0:
            return None
        try:  # a staging copy for an upload: no fsync, the table's own files stay the truth
            pq.write_table(table.replace_schema_metadata(table_schema().metadata), dest,
                           compression="zstd")  # fmt: skip
        except pa.ArrowException as exc:
            raise TableError(f"cannot write {dest}: {exc}") from exc
        return dest

    def compact(self, keep: Collection[str] | None = None) -> pa.Table:
        """Fold the parts into the main file, keeping only rows whose folder is in `keep`."""
        table, read, _ = self.read()
        table = table if table is not None else rows_to_table([])
        if keep is not None:
            table = select_names(table, keep)
        self.save(table, read)
        return table

    def save(self, table: pa.Table, parts: Iterable[Path] = ()) -> None:
        """Replace the main file with `table`, then remove `parts` (the ones it holds)."""
        make_folder(self.dir)
        self._write(table, self.path)
        for part in parts:
            with contextlib.suppress(OSError):
                part.unlink()

    def _write(self, table: pa.Table, path: Path) -> None:
        """Written atomically and fsynced (sidecar/store/atomic.py)."""
        try:
            stamped = table.replace_schema_metadata(table_schema().metadata)
            write_file(path, lambda handle: pq.write_table(stamped, handle, compression="zstd"))
        except pa.ArrowException as exc:
            raise TableError(f"cannot write {path}: {exc}") from exc


def select_names(table: pa.Table, keep: Collection[str]) -> pa.Table:
    import pyarrow.compute as pc

    return table.filter(pc.is_in(table["name"], value_set=pa.array(list(keep), pa.string())))


def _concat(tables: list[pa.Table]) -> pa.Table:
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as exc:
        raise TableError(f"the table's parts do not fit together: {exc}") from exc


def _dedupe(table: pa.Table) -> pa.Table:
    """One row per folder name (the last written wins), in time order."""
    names = table["name"].to_pylist()
    last = {n: i for i, n in enumerate(names)}
    if len(last) != len(names):
        table = table.take(sorted(last.values()))
    return table.sort_by([("time", "ascending"), ("name", "ascending")])


def _utc(created_at: str) -> datetime:
    when = datetime.fromisoformat(created_at)
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def _gpu_util(summary: SnapshotSummary) -> float | None:
    means = [u.mean_pct for u in summary.gpu.utilization if u.mean_pct is not None]
    return sum(means) / len(means) if means else summary.gpu.util_gpu_pct_start

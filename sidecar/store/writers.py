"""Snapshot writers, registered by format name; a snapshot folder appears atomically.

Every file is written inside a hidden temporary folder next to the final one, fsynced, and the
folder is renamed into place with os.replace (sidecar/store/atomic.py): a reader (or a
`kill -9` mid-write) never sees a half-written snapshot (the node_exporter textfile pattern).
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from sidecar.errors import OutputError
from sidecar.store.atomic import write_folder
from sidecar.store.stacks import COLLAPSED, PARQUET, collapsed_text, stack_table
from sidecar.window.snapshot import Snapshot


class SnapshotWriter(Protocol):
    filename: str

    def write(self, snapshot: Snapshot, path: Path) -> None: ...


class SummaryJsonWriter:
    """summary.json: the typed summary (sidecar.records.summary) as JSON; `kind` is the store's
    (snapshot or baseline)."""

    filename = "summary.json"

    def __init__(self, kind: str | None = None) -> None:
        self.kind = kind

    def write(self, snapshot: Snapshot, path: Path) -> None:
        summary = to_jsonable(snapshot.summary(self.kind))
        path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")


class CollapsedWriter:
    """stacks.collapsed: `role;phase;root;...;leaf count` lines (sidecar/store/stacks.py)."""

    filename = COLLAPSED

    def write(self, snapshot: Snapshot, path: Path) -> None:
        path.write_text(collapsed_text(snapshot.stack_rows()))


class ParquetWriter:
    """stacks.parquet: one row per distinct stack, with host, deployment, snapshot, time and
    kind on every row (the columns: sidecar/store/stacks.py), so a folder of snapshots
    concatenates into one table (pandas, DuckDB) without joins."""

    filename = PARQUET

    def __init__(self, kind: str | None = None) -> None:
        self.kind = kind

    def write(self, snapshot: Snapshot, path: Path) -> None:
        # pyarrow alone (at the edge only, STYLE.md 1): importing pandas for this cost the
        # daemon's write child 0.45 s of CPU per snapshot.
        import pyarrow.parquet as pq

        pq.write_table(stack_table(snapshot.stack_rows(self.kind)), path)


WRITERS: dict[str, Callable[[], SnapshotWriter]] = {
    "summary": SummaryJsonWriter,
    "collapsed": CollapsedWriter,
    "parquet": ParquetWriter,
}


def write_snapshot(
    snapshot: Snapshot,
    out_dir: Path,
    formats: tuple[str, ...] = (),
    *,
    name: str | None = None,
    kind: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> Path:
    """Write all formats into OUT_DIR/<name or snapshot.name>/ atomically (a taken name gets
    `-1`, `-2`, ...); `kind` goes into summary.json; `extra`: more text files by name (an
    incident's dumps). Returns the final folder."""
    writers = [_writer(f, kind) for f in (formats or tuple(WRITERS))]
    final = free_name(out_dir, name or snapshot.name)

    def fill(folder: Path) -> None:
        for writer in writers:
            writer.write(snapshot, folder / writer.filename)
        for filename, text in (extra or {}).items():
            (folder / filename).write_text(text)

    try:
        write_folder(final, fill)
    except OSError as exc:
        raise OutputError(_explain_os_error(exc, out_dir)) from exc
    return final


def _writer(fmt: str, kind: str | None) -> SnapshotWriter:
    if fmt == "summary":
        return SummaryJsonWriter(kind)
    return ParquetWriter(kind) if fmt == "parquet" else WRITERS[fmt]()


def free_name(out_dir: Path, name: str) -> Path:
    """OUT_DIR/NAME, or the first of NAME-1, NAME-2, ... that is free (a link, even a broken
    one, takes its name)."""
    candidate, n = out_dir / name, 1
    while os.path.lexists(candidate):
        candidate, n = out_dir / f"{name}-{n}", n + 1
    return candidate


def _explain_os_error(exc: OSError, out_dir: Path) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left under {out_dir}: free disk space or point --out elsewhere"
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            f"cannot write under {out_dir} ({exc.strerror}): give the sidecar's user write "
            "access to it (systemd: ReadWritePaths=; Docker: mount a writable volume)"
        )
    return f"cannot write the snapshot under {out_dir}: {exc}"


def to_jsonable(value: Any) -> Any:
    """Records -> JSON-ready values (enums by value, dataclasses as dicts)."""
    if hasattr(value, "__dataclass_fields__"):
        return to_jsonable(asdict(value))
    if isinstance(value, Mapping):
        return {str(to_jsonable(k)): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [to_jsonable(v) for v in value]
    return getattr(value, "value", value)

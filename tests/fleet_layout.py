"""Recorded real snapshot folders (tests/fixtures/diff, flame) arranged as two hosts' output
folders, and uploaded in the uploader's layout: the fleet's tests (`aggregate`) share them."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from urllib.parse import quote

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.spec import AbstractFileSystem

from sidecar.store.summary_io import read_summary
from sidecar.store.trend_table import TrendTable, rows_to_table, summary_row, table_schema

FIXTURES = Path(__file__).resolve().parent / "fixtures"
STEADY = sorted((FIXTURES / "diff" / "steady-mixed").iterdir())
PREFILL = sorted((FIXTURES / "diff" / "prefill-heavy").iterdir())
MAX_SEQS_1 = sorted((FIXTURES / "diff" / "max-num-seqs-1").iterdir())
FLAME = FIXTURES / "flame" / "decode-heavy"  # with stacks.parquet (no fingerprint: schema 3 early)
OTHER_PORT = "tiny@8001"  # the prefill-heavy windows presented as a deployment of their own


def copy(src: Path, host_dir: Path, deployment: str | None = None, name: str | None = None) -> None:
    dst = host_dir / (name or src.name)
    shutil.copytree(src, dst)
    if deployment is not None:  # the same server's windows, presented as another deployment
        doc = json.loads((dst / "summary.json").read_text())
        doc["deployment"] = deployment
        (dst / "summary.json").write_text(json.dumps(doc))


def two_hosts(tmp: Path, prefill: bool = True, max_seqs: bool = False) -> list[Path]:
    """Two output folders: host-a holds the even steady windows (its table written part by
    part, as the store does), host-b the odd ones and, as a third deployment, the
    prefill-heavy windows (no table: the reader rebuilds it from the summaries)."""
    a, b = tmp / "out-a" / "host-a", tmp / "out-b" / "host-b"
    a.mkdir(parents=True)
    b.mkdir(parents=True)
    for i, src in enumerate(STEADY):
        copy(src, a if i % 2 == 0 else b)
    if prefill:
        for src in PREFILL:
            copy(src, b, OTHER_PORT)
    if max_seqs:
        for src in MAX_SEQS_1:
            copy(src, a, "tiny@9001")
    table = TrendTable(a)
    for folder in sorted(p for p in a.iterdir() if p.is_dir() and not p.name.startswith(".")):
        table.append(summary_row(read_summary(folder), name=folder.name))
    return [tmp / "out-a", tmp / "out-b"]


def upload(
    sources: list[Path],
    root: str,
    rows_for: str | None = None,
    fs: AbstractFileSystem | None = None,
) -> None:
    """The uploader's layout (sidecar/store/upload.py): Hive partitions
    host=<host>/deployment=<model@port>/date=<YYYY-MM-DD>/<snapshot>/ holding the folder's files
    and, for the host `rows_for`, its row of the table (row.parquet, written last)."""
    fs = fs or fsspec.filesystem("memory")
    for source in sources:
        for host_dir in source.iterdir():
            for folder in sorted(host_dir.iterdir()):
                if not folder.name.startswith("2026"):
                    continue
                s = read_summary(folder)
                prefix = (f"{root}/host={quote(host_dir.name, safe='@')}/"
                          f"deployment={quote(s.deployment or 'unknown', safe='@')}/"
                          f"date={s.created_at[:10]}/{folder.name}")  # fmt: skip
                for f in folder.iterdir():
                    fs.pipe(f"{prefix}/{f.name}", f.read_bytes())
                if host_dir.name == rows_for:
                    sink = pa.BufferOutputStream()
                    table = rows_to_table([summary_row(s, name=folder.name)])
                    pq.write_table(table.replace_schema_metadata(table_schema().metadata), sink)
                    fs.pipe(f"{prefix}/row.parquet", sink.getvalue().to_pybytes())


def sync(sources: list[Path], root: str, fs: AbstractFileSystem | None = None) -> None:
    """An output folder copied as it is (`aws s3 sync OUT s3://...`): <host>/<snapshot>/ and
    each host's compacted table, <host>/snapshots.parquet."""
    fs = fs or fsspec.filesystem("memory")
    for source in sources:
        for host_dir in source.iterdir():
            TrendTable(host_dir).compact()
            for path in sorted(host_dir.rglob("*")):
                if path.is_file() and ".table" not in path.parts:
                    fs.pipe(f"{root}/{path.relative_to(source)}", path.read_bytes())

"""Where `aggregate` reads from: output folders on this machine, or a prefix in object storage
read through fsspec, and the DuckDB connection that queries them.

A local SOURCE is the daemon's output.dir (a folder per host) or one host folder: each host's
table is read and repaired from its summaries when out of step (`trend_source.load_table`, the
same as `trend`, and saved for the next reader). A remote SOURCE (`s3://bucket/prefix`, or any
fsspec URL) is listed once: the uploader (sidecar/store/upload.py) writes Hive partitions
`host=<host>/deployment=<model@port>/date=<YYYY-MM-DD>/<snapshot>/` holding the folder's files
and its row of the table (`row.parquet`, put last); an output folder copied as it is holds
`<host>/<snapshot>/` and `<host>/snapshots.parquet`. Both are read; the rows still missing are
rebuilt from the summaries in memory (the bucket is the uploader's: nothing is written there).

DuckDB reads remote Parquet through the same fsspec filesystem, registered with the connection
(`register_filesystem`): its own httpfs extension would be downloaded from the internet on
first use, so extension autoloading is switched off and nothing is fetched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote

import duckdb
import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.spec import AbstractFileSystem

from sidecar.errors import ConfigError, InputError
from sidecar.records.summary import SnapshotSummary
from sidecar.store.layout import (
    PARTS_DIR,
    SNAPSHOT_NAME,
    SUMMARY_NAME,
    TABLE_NAME,
    OutputTree,
    indexed_host,
    snapshot_names,
)
from sidecar.store.stacks import PARQUET
from sidecar.store.summary_io import parse_summary, read_summary
from sidecar.store.trend_table import TABLE_VERSION, rows_to_table, summary_row
from sidecar.trend.source import load_table

Note = Callable[[str], None]
ROW_NAME = (
    "row.parquet"  # the uploader's copy of a folder's row, put last (sidecar/store/upload.py)
)
SOURCE_HELP = (
    "give the daemon's output.dir, one host folder in it, or s3://bucket/prefix (what the "
    "uploader writes to)"
)


@dataclass(frozen=True, slots=True)
class Folder:
    """One snapshot folder: where its summary and stacks are (a local path or a URL)."""

    host: str
    name: str
    summary: str
    stacks: str | None
    row: str | None = None  # the uploader's row.parquet: the folder's row of the table


@dataclass
class Fleet:
    """Everything the sources hold: one table row per snapshot folder (`host` is the folder's
    host: the host folder's name, or the `host=` prefix), and where each folder's files are."""

    table: pa.Table
    folders: dict[tuple[str, str], Folder]
    filesystems: dict[str, AbstractFileSystem] = field(default_factory=dict)  # remote, by protocol

    def summaries(
        self, keys: Iterable[tuple[str, str]], note: Note
    ) -> dict[tuple[str, str], SnapshotSummary]:
        """The summaries of these folders (remote ones read 16 at a time); an unreadable one
        is skipped with a warning."""
        wanted = [self.folders[k] for k in keys if k in self.folders]
        with ThreadPoolExecutor(max_workers=16) as pool:
            read = list(pool.map(self._summary, wanted))
        out = {}
        for folder, got in zip(wanted, read, strict=True):
            if isinstance(got, str):
                note(f"warning: skipped {folder.summary}: {got}")
            else:
                out[(folder.host, folder.name)] = got
        return out

    def _summary(self, folder: Folder) -> SnapshotSummary | str:
        try:
            protocol, sep, _ = folder.summary.partition("://")
            if not sep:
                return read_summary(Path(folder.summary))
            with self.filesystems[protocol].open(folder.summary, "rb") as handle:
                return parse_summary(json.loads(handle.read()), folder.summary)
        except InputError as exc:
            return str(exc)
        except Exception as exc:  # a local OSError, or the store's driver's errors
            return f"cannot read it ({type(exc).__name__}: {exc})"

    def connect(self) -> duckdb.DuckDBPyConnection:
        """A DuckDB connection with the table as `snapshots` and the remote filesystems
        registered; no extension is installed or loaded behind our back (no downloads)."""
        con = duckdb.connect()
        con.execute("SET autoinstall_known_extensions = false")
        con.execute("SET autoload_known_extensions = false")
        for fs in self.filesystems.values():
            con.register_filesystem(fs)
        con.register("snapshots", self.table)
        return con


def load_fleet(sources: Sequence[str], note: Note) -> Fleet:
    if not sources:
        raise ConfigError(f"aggregate needs a SOURCE: {SOURCE_HELP}")
    tables, folders, filesystems = [], {}, {}
    for source in sources:
        if "://" in source and not source.startswith("file://"):
            table, found, fs = _remote(source, note)
            filesystems[_protocol(fs)] = fs
        else:
            table, found = _local(Path(source.removeprefix("file://")), note)
        tables.append(table)
        for f in found:
            if (f.host, f.name) in folders:
                note(f"warning: {f.host}/{f.name} is in two sources; the first is read")
                continue
            folders[(f.host, f.name)] = f
    table = pa.concat_tables(tables, promote_options="permissive")
    names = pa.array([f"{h}/{n}" for h, n in folders], pa.string())
    keys = pc.binary_join_element_wise(table["host"], table["name"], "/")
    return Fleet(table.filter(pc.is_in(keys, value_set=names)), folders, filesystems)


# ---------------------------------------------------------------------------------- local


def local_host_folders(source: Path) -> list[tuple[str, Path]]:
    """(host, folder with snapshot folders) under SOURCE: SOURCE itself when it is a host
    folder, else each host folder under it. A daemon with `targets:` writes one folder per
    deployment, OUT/<host>/<deployment>/; its index.json names the host."""
    if not source.exists():
        raise InputError(f"{source} does not exist: {SOURCE_HELP}")
    folders = OutputTree(source).host_folders(None)
    return [(indexed_host(folder) or folder.name, folder) for folder in folders]


def _local(source: Path, note: Note) -> tuple[pa.Table, list[Folder]]:
    tables, found = [], []
    for host, folder in local_host_folders(source):
        # A fleet daemon's deployment folder (its index.json names the host): its snapshots
        # are named `<deployment>/<UTC ts>`, as another deployment's may share the second.
        where = folder.name if indexed_host(folder) else ""
        table = load_table(folder, note)
        tables.append(_with_host(_qualified(table, where), host))
        for name in sorted(snapshot_names(folder)):
            stacks = folder / name / PARQUET
            found.append(Folder(host, _name(where, name), str(folder / name / SUMMARY_NAME),
                                str(stacks) if stacks.is_file() else None))  # fmt: skip
    return pa.concat_tables(tables, promote_options="permissive"), found


def _name(where: str, name: str) -> str:
    """A snapshot's name within its host: `<deployment>/<name>` where the host has several
    deployments' folders (two of them may write in the same second), else its folder name."""
    return f"{where}/{name}" if where else name


def _qualified(table: pa.Table, where: str) -> pa.Table:
    """TABLE with its names qualified by WHERE (`_name`)."""
    if not where or not table.num_rows:
        return table
    names = pa.array([_name(where, n) for n in table["name"].to_pylist()], pa.string())
    return table.set_column(table.schema.get_field_index("name"), "name", names)


def _with_host(table: pa.Table, host: str) -> pa.Table:
    column = pa.array([host] * table.num_rows, pa.string())
    return table.set_column(table.schema.get_field_index("host"), "host", column)


# ---------------------------------------------------------------------------------- remote


# The object stores aggregate reads (s3fs; `memory://` for tests and notebooks). Any other
# scheme fsspec knows (ftp, http, ...) ended in an internal error (issue 26, item 19).
REMOTE_SCHEMES = ("s3", "s3a", "memory")


def remote_filesystem(source: str) -> tuple[AbstractFileSystem, str]:
    scheme = source.partition("://")[0].lower()
    if scheme not in REMOTE_SCHEMES:
        supported = ", ".join(f"{s}://" for s in REMOTE_SCHEMES)
        raise ConfigError(f"cannot read {source}: {scheme}:// is not supported ({supported} are); "
                          f"{SOURCE_HELP}")  # fmt: skip
    try:
        # A fresh instance: fsspec caches them, with the endpoint and credentials of their day.
        fs, root = fsspec.core.url_to_fs(source, skip_instance_cache=True)
    except ImportError as exc:
        raise ConfigError(
            f"reading {source} needs the fsspec driver for it ({exc.name or exc}): "
            "`pip install 'vllm-sidecar[s3]'` for s3:// (it installs s3fs)"
        ) from None
    except ValueError as exc:
        raise ConfigError(f"cannot read {source}: {exc}: {SOURCE_HELP}") from None
    except Exception as exc:  # a driver that connects while it is made (name lookup, refusal)
        raise InputError(
            f"cannot reach {source} ({type(exc).__name__}: {exc}): {SOURCE_HELP}"
        ) from None
    return fs, str(root).rstrip("/")


def _protocol(fs: AbstractFileSystem) -> str:
    protocol = fs.protocol
    return protocol if isinstance(protocol, str) else protocol[0]


def _remote(source: str, note: Note) -> tuple[pa.Table, list[Folder], AbstractFileSystem]:
    fs, root = remote_filesystem(source)
    try:
        fs.invalidate_cache()  # fsspec keeps instances and listings: list the store as it is now
        paths = fs.find(root)
    except Exception as exc:  # the driver's own errors (botocore's, aiohttp's): the store's answer
        raise InputError(
            f"cannot list {source} ({type(exc).__name__}: {exc}): check the bucket, the prefix, "
            "the endpoint and the credentials (AWS_PROFILE, AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL)"
        ) from None
    # (host, where, folder) -> file name -> URL; `where` tells a host's deployments apart
    files: dict[tuple[str, str, str], dict[str, str]] = {}
    tables: dict[tuple[str, str], list[str]] = {}  # (host, where) -> its table's files
    for path in paths:
        rel = path[len(root) :].lstrip("/").split("/") if path.startswith(root) else []
        if not rel:
            continue
        host = _host_of(rel)
        part = len(rel) > 1 and rel[-2] == PARTS_DIR and rel[-1].endswith(".parquet")
        if rel[-1] == TABLE_NAME or part:
            where = _where_of(rel[: -2 if part else -1])
            tables.setdefault((host, where), []).append(fs.unstrip_protocol(path))
        elif len(rel) > 1 and SNAPSHOT_NAME.match(rel[-2]):  # remote paths: the name alone
            key = (host, _where_of(rel[:-2]), rel[-2])
            files.setdefault(key, {})[rel[-1]] = fs.unstrip_protocol(path)
    found = []
    for (host, where, n), got in sorted(files.items()):
        if SUMMARY_NAME in got:
            folder = Folder(host, _name(where, n), got[SUMMARY_NAME], got.get(PARQUET),
                            got.get(ROW_NAME))  # fmt: skip
            found.append((where, folder))
    if not found:
        raise InputError(f"no snapshot folders (*/summary.json) under {source}: {SOURCE_HELP}")
    parts = []
    for h, w in sorted({(f.host, where) for where, f in found}):
        members = [f for where, f in found if (f.host, where) == (h, w)]
        parts.append(_remote_table(fs, h, w, tables.get((h, w), []), members, note))
    return pa.concat_tables(parts, promote_options="permissive"), [f for _, f in found], fs


def _where_of(dirs: list[str]) -> str:
    """Which of a host's deployments the folders DIRS lead to: the `deployment=` partition
    (the uploader's layout) or the folder under the host's (a synced fleet output folder),
    never the `date=` partition; "" for a host with one output folder."""
    start = next((i + 1 for i, d in enumerate(dirs) if d.startswith("host=")), 1)
    kept = [unquote(d.removeprefix("deployment=")) for d in dirs[start:]
            if not d.startswith("date=")]  # fmt: skip
    return "/".join(kept)


def _host_of(rel: list[str]) -> str:
    """The `host=` partition (percent-decoded, as Hive encodes it), else the first folder."""
    for part in rel:
        if part.startswith("host="):
            return unquote(part.removeprefix("host="))
    return rel[0]


def _remote_table(
    fs: AbstractFileSystem,
    host: str,
    where: str,
    urls: list[str],
    folders: list[Folder],
    note: Note,
) -> pa.Table:
    """The rows of a host's folders under WHERE: from its table files (a synced output
    folder), from each folder's `row.parquet` (the uploader's), and the rows still missing from
    the summaries; their names qualified by WHERE (`_name`), as the folders' are."""
    ordered = sorted(urls, key=lambda u: (not u.endswith("/" + TABLE_NAME), u))
    read = [_qualified(t, where) for t in (_read_rows(fs, url, note) for url in ordered)
            if t is not None]  # fmt: skip
    have = _latest(pa.concat_tables(read, promote_options="permissive")) if read else None
    names = set(have["name"].to_pylist()) if have is not None else set()
    with_row = [f for f in folders if f.name not in names and f.row]
    with ThreadPoolExecutor(max_workers=16) as pool:
        rows_read = [_qualified(t, where)
                     for t in pool.map(lambda f: _read_rows(fs, f.row or "", note), with_row)
                     if t is not None]  # fmt: skip
    if rows_read:
        more = pa.concat_tables(rows_read, promote_options="permissive")
        have = (
            more if have is None else pa.concat_tables([have, more], promote_options="permissive")
        )
        names |= set(more["name"].to_pylist())
    missing = [f for f in folders if f.name not in names]
    rows = []
    fleet = Fleet(rows_to_table([]), {(f.host, f.name): f for f in missing}, {_protocol(fs): fs})
    got = fleet.summaries(((f.host, f.name) for f in missing), note)
    for f in missing:
        if (f.host, f.name) in got:
            rows.append(summary_row(got[(f.host, f.name)], name=f.name))
    if rows:
        note(f"{_name(host, where)}: {len(rows)} rows rebuilt from their summaries (not "
             "saved: the bucket is the uploader's)")  # fmt: skip
    new = rows_to_table(rows)
    table = new if have is None else pa.concat_tables([have, new], promote_options="permissive")
    return _with_host(table, host)


def _read_rows(fs: AbstractFileSystem, url: str, note: Note) -> pa.Table | None:
    """A table file's rows, or None (with a warning) when it is garbled, unreadable or of
    another table version: its folders' rows are then rebuilt from their summaries."""
    try:
        with fs.open(url, "rb") as handle:
            table = pq.read_table(handle)
    except Exception as exc:  # garbled, or the store's driver's errors
        note(f"warning: skipped {url} ({type(exc).__name__}: {exc})")
        return None
    version = (table.schema.metadata or {}).get(b"vllm_sidecar_table", b"").decode()
    if version != str(TABLE_VERSION):
        note(f"warning: {url} is of table version {version!r}: its rows are rebuilt")
        return None
    return table


def _latest(table: pa.Table) -> pa.Table:
    """One row per folder name, the last read winning (parts after the main file)."""
    last = {n: i for i, n in enumerate(table["name"].to_pylist())}
    return table.take(sorted(last.values()))

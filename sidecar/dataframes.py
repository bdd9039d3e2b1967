"""pandas at the edge of the Python interface: tidy rows -> DataFrames with fixed dtypes.

Imported only when a DataFrame is asked for (`import sidecar` does not load pandas).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pandas as pd

from sidecar.errors import InputError

DataFrame = pd.DataFrame  # for the interface's annotations, without importing pandas there

# Nullable dtypes: a missing figure stays missing (<NA>), never 0, and a pid stays an integer.
_DTYPES = {
    "pid": "Int64", "samples": "Int64", "used_bytes": "Int64", "total_bytes": "Int64",
    "share_of_total": "Float64", "share_of_role": "Float64",
}  # fmt: skip


def frame(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    """Rows -> a DataFrame with `columns` in order (an empty one keeps them)."""
    df = pd.DataFrame(list(rows), columns=list(columns))
    dtypes = {c: _DTYPES.get(c, "string") for c in columns}
    return df.astype(dtypes)


def store_frame(
    table: Any, start: datetime | None, end: datetime | None, kind: str, host_dir: Path
) -> pd.DataFrame:
    """The trend table (a pyarrow Table, one row per snapshot folder) as a DataFrame: rows in
    [start, end) of `kind`, in time order, with each folder's `path` for `sidecar.load`."""
    df = table.to_pandas()
    keep = pd.Series(True, index=df.index)
    if start is not None:
        keep &= df["time"] >= pd.Timestamp(start)
    if end is not None:
        keep &= df["time"] < pd.Timestamp(end)
    if kind != "all":
        keep &= df["kind"] == kind
    df = df[keep].sort_values(["time", "name"]).reset_index(drop=True)
    df.insert(1, "path", [str(host_dir / name) for name in df["name"]])
    return df


def read_stacks(path: Path) -> pd.DataFrame:
    if not path.is_file():
        raise InputError(f"no {path.name} in {path.parent}: this snapshot was kept without its "
                         "stacks (its summary reads on its own)")  # fmt: skip
    try:
        return pd.read_parquet(path)
    except (OSError, ValueError) as exc:  # not Parquet (pyarrow's errors are both)
        raise InputError(f"cannot read {path}: {exc}: point at a snapshot folder written by "
                         "`vllm-sidecar snapshot` or `run`") from None  # fmt: skip

"""A snapshot's stacks files, the one module that knows them: their names, the columns of
stacks.parquet and their types, and the `role;phase;frames weight` lines of its fallback
stacks.collapsed; the writers (sidecar/store/writers.py) write them from these, the readers here
read them back. stacks.parquet is read with pyarrow, only the columns a reader needs, so
snapshots of every schema read alike (schema 1 and 2 lack host, deployment, snapshot, time and
kind); and stack files of every format `classify` reads.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.errors import InputError
from sidecar.parsers import parse_file, parse_raw
from sidecar.records import Role, StackSample

if TYPE_CHECKING:
    import pyarrow as pa


@dataclass(frozen=True, slots=True)
class StackRow:
    """One distinct stack of one snapshot: its role, phase, frames root first, samples."""

    role: str
    phase: str
    frames: tuple[str, ...]
    weight: int


PARQUET = "stacks.parquet"
COLLAPSED = "stacks.collapsed"

# stacks.parquet, one row per distinct stack (Snapshot.stack_rows). Every row carries where and
# when it was taken, so the stacks.parquet of many snapshots (hosts, deployments) concatenate
# into one table without joins.
STACK_COLUMNS = (
    "host", "deployment", "snapshot", "time", "kind",
    "pid", "role", "thread_id", "thread_name", "phase", "stage",
    "weight", "frame", "rule", "stack",
)  # fmt: skip
STACK_TYPES = {"pid": "int64", "weight": "int64"}  # the rest are strings
COLUMNS = ("role", "phase", "weight", "stack")  # what the readers take: in every schema


_RETAKE = "take the snapshot again (`vllm-sidecar snapshot`)"


def read_stack_rows(folder: Path) -> tuple[StackRow, ...]:
    """The stacks of the snapshot in FOLDER; InputError naming the fix when they cannot be read."""
    if not folder.is_dir():
        raise InputError(
            f"{folder} is not a folder: point at a snapshot folder (one holding {PARQUET}), "
            "as written by `vllm-sidecar snapshot` or `run`"
        )
    if (folder / PARQUET).exists():
        return _read_parquet(folder / PARQUET)
    if (folder / COLLAPSED).exists():
        return read_collapsed((folder / COLLAPSED).read_text(errors="replace"), folder / COLLAPSED)
    raise InputError(
        f"no {PARQUET} or {COLLAPSED} in {folder}: point at a snapshot folder written by "
        "`vllm-sidecar snapshot` or `run` (OUT/<host>/<UTC time>/)"
    )


def _read_parquet(path: Path) -> tuple[StackRow, ...]:
    import pyarrow.parquet as pq  # at the edge only (STYLE.md 1)

    try:
        schema = pq.read_schema(path)
        missing = [c for c in COLUMNS if c not in schema.names]
        if missing:
            raise InputError(
                f"{path} lacks the column(s) {', '.join(missing)}: it is not a vllm-sidecar "
                f"stacks file; {_RETAKE}"
            )
        table = pq.read_table(path, columns=list(COLUMNS))
    except InputError:
        raise
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError, ...: all mean unreadable
        raise InputError(
            f"cannot read {path} ({type(exc).__name__}: {exc}): {_RETAKE}, or delete it to "
            f"draw from {COLLAPSED}"
        ) from exc
    data = table.to_pydict()
    return tuple(
        _row(role, phase, weight, stack, path, i)
        for i, (role, phase, weight, stack) in enumerate(
            zip(*(data[c] for c in COLUMNS), strict=True)
        )
    )


def _row(
    role: object, phase: object, weight: object, stack: object, path: Path, i: int
) -> StackRow:
    if not isinstance(weight, int) or weight < 0 or not isinstance(stack, str | None):
        raise InputError(
            f"{path}, row {i}: weight {weight!r} / stack {stack!r} unreadable; {_RETAKE}"
        )
    frames = tuple(stack.split(";")) if stack else ()
    return StackRow(str(role or "other"), str(phase or "other"), frames, weight)


def collapsed_text(rows: Iterable[Mapping[str, Any]]) -> str:
    """stacks.collapsed from stack rows (STACK_COLUMNS): `role;phase;root;...;leaf weight`
    lines, as flamegraph.pl, speedscope and inferno read them; the two leading pseudo-frames
    group a flame graph by role and phase."""
    lines = [f"{row['role']};{row['phase']};{row['stack']} {row['weight']}" for row in rows]
    return "\n".join(lines) + ("\n" if lines else "")


def stack_table(rows: Sequence[Mapping[str, Any]]) -> pa.Table:
    """stacks.parquet's table from stack rows: STACK_COLUMNS in order, typed by STACK_TYPES.
    pyarrow alone: the types are those pandas wrote (strings, int64 pid and weight); a column
    of None alone is a string column here, pandas' was of null type: every reader concatenates
    with permissive promotion."""
    import pyarrow as pa  # at the edge only (STYLE.md 1)

    return pa.table({c: pa.array([r.get(c) for r in rows], type=STACK_TYPES.get(c, "string"))
                     for c in STACK_COLUMNS})  # fmt: skip


def read_collapsed(text: str, source: Path | str = COLLAPSED) -> tuple[StackRow, ...]:
    """`role;phase;frame;...;frame weight` lines, the frames root first."""
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        head, _, count = line.rpartition(" ")
        parts = head.split(";", 2)
        if not count.isdigit() or len(parts) < 2:
            raise InputError(
                f"{source}, line {n}: not `role;phase;frames count` ({line[:80]!r}); {_RETAKE}"
            )
        frames = tuple(parts[2].split(";")) if len(parts) > 2 and parts[2] else ()
        rows.append(StackRow(parts[0], parts[1], frames, int(count)))
    return tuple(rows)


@dataclass(frozen=True, slots=True)
class StackInput:
    """Stacks read from a file or a snapshot folder, with the roles the snapshot recorded."""

    stacks: tuple[StackSample, ...]
    roles: tuple[Role | None, ...]
    warnings: tuple[str, ...]


def read_input(path: Path) -> StackInput:
    """A stack file (any format `classify` reads) or a snapshot folder (its stacks.parquet, else
    stacks.collapsed: frames root first, as py-spy's raw format writes them)."""
    if not path.is_dir():
        parsed = parse_file(path)
        return StackInput(
            parsed.stacks,
            (None,) * len(parsed.stacks),
            tuple(f"{path}: {w}" for w in parsed.warnings),
        )
    rows = read_stack_rows(path)
    stacks: list[StackSample] = []
    roles: list[Role | None] = []
    for row in rows:
        if not row.frames or not row.weight:
            continue
        parsed = parse_raw(f"{';'.join(row.frames)} {row.weight}", str(path))
        stacks.extend(parsed.stacks)
        role = Role(row.role) if row.role in Role._value2member_map_ else None
        roles.extend([role] * len(parsed.stacks))
    return StackInput(tuple(stacks), tuple(roles), ())

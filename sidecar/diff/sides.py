"""`vllm-sidecar diff`: which windows make each side (the verdict on them: sidecar/diff/text.py).

A side is a snapshot folder, or a folder of them (a host's folder or the output root) narrowed
to a time range: `PATH@SINCE..UNTIL`, or `--since/--until` for every folder side without one.
`--baseline OUT` compares the latest baseline with the latest snapshot under OUT.

The deployment's history (sidecar/analyze/history.py) is read from the folders that hold the
compared snapshot folders: their other snapshots and baselines, the nearest in time first.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sidecar.analyze.compare import Side
from sidecar.analyze.history import History, history_for
from sidecar.config import units
from sidecar.errors import ConfigError, InputError
from sidecar.records.summary import SnapshotSummary
from sidecar.store.layout import (
    OutputTree,
    SnapshotFolder,
    SnapshotKind,
    snapshot_folder,
    snapshot_names,
)
from sidecar.store.summary_io import SUMMARY_NAME, read_summary

log = logging.getLogger("vllm_sidecar")
# The history windows read at most, the nearest in time to the compared ones: a deployment
# keeps thousands, and the spread of the nearest few dozen is the one that matters.
MAX_HISTORY = 100


# ---------------------------------------------------------------------------------- sides


@dataclass(frozen=True, slots=True)
class Range:
    since: float | None = None  # Unix seconds, inclusive
    until: float | None = None  # exclusive

    def holds(self, t: float) -> bool:
        return (self.since is None or t >= self.since) and (self.until is None or t < self.until)

    def words(self) -> str:
        def w(t: float | None) -> str:
            return "…" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")

        if self.since is None and self.until is None:
            return "all of them"
        return f"{w(self.since)} to {w(self.until)}"


def parse_time(text: str, now: float) -> float:
    """An ISO date/time (UTC when it names no zone), or a duration ago: `2h`, `90m`, `7d`."""
    try:
        return units.moment(text, now)
    except units.Unfit as exc:
        raise ConfigError(f"the time {text!r} {exc}") from None


def parse_range(text: str, now: float) -> Range:
    since, dots, until = text.partition("..")
    if not dots:
        raise ConfigError(
            f"cannot read the range {text!r}: write SINCE..UNTIL (either may be empty)"
        )
    return Range(
        parse_time(since, now) if since else None, parse_time(until, now) if until else None
    )


def side_from(spec: str, default: Range, now: float, label: str) -> Side:
    """A snapshot folder, or the snapshots of a folder within the spec's or the default range."""
    path_text, at, range_text = spec.rpartition("@") if "@" in spec else (spec, "", "")
    path = Path(path_text)
    if not path.exists():
        raise InputError(
            f"{label}: {path} does not exist: name a snapshot folder or an output folder"
        )
    if (path / SUMMARY_NAME).is_file() and not at:
        return Side(f"{label}: {path.name}", (read_summary(path),), (path,))
    window = parse_range(range_text, now) if at else default
    inside = [f for f in OutputTree(path).snapshots() if window.holds(f.started)]
    # An hourly baseline holds its hour's snapshots' samples again: with both, the baselines
    # are left out, or each sample would count twice (as `trend`'s sides do).
    regular = [f for f in inside if f.kind is not SnapshotKind.BASELINE]
    found = [f.path for f in (regular or inside)]
    left_out = len(inside) - len(found)
    if not found:
        raise InputError(
            f"{label}: no snapshot folders under {path} from {window.words()}: widen the range "
            "(--since/--until or PATH@SINCE..UNTIL), or name a snapshot folder"
        )
    note = f" ({left_out} baselines left out: they repeat these windows)" if left_out else ""
    return Side(f"{label}: {len(found)} windows under {path}, {window.words()}{note}",
                _read_all(found), tuple(found))  # fmt: skip


def baseline_sides(root: Path) -> tuple[Side, Side]:
    """The latest baseline against the latest regular snapshot under ROOT."""
    tree = OutputTree(root)
    baselines = tree.snapshots(SnapshotKind.BASELINE)
    snapshots = tree.snapshots(SnapshotKind.SNAPSHOT)
    if not baselines or not snapshots:
        raise InputError(
            f"--baseline needs a baseline and a snapshot under {root} (found {len(baselines)} "
            f"baselines, {len(snapshots)} snapshots): let `vllm-sidecar run` write both first"
        )
    a, b = baselines[-1], snapshots[-1]
    return (Side(f"A: baseline {a.name}", (read_summary(a.path),), (a.path,)),
            Side(f"B: snapshot {b.name}", (read_summary(b.path),), (b.path,)))  # fmt: skip


def _read_all(folders: Iterable[Path]) -> tuple[SnapshotSummary, ...]:
    out = []
    for folder in folders:
        try:
            out.append(read_summary(folder))
        except InputError as exc:  # one garbled window must not hide the rest
            log.warning("skipped %s: %s", folder, exc)
    if not out:
        raise InputError("none of the snapshot folders could be read (see the warnings above)")
    return tuple(out)


def history_of(
    a: Side,
    b: Side,
    read: Callable[[Path], SnapshotSummary] = read_summary,
    limit: int = MAX_HISTORY,
) -> History | None:
    """The deployment's history for A against B: the other snapshot folders (snapshots and
    baselines) in the folders holding the sides' snapshot folders, the `limit` nearest in time
    to the compared windows, read and then chosen by sidecar.analyze.history.history_for. A
    side given in memory (no folders) has none to offer. None when each side has two windows
    or more: their own spread tests them, and no history is read."""
    if len(a.summaries) >= 2 and len(b.summaries) >= 2:
        return None
    compared = {p.resolve() for side in (a, b) for p in side.folders}
    if not compared:
        return History((), 0, 0, 0)
    found: list[SnapshotFolder] = []
    for home in sorted({p.parent for p in compared}):
        try:
            names = snapshot_names(home)
        except OSError as exc:
            log.warning("no history read from %s: %s", home, exc)
            continue
        folders = (snapshot_folder(home / n) for n in sorted(names))
        found += [f for f in folders if f is not None and f.path not in compared]
    starts = [f.started for p in compared if (f := snapshot_folder(p)) is not None]
    centre = sum(starts) / len(starts) if starts else 0.0
    nearest = sorted(found, key=lambda f: (abs(f.started - centre), f.name))[:limit]
    return history_for(a, b, _read_history(nearest, read))


def _read_history(
    folders: Iterable[SnapshotFolder], read: Callable[[Path], SnapshotSummary]
) -> list[SnapshotSummary]:
    out = []
    for f in folders:
        try:
            out.append(read(f.path))
        except (InputError, OSError) as exc:  # an incomplete or garbled window is no history
            log.debug("history: skipped %s: %s", f.path, exc)
    return out


def now() -> float:
    return time.time()

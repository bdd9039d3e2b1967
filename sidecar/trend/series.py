"""`vllm-sidecar trend`: phase shares per role and vLLM's serving figures over many snapshots,
with the points where a series changed level, baselines and fingerprint changes.

table rows (sidecar.trend.source) -> the time range and kind asked for -> the series -> points
(the rows themselves, or bucket medians when there are more than MAX_POINTS) -> candidate change
points per series (sidecar.trend.changepoints) -> those diff's test confirms on the windows
either side (sidecar.trend.levels) -> a text table, JSON, or a plot (sidecar.trend.plot).
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd

from sidecar.errors import ConfigError, InputError
from sidecar.store.trend_table import CUSTOM_PREFIX, SERVING, SHARE_PREFIXES
from sidecar.tables import table
from sidecar.trend.changepoints import change_points
from sidecar.trend.levels import (
    MAX_WINDOWS,
    NO_TESTS,
    LevelTest,
    LevelTests,
    Multiplicity,
    Reader,
    Verdict,
    Window,
    chance,
    confirm,
    diff_words,
    test_json,
)

MAX_POINTS = 800  # beyond this many rows, change points run on bucket medians
TABLE_ROWS = 32  # the text table's buckets, at most
BUCKETS_S = (300, 900, 3600, 3 * 3600, 6 * 3600, 12 * 3600, 86400, 7 * 86400)
ROLES = ("engine_core", "worker", "api_server")
TOP_PHASES = 3  # per role, by mean share over the range
DEFAULT_SERVING = ("generation_tokens_per_s", "prompt_tokens_per_s", "ttft_p95_s", "itl_p95_s")
KINDS = ("all", "snapshot", "baseline")
# Readable fingerprint columns, as a change's label names them ("vLLM 0.31.0 -> 0.32.0").
FINGERPRINT_FIELDS = {"vllm": "vLLM", "model": "model", "torch": "torch",
                      "attention_backend": "attention", "gpus": "GPUs",
                      "serving_flags": "flags"}  # fmt: skip


@dataclass(frozen=True, slots=True)
class TrendOptions:
    start: datetime | None = None  # UTC; None: from the first row
    end: datetime | None = None
    kind: str = "all"
    series: tuple[str, ...] = ()  # column names or patterns (share.worker.*); () the defaults


@dataclass(frozen=True, slots=True)
class LevelChange:
    time: pd.Timestamp
    before: float  # the median of the points of the segment before
    after: float  # ... and of the segment from here
    test: LevelTest | None = None  # diff's verdict on the windows either side


@dataclass(frozen=True, slots=True)
class SeriesTrend:
    name: str
    n: int
    first: float
    last: float
    median: float
    changes: tuple[LevelChange, ...]  # the candidates diff confirms
    candidates: tuple[LevelChange, ...] = ()  # every candidate PELT proposed, with its test


@dataclass(frozen=True, slots=True)
class FingerprintChange:
    time: pd.Timestamp
    before: str
    after: str
    label: str


@dataclass(frozen=True)
class Trend:
    host: str
    rows: pd.DataFrame  # the rows in range, time-indexed: the series, kind and fingerprint
    points: pd.DataFrame  # what change points ran on: the rows or bucket medians
    bucket_s: int | None  # the points' bucket; None: the rows themselves
    series: tuple[SeriesTrend, ...]
    baselines: tuple[pd.Timestamp, ...]
    fingerprint_changes: tuple[FingerprintChange, ...]
    multiplicity: Multiplicity = NO_TESTS  # the level changes' tests


def compute_trend(
    frame: pd.DataFrame, options: TrendOptions, host: str, windows: Reader | None = None
) -> Trend:
    """`windows` reads a window's summary by its folder name (sidecar.trend.source): diff's
    test of each candidate change runs on them. None: no candidate is tested, none reported."""
    rows = _in_range(frame, options)
    rows = _roles_filled(rows.set_index("time"))
    names = select_series(rows, options.series)
    bucket = None if len(rows) <= MAX_POINTS else _bucket(rows.index, MAX_POINTS)
    points = rows[names] if bucket is None else _medians(rows[names], bucket)
    tests = LevelTests(windows)
    return Trend(
        host=host,
        rows=rows,
        points=points,
        bucket_s=bucket,
        series=tuple(_series(points[name], rows, bucket is not None, tests) for name in names),
        baselines=tuple(rows.index[rows["kind"] == "baseline"]),
        fingerprint_changes=fingerprint_changes(rows),
        multiplicity=tests.multiplicity(),
    )


def select_series(rows: pd.DataFrame, patterns: Sequence[str]) -> list[str]:
    """The numeric columns `patterns` name (exact or fnmatch), or the defaults: each role's
    top phases by mean share, then throughput and tail latency. Empty columns are left out."""
    numbers = rows.select_dtypes("number")
    numeric = list(numbers.columns)
    present = numbers.notna().any()
    filled = [c for c in numeric if present[c]]
    if not patterns:
        top = [c for role in ROLES for c in _top_phases(rows, filled, role)]
        custom = [c for c in filled if c.startswith(CUSTOM_PREFIX)]
        return top + [c for c in DEFAULT_SERVING if c in filled] + custom
    chosen: list[str] = []
    for pattern in patterns:
        matched = [c for c in numeric if fnmatch.fnmatchcase(c, pattern)]
        if not matched:
            raise ConfigError(
                f"--series {pattern!r} names no column: give one of {', '.join(SERVING)}, "
                "share.<role>.<phase>, main.<role>.<phase> or custom.<name> (patterns like "
                "share.worker.* work)"
            )
        if len(matched) > 1:  # a pattern: leave out phases never seen (0 throughout)
            matched = [c for c in matched if (numbers[c].fillna(0.0) != 0.0).any()]
        chosen += [c for c in matched if c in filled and c not in chosen]
    return chosen


def fingerprint_changes(rows: pd.DataFrame) -> tuple[FingerprintChange, ...]:
    """Each row whose fingerprint differs from the last known one. An unknown fingerprint ("":
    a summary of schema 1 or 2, or one that could not be read) changes nothing, and neither
    does a window that ran no attention (its backend unknown): the backend is carried over."""
    known = rows[rows["fingerprint"].fillna("") != ""]
    read = known.get("attention_backend", pd.Series(None, index=known.index, dtype=object))
    backend = read.astype(object).where(read.notna()).ffill().fillna("?").astype(str)
    keys = (known["fingerprint"].astype(str) + "|" + backend).to_numpy()
    at = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    filled = known.assign(attention_backend=backend)
    return tuple(
        FingerprintChange(known.index[i], str(known["fingerprint"].iloc[i - 1]),
                          str(known["fingerprint"].iloc[i]),
                          _change_label(filled.iloc[i - 1], filled.iloc[i]))
        for i in at
    )  # fmt: skip


def render_text(trend: Trend) -> str:
    rows, lines = trend.rows, []
    baselines = len(trend.baselines)
    lines.append(
        f"trend of {trend.host}: {len(rows)} snapshots ({baselines} baselines) from "
        f"{_when(rows.index[0])} to {_when(rows.index[-1])}; change points on "
        + ("every snapshot" if trend.bucket_s is None else f"{_span(trend.bucket_s)} medians")
    )
    for change in trend.fingerprint_changes:
        lines.append(f"fingerprint changed at {_when(change.time)}: {change.label}")
    if not trend.series:
        return "\n".join([*lines, "no figures in this range"])
    lines += ["", table(["series", "n", "first", "last", "median", "level changes"],
                        [_summary_cells(s) for s in trend.series])]  # fmt: skip
    lines += _level_words(trend)
    bucket = _bucket(rows.index, TABLE_ROWS)
    medians = _medians(rows[[s.name for s in trend.series]], bucket)
    lines += ["", f"{_span(bucket)} medians:"]
    headers = ["time (UTC)", *(short_name(s.name) for s in trend.series)]
    body = [[_when(t), *(_fmt(s.name, r[s.name]) for s in trend.series)]
            for t, r in medians.iterrows()]  # fmt: skip
    return "\n".join([*lines, table(headers, body)])


def trend_json(trend: Trend) -> dict[str, Any]:
    rows = trend.rows
    return {
        "host": trend.host,
        "from": _iso(rows.index[0]),
        "to": _iso(rows.index[-1]),
        "rows": len(rows),
        "points_bucket_s": trend.bucket_s,
        "series": [
            {
                "name": s.name,
                "n": s.n,
                "first": s.first,
                "last": s.last,
                "median": s.median,
                "changes": [_change_json(c) for c in s.changes],
                "candidates": [_change_json(c) for c in s.candidates],
            }
            for s in trend.series
        ],
        "level_changes": {
            "method": "candidates from PELT on the points; a change is reported where "
            "`vllm-sidecar diff` of the windows before against the windows after calls the "
            "figure's change significant (diff's units, intervals and Bonferroni family)",
            "alpha": trend.multiplicity.alpha,
            "tests": trend.multiplicity.tests,
            "false_change_bound": round(trend.multiplicity.bound, 6),
            "max_windows_a_side": MAX_WINDOWS,
        },
        "baselines": [_iso(t) for t in trend.baselines],
        "fingerprint_changes": [
            {"time": _iso(c.time), "from": c.before, "to": c.after, "label": c.label}
            for c in trend.fingerprint_changes
        ],
    }


# ---------------------------------------------------------------------------------- stages


def _in_range(frame: pd.DataFrame, options: TrendOptions) -> pd.DataFrame:
    if options.kind not in KINDS:
        raise ConfigError(f"--kind {options.kind!r}: give one of {', '.join(KINDS)}")
    rows = frame
    if options.kind != "all":
        rows = rows[rows["kind"] == options.kind]
    if options.start is not None:
        rows = rows[rows["time"] >= pd.Timestamp(options.start)]
    if options.end is not None:
        rows = rows[rows["time"] <= pd.Timestamp(options.end)]
    if rows.empty:
        newest = _when(frame["time"].max()) if len(frame) else "none"
        raise InputError(
            f"no {'' if options.kind == 'all' else options.kind + ' '}snapshots in the range "
            f"asked for ({len(frame)} in all, the newest {newest}): widen --since or --until"
        )
    return rows.sort_values("time")


def _roles_filled(rows: pd.DataFrame) -> pd.DataFrame:
    """A summary lists only the phases a role was seen in: where the role was sampled, a
    phase it does not list had a share of 0, not an unknown one."""
    filled: dict[str, np.ndarray] = {}
    for prefix in SHARE_PREFIXES:
        for role in {c.split(".")[1] for c in rows.columns if c.startswith(prefix + ".")}:
            cols = [c for c in rows.columns if c.startswith(f"{prefix}.{role}.")]
            block = rows[cols].to_numpy(dtype=np.float64, copy=True)
            seen = ~np.isnan(block).all(axis=1)
            block[seen] = np.nan_to_num(block[seen], nan=0.0)
            filled.update(zip(cols, block.T, strict=True))
    shares = pd.DataFrame(filled, index=rows.index)
    return pd.concat([rows.drop(columns=list(filled)), shares], axis=1)


def _top_phases(rows: pd.DataFrame, filled: list[str], role: str) -> list[str]:
    cols = [c for c in filled if c.startswith(f"share.{role}.")]
    means = rows[cols].mean().sort_values(ascending=False)
    return list(means.index[:TOP_PHASES])


def _bucket(index: pd.Index, most: int) -> int:
    span = (index[-1] - index[0]).total_seconds() if len(index) else 0.0
    for bucket in BUCKETS_S:
        if span / bucket < most:
            return bucket
    return BUCKETS_S[-1]


def _medians(rows: pd.DataFrame, bucket_s: int) -> pd.DataFrame:
    return rows.resample(f"{bucket_s}s").median().dropna(how="all")


def _series(
    points: pd.Series, rows: pd.DataFrame, bucketed: bool, tests: LevelTests
) -> SeriesTrend:
    """The series' candidate changes (PELT on its points), each with diff's test of the windows
    either side; the confirmed ones are its changes."""
    present = points.notna().to_numpy()
    values = points[present]
    found = change_points(values)
    windows = _windows_of(rows, values.index, np.flatnonzero(present), bucketed)
    kept, last = (
        confirm(str(points.name), [c.index for c in found], len(values), windows, tests)
        if found
        else ([], {})
    )
    candidates = tuple(
        LevelChange(values.index[c.index], c.before, c.after, last[c.index]) for c in found
    )
    changes = tuple(c for c, f in zip(candidates, found, strict=True) if f.index in kept)
    return SeriesTrend(points.name, len(values), float(values.iloc[0]), float(values.iloc[-1]),
                       float(values.median()), changes, candidates)  # fmt: skip


def _windows_of(
    rows: pd.DataFrame, times: pd.Index, positions: np.ndarray, bucketed: bool
) -> Callable[[int, int], list[Window]]:
    """The windows (folder name, kind) behind the points lo..hi-1 of a series: the rows
    themselves (`positions` in `rows`), or the rows of those buckets (from the first bucket's
    start to the next point's)."""
    names = rows["name"].astype(str).to_numpy() if "name" in rows else np.full(len(rows), "")
    kinds = rows["kind"].astype(str).to_numpy()

    def start(i: int) -> int:
        if i >= len(times):
            return len(rows)
        if bucketed:
            return int(np.searchsorted(rows.index, times[i], side="left"))
        return int(positions[i])

    def windows(lo: int, hi: int) -> list[Window]:
        span = range(start(lo), start(hi))
        return [(str(names[i]), str(kinds[i])) for i in span if names[i]]

    return windows


def _change_label(before: pd.Series, after: pd.Series) -> str:
    parts = []
    for col, label in FINGERPRINT_FIELDS.items():
        was, now = _text(before.get(col)), _text(after.get(col))
        if was == now or "?" in (was, now):  # unread on one side: not a change
            continue
        if col == "serving_flags":  # name the flags that changed, not the whole set
            a, b = _flags(was), _flags(now)
            parts += [f"{k} {a.get(k, '-')} -> {b.get(k, '-')}" for k in sorted(a.keys() | b.keys())
                      if a.get(k) != b.get(k)]  # fmt: skip
        else:
            parts.append(f"{label} {was} -> {now}")
    return "; ".join(parts) or f"fingerprint {before['fingerprint']} -> {after['fingerprint']}"


def _flags(text: str) -> dict[str, str]:
    pairs = (item.partition("=") for item in text.split() if text != "?")
    return {k: v for k, _, v in pairs}


# ---------------------------------------------------------------------------------- format


def _text(value: object) -> str:
    """A readable fingerprint field; a missing one (None, or NaN in pandas' string columns)."""
    return "?" if value is None or pd.isna(value) else str(value)


def _change_json(c: LevelChange) -> dict[str, Any]:
    """A level change as JSON: the time and the points' medians either side (the keys before
    diff's test), then diff's verdict on the windows either side (sidecar.trend.levels)."""
    doc: dict[str, Any] = {"time": _iso(c.time), "before": c.before, "after": c.after}
    return doc if c.test is None else doc | test_json(c.test)


def _level_words(trend: Trend) -> list[str]:
    """How the level changes were decided, and the candidates diff did not confirm."""
    candidates = [(s, c) for s in trend.series for c in s.candidates]
    if not candidates:
        return []
    m = trend.multiplicity
    kept = sum(len(s.changes) for s in trend.series)
    lines = [
        "",
        f"level changes: {kept} of {len(candidates)} candidates, each kept where `vllm-sidecar "
        f"diff` of the windows before against the windows after (up to {MAX_WINDOWS} a side) "
        f"calls the change significant ({100 * m.alpha:g} % over that diff's comparisons); "
        + (f"{m.tests} tests, at most {chance(m.bound)} chance of any false change among them"
           if m.tests else "none could be tested"),
    ]  # fmt: skip
    for s, c in candidates:
        if c.test is None or c.test.verdict is Verdict.SIGNIFICANT:
            continue
        why = c.test.note if c.test.verdict is Verdict.NOT_TESTED else diff_words(c.test)
        lines.append(f"  not a change: {short_name(s.name)} at {_when(c.time)} "
                     f"{_fmt(s.name, c.before)} -> {_fmt(s.name, c.after)}: "
                     f"{c.test.verdict.value} ({why})")  # fmt: skip
    return lines


def _summary_cells(s: SeriesTrend) -> list[str]:
    changes = ", ".join(
        f"{_when(c.time)} {_fmt(s.name, c.before)} -> {_fmt(s.name, c.after)}"
        + (f" ({diff_words(c.test)})" if c.test is not None else "")
        for c in s.changes
    )
    return [s.name, str(s.n), _fmt(s.name, s.first), _fmt(s.name, s.last),
            _fmt(s.name, s.median), changes or "-"]  # fmt: skip


def _fmt(name: str, value: float) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if name.startswith(CUSTOM_PREFIX):  # the operator's own units: the number as it is
        return f"{value:.4g}"
    if name.startswith(tuple(p + "." for p in SHARE_PREFIXES)) or name == "kv_cache_usage":
        return f"{100 * value:.1f}%"
    if name.endswith("_s") and not name.endswith("per_s"):
        return f"{1000 * value:.0f}ms" if value < 10 else f"{value:.1f}s"
    return f"{value:.1f}" if abs(value) < 100 else f"{value:.0f}"


SHORT = {"generation_tokens_per_s": "gen tok/s", "prompt_tokens_per_s": "prompt tok/s",
         "requests_per_s": "req/s", "ttft_p95_s": "TTFT p95", "itl_p95_s": "ITL p95",
         "ttft_mean_s": "TTFT mean", "itl_mean_s": "ITL mean"}  # fmt: skip


def short_name(name: str) -> str:
    if name.startswith("share."):
        return (
            name.removeprefix("share.")
            .replace("engine_core", "engine")
            .replace("api_server", "api")
        )
    return SHORT.get(name, name)


def _when(t: pd.Timestamp) -> str:
    return str(t.strftime("%Y-%m-%d %H:%M"))


def _iso(t: pd.Timestamp) -> str:
    return str(t.isoformat())


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size:.0f}{unit}"
    return f"{seconds:g}s"

"""`vllm-sidecar aggregate`: the fleet report over many hosts' and deployments' snapshots.

DuckDB queries the per-snapshot table (one row per snapshot folder, `snapshots`) and the
stacks (`stacks.parquet`); a fleet's phase share is a ratio of sums (each snapshot's share
times its role's samples, over the role's samples), never a mean of shares, so a long or busy
window counts for what it sampled. Tokens per second are weighted by the windows' seconds;
latencies and KV usage are the mean of the windows' readings. The outliers come from the
summaries, through `diff`'s statistics (sidecar.fleet.outliers).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import duckdb

from sidecar.diff.text import change_words
from sidecar.errors import InputError
from sidecar.fleet.outliers import Group, Key, Outliers, find_outliers
from sidecar.fleet.source import Fleet, Note
from sidecar.records import Phase, Role
from sidecar.records.summary import SnapshotSummary
from sidecar.store.trend_table import ROLE_SAMPLES
from sidecar.tables import table

ROLES = tuple(r.value for r in Role)
PHASES = tuple(p.value for p in Phase)
TOP_FRAMES = 3


@dataclass(frozen=True, slots=True)
class Row:
    """One deployment's or host's (or the fleet's) figures over the range."""

    key: tuple[str, ...]
    windows: int
    samples: float
    seconds: float
    role_samples: dict[str, float]
    shares: dict[str, dict[str, float]]  # role -> phase -> share of the role's samples
    figures: dict[str, float | None]  # generation/prompt tokens/s, TTFT, KV usage


@dataclass(frozen=True, slots=True)
class FleetReport:
    since: datetime | None
    until: datetime | None
    first: datetime | None
    last: datetime | None
    fleet: Row
    deployments: tuple[Row, ...]  # key: (host, deployment, model, fingerprint)
    hosts: tuple[Row, ...]  # key: (host,)
    frames: dict[tuple[str, str], list[tuple[str, float]]]  # (role, phase) -> top leaf frames
    stacks: tuple[int, int]  # snapshots with stacks.parquet, of all
    outliers: Outliers
    took_s: float


def aggregate(
    fleet: Fleet, since: datetime | None, until: datetime | None, note: Note
) -> FleetReport:
    started = time.perf_counter()
    con = fleet.connect()
    where = _where(since, until)
    con.execute(f"CREATE TEMP VIEW picked AS SELECT * FROM snapshots {where}")
    count = _one(con, "SELECT count(*) FROM picked")
    if not count:
        raise InputError(
            f"no snapshots from {_range_words(since, until)} in the sources ({fleet.table.num_rows}"
            " in all): widen --since/--until"
        )
    first, last = con.execute("SELECT min(time), max(time) FROM picked").fetchone() or (None, None)
    deployments = _rows(con, ["host", "coalesce(deployment, '?')", "coalesce(model, '?')",
                              "fingerprint"])  # fmt: skip
    hosts = _rows(con, ["host"])
    whole = _rows(con, [])[0]
    picked = con.execute("SELECT host, name FROM picked").fetchall()
    frames, with_stacks = _frames(con, fleet, [(h, n) for h, n in picked])
    outliers = find_outliers(_groups(con, fleet, note))
    return FleetReport(since, until, _utc(first), _utc(last), whole, tuple(deployments),
                       tuple(hosts), frames, (with_stacks, len(picked)), outliers,
                       time.perf_counter() - started)  # fmt: skip


def _where(since: datetime | None, until: datetime | None) -> str:
    terms = []
    if since is not None:
        terms.append(f"time >= TIMESTAMPTZ '{since.isoformat()}'")
    if until is not None:
        terms.append(f"time < TIMESTAMPTZ '{until.isoformat()}'")
    return ("WHERE " + " AND ".join(terms)) if terms else ""


def _one(con: duckdb.DuckDBPyConnection, sql: str) -> Any:
    got = con.execute(sql).fetchone()
    return got[0] if got else None


def _columns(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("DESCRIBE picked").fetchall()}


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _rows(con: duckdb.DuckDBPyConnection, keys: list[str]) -> list[Row]:
    """The figures grouped by `keys` (SQL expressions); shares as ratios of sums."""
    have = _columns(con)
    pairs = [(r, p) for r in ROLES for p in PHASES
             if f"share.{r}.{p}" in have and f"{ROLE_SAMPLES}.{r}" in have]  # fmt: skip
    roles = [r for r in ROLES if f"{ROLE_SAMPLES}.{r}" in have]
    sums = [f"sum({_q(f'{ROLE_SAMPLES}.{r}')})" for r in roles]
    sums += [f"sum({_q(f'share.{r}.{p}')} * {_q(f'{ROLE_SAMPLES}.{r}')})" for r, p in pairs]
    figures = [
        "sum(generation_tokens_per_s * duration_s) / nullif(sum(CASE WHEN "
        "generation_tokens_per_s IS NOT NULL THEN duration_s END), 0)",
        "sum(prompt_tokens_per_s * duration_s) / nullif(sum(CASE WHEN "
        "prompt_tokens_per_s IS NOT NULL THEN duration_s END), 0)",
        "avg(ttft_mean_s)", "avg(ttft_p95_s)", "avg(kv_cache_usage)",
    ]  # fmt: skip
    select = [*keys, "count(*)", "sum(samples)", "sum(duration_s)", *figures, *sums]
    group = f" GROUP BY {', '.join(keys)} ORDER BY {', '.join(keys)}" if keys else ""
    out = []
    for got in con.execute(f"SELECT {', '.join(select)} FROM picked{group}").fetchall():
        k = len(keys)
        n = dict(zip(roles, got[k + 8 : k + 8 + len(roles)], strict=True))
        shares: dict[str, dict[str, float]] = defaultdict(dict)
        for (r, p), v in zip(pairs, got[k + 8 + len(roles) :], strict=True):
            if v and n.get(r):
                shares[r][p] = v / n[r]
        names = ("generation_tokens_per_s", "prompt_tokens_per_s", "ttft_mean_s", "ttft_p95_s",
                 "kv_cache_usage")  # fmt: skip
        readings = dict(zip(names, got[k + 3 : k + 8], strict=True))
        out.append(Row(tuple(str(x) for x in got[:k]), int(got[k]), float(got[k + 1] or 0),
                       float(got[k + 2] or 0), {r: float(v or 0) for r, v in n.items()},
                       dict(shares), readings))  # fmt: skip
    return out


def _frames(
    con: duckdb.DuckDBPyConnection, fleet: Fleet, picked: list[tuple[str, str]]
) -> tuple[dict[tuple[str, str], list[tuple[str, float]]], int]:
    """The leaf frames that hold the most samples in each role x phase, over the stacks of the
    picked snapshots, as a share of the phase's samples."""
    files = [f.stacks for k in picked if (f := fleet.folders.get(k)) and f.stacks]
    if not files:
        return {}, 0
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    sql = f"""
        WITH s AS (SELECT role, phase, frame, sum(weight) AS w
                   FROM read_parquet([{listed}], union_by_name = true)
                   GROUP BY role, phase, frame),
             t AS (SELECT *, w / sum(w) OVER (PARTITION BY role, phase) AS share,
                          row_number() OVER (PARTITION BY role, phase ORDER BY w DESC, frame)
                          AS rank FROM s)
        SELECT role, phase, frame, share FROM t WHERE rank <= {TOP_FRAMES}
        ORDER BY role, phase, rank"""
    try:
        got = con.execute(sql).fetchall()
    except duckdb.Error as exc:
        why = str(exc).splitlines()[0]  # DuckDB's next lines quote the query
        raise InputError(f"cannot read the stacks ({why}): remove or re-upload the file it "
                         "names, or narrow the range") from None  # fmt: skip
    out: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
    for role, phase, frame, share in got:
        out[(str(role), str(phase))].append((str(frame), float(share)))
    return dict(out), len(files)


def _groups(
    con: duckdb.DuckDBPyConnection, fleet: Fleet, note: Note
) -> dict[Group, dict[Key, list[SnapshotSummary]]]:
    """(model, fingerprint) -> (host, deployment) -> its summaries, read only for groups with
    two deployments or more (the only ones compared)."""
    rows = con.execute("SELECT coalesce(model, '?'), fingerprint, host, coalesce(deployment, "
                       "'?'), name FROM picked ORDER BY time, name").fetchall()  # fmt: skip
    members: dict[Group, set[Key]] = defaultdict(set)
    for model, fp, host, dep, _ in rows:
        members[(model, fp or "")].add((host, dep))
    wanted = [(h, n) for m, fp, h, d, n in rows if fp and len(members[(m, fp)]) >= 2]
    summaries = fleet.summaries(wanted, note)
    out: dict[Group, dict[Key, list[SnapshotSummary]]] = {
        g: {k: [] for k in ks} for g, ks in members.items()
    }
    for model, fp, host, dep, name in rows:
        if (s := summaries.get((host, name))) is not None:
            out[(model, fp or "")][(host, dep)].append(s)
    # Kept: every deployment of a group not compared (it is named as such); of the others,
    # those with a summary that could be read.
    return {g: {k: v for k, v in d.items() if v or not g[1] or len(d) < 2}
            for g, d in out.items()}  # fmt: skip


# ---------------------------------------------------------------------------------- output


def render_text(r: FleetReport) -> str:
    f = r.fleet
    span = _range_words(r.first, r.last, to=True)
    out = [f"[Fleet] {len(r.hosts)} hosts, {len(r.deployments)} deployments, {f.windows} "
           f"snapshots from {span}; {f.samples:,.0f} samples."]  # fmt: skip
    out += _outlier_lines(r.outliers)
    out += ["", "[Fleet] Phase shares per role (pooled: each phase's samples over the role's):"]
    roles = [x for x in ROLES if f.role_samples.get(x)]
    shown = [p for p in PHASES if any(f.shares.get(x, {}).get(p, 0) >= 0.005 for x in roles)]
    out.append(table(["phase", *roles], [[p, *(_pct(f.shares.get(x, {}).get(p)) for x in roles)]
                                         for p in shown]))  # fmt: skip
    out.append(f"samples: {', '.join(f'{x} {f.role_samples[x]:,.0f}' for x in roles)}")
    top = _top_phases(f)
    heads = ["windows", "samples", *(f"{x} {p}" for x, p in top), "gen tok/s", "prompt tok/s",
             "TTFT mean", "TTFT p95 (mean)", "KV usage"]  # fmt: skip
    flagged = {(o.host, o.deployment) for o in r.outliers.outliers}
    out += ["", "[Fleet] Deployments:"]
    out.append(table(["host", "deployment", "model", "fingerprint", *heads, ""],
                     [[*d.key, *_cells(d, top), "outlier" if d.key[:2] in flagged else ""]
                      for d in r.deployments]))  # fmt: skip
    out += ["", "[Fleet] Hosts:"]
    out.append(table(["host", *heads], [[*h.key, *_cells(h, top)] for h in r.hosts]))
    with_stacks, of = r.stacks
    out += ["", f"[Fleet] Top frames per phase ({with_stacks} of {of} snapshots have "
            "stacks.parquet; share of the phase's samples):"]  # fmt: skip
    rows = [[x, p, frame, _pct(share)] for x, p in top for frame, share in r.frames.get((x, p), [])]
    out.append(table(["role", "phase", "frame", "share"], rows) if rows else "(no stacks)")
    return "\n".join(out)


def _outlier_lines(o: Outliers) -> list[str]:
    level = f"family-wise {100 * (1 - o.alpha):.0f} %, m = {o.tested} tests in {o.rounds} rounds"
    lines = []
    if not o.outliers:
        lines.append(f"[Fleet] No outlier: no deployment differs significantly from the rest of "
                     f"its model and fingerprint ({level}).")  # fmt: skip
    for x in o.outliers:
        picked = [c for kind in ("share", "serving", "cost", "cores")
                  for c in [c for c in x.changes if c.kind == kind][:2]][:5]  # fmt: skip
        whom = "the other deployment" if x.pair else f"the other {x.against} deployments"
        more = len(x.changes) - len(picked)
        lines.append(f"[Fleet] Outlier: {x.host} {x.deployment} against {whom} of {x.group[0]} "
                     f"(fingerprint {x.group[1]}): " + "; ".join(change_words(c) for c in picked)
                     + (f" (and {more} more)" if more else "") + ".")  # fmt: skip
        if x.workload:
            lines.append(f"        its workload differs: {x.workload}")
        if x.pair:
            lines.append(
                "        one of two that differ: a third deployment would tell which is odd"
            )
    if o.outliers:
        lines.append(f"[Fleet] ({level}.)")
    if o.alone:
        lines.append("[Fleet] Alone with their model and fingerprint (not compared): "
                     + ", ".join(f"{h} {d}" for h, d in o.alone))  # fmt: skip
    if o.unknown:
        lines.append("[Fleet] No fingerprint (summaries before schema 3; not compared): "
                     + ", ".join(f"{h} {d}" for h, d in o.unknown))  # fmt: skip
    return lines


def _top_phases(f: Row) -> list[tuple[str, str]]:
    """Each role's largest busy phase, and the worker's two: the columns of the tables."""
    out = []
    for role, n in (("worker", 2), ("engine_core", 1), ("api_server", 1)):
        ranked = sorted(((s, p) for p, s in f.shares.get(role, {}).items() if p != "idle"),
                        reverse=True)  # fmt: skip
        out += [(role, p) for _, p in ranked[:n]]
    return out


def _cells(r: Row, top: list[tuple[str, str]]) -> list[str]:
    g = r.figures
    return [str(r.windows), f"{r.samples:,.0f}",
            *(_pct(r.shares.get(x, {}).get(p)) for x, p in top),
            _num(g["generation_tokens_per_s"], "{:.1f}"), _num(g["prompt_tokens_per_s"], "{:.1f}"),
            _num(g["ttft_mean_s"], "{:.3f} s"), _num(g["ttft_p95_s"], "{:.3f} s"),
            _pct(g["kv_cache_usage"])]  # fmt: skip


def to_json(r: FleetReport) -> dict[str, Any]:
    def row(x: Row, names: tuple[str, ...]) -> dict[str, Any]:
        return {**dict(zip(names, x.key, strict=True)), "windows": x.windows,
                "samples": x.samples, "seconds": _clean(x.seconds),
                "role_samples": x.role_samples,
                "shares": {k: {p: _clean(v) for p, v in s.items()} for k, s in x.shares.items()},
                **{k: _clean(v) for k, v in x.figures.items()}}  # fmt: skip

    o = r.outliers
    return {
        "since": _iso(r.since), "until": _iso(r.until), "first": _iso(r.first),
        "last": _iso(r.last),
        "fleet": row(r.fleet, ()),
        "deployments": [row(d, ("host", "deployment", "model", "fingerprint"))
                        for d in r.deployments],
        "hosts": [row(h, ("host",)) for h in r.hosts],
        "outliers": [{"host": x.host, "deployment": x.deployment, "model": x.group[0],
                      "fingerprint": x.group[1], "against": x.against, "pair": x.pair,
                      "workload_differs": x.workload,
                      "changes": [{"kind": c.kind, "role": c.role, "name": c.name,
                                   "rest": _clean(c.a), "deployment": _clean(c.b),
                                   "scale": c.scale, "change": _clean(c.change),
                                   "low": _clean(c.low), "high": _clean(c.high),
                                   "p_adjusted": c.p_adjusted, "words": change_words(c)}
                                  for c in x.changes]}
                     for x in o.outliers],
        "alone": [list(k) for k in o.alone],
        "unknown_fingerprint": [list(k) for k in o.unknown],
        "method": {"alpha": o.alpha, "tested": o.tested, "rounds": o.rounds,
                   "test": "each deployment against the pooled rest of its model and "
                           "fingerprint (diff's statistics), in rounds; Bonferroni over all"},
        "frames": [{"role": k[0], "phase": k[1], "frame": fr, "share": _clean(s)}
                   for k, v in r.frames.items() for fr, s in v],
        "stacks": {"snapshots_with_stacks": r.stacks[0], "snapshots": r.stacks[1]},
        "took_s": round(r.took_s, 3),
    }  # fmt: skip


def _utc(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _range_words(since: datetime | None, until: datetime | None, to: bool = False) -> str:
    def w(t: datetime | None) -> str:
        return "…" if t is None else t.strftime("%Y-%m-%d %H:%M")

    if since is None and until is None and not to:
        return "any time"
    return f"{w(since)} to {w(until)}"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{100 * v:.1f}%"


def _num(v: float | None, fmt: str) -> str:
    return "-" if v is None or not math.isfinite(v) else fmt.format(v)


def _clean(v: float | None) -> float | None:
    return None if v is None or not math.isfinite(v) else round(v, 6)

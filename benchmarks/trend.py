"""How fast `vllm-sidecar trend` answers over 30 days of a daemon's output (about 9,000 folders).

    python benchmarks/trend.py [SOURCE ...] [--out /tmp/trend-bench] [--days 30]

SOURCE: real snapshot folders (written by `vllm-sidecar snapshot` or `run` against a live vLLM,
e.g. by `python -m devtools.demo`); by default the real summaries kept as test fixtures, of
schema 1, 2 and 3 (a month in which the sidecar was upgraded twice). The benchmark lays out
OUT/<host>/ as a daemon would over `--days` days: a snapshot every 5 minutes and a baseline
every hour (9,361 folders in 30 days), each a replica of one SOURCE (the sources take equal
consecutive stretches of time, in the order given) with the name, time and kind shifted:
summary.json rewritten with those fields (and `host`), its stack files hard-linked. Where a
source has no fingerprint (schema 1 and 2 kept none; schema 3 before it was filled), its
replicas get one that says so in `notes` and whose only flag names the source
(`benchmark_source=<folder>`): each switch between sources is a fingerprint change to mark.

Then it times:
  * the table's append path: one part per write and a compaction every COMPACT_EVERY writes
    (the store's `_tabulate`), on top of the full table;
  * the first `trend` (no table yet: rebuilt from every summary.json);
  * `trend` warm (the table current), as a fresh process each time, as an operator runs it:
    text, JSON, and with --plot; the median of --repeat runs, against the 2 s target.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sidecar.store.trend_table import COMPACT_EVERY, TrendTable

TARGET_S = 2.0
HOST = "bench-node"
_TESTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
FIXTURES = (
    _TESTS / "schema1" / "20261201T112537Z",
    _TESTS / "trend" / "schema2" / "20261201T133909Z",
    _TESTS / "trend" / "schema3" / "20261201T140758Z",
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("sources", nargs="*", type=Path, default=list(FIXTURES))
    parser.add_argument("--out", type=Path, default=Path("/tmp/trend-bench"))
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    host_dir = args.out / HOST
    if args.out.exists():
        shutil.rmtree(args.out)
    started = time.perf_counter()
    count = generate(args.sources, host_dir, args.days)
    print(f"generated {count} folders under {host_dir} in {time.perf_counter() - started:.1f} s")

    cli = [sys.executable, "-m", "sidecar.cli", "trend", str(args.out), "--since", "31d"]
    first = _timed(cli)
    print(f"first trend (rebuilds the table from {count} summaries): {first:.2f} s")
    table = TrendTable(host_dir)
    size = table.path.stat().st_size
    print(f"table: {table.path} {size / 2**20:.2f} MiB")
    appends, compaction = time_append_path(table)
    print(f"append path: {1000 * statistics.median(appends):.1f} ms per write (median of "
          f"{len(appends)}), compaction of {count} rows {1000 * compaction:.0f} ms "
          f"(every {COMPACT_EVERY} writes)")  # fmt: skip
    plot = args.out / "trend.png"
    runs = {
        "text, 30 days": cli,
        "text, 7 days": [*cli[:-1], "7d"],
        "json, 30 days": [*cli, "--format", "json"],
        "text + PNG, 30 days": [*cli, "--plot", str(plot)],
    }
    for label, command in runs.items():
        times = [_timed(command) for _ in range(args.repeat)]
        warm = statistics.median(times)
        print(f"warm trend, {label}: {warm:.2f} s median of {args.repeat} "
              f"(min {min(times):.2f}, max {max(times):.2f}); {warm / TARGET_S:.2f} x the "
              f"{TARGET_S:g} s target")  # fmt: skip
    print(f"plot: {plot}")
    breakdown(args.out)
    return 0


def breakdown(out: Path) -> None:
    """Where a warm run's time goes, in this process (imports already paid)."""
    from sidecar.trend.plot import save_png, trend_figure
    from sidecar.trend.series import TrendOptions, compute_trend, render_text
    from sidecar.trend.source import host_folder, load_table

    marks = [time.perf_counter()]
    table = load_table(host_folder(out, None), note=print)
    marks.append(time.perf_counter())
    frame = table.to_pandas()
    marks.append(time.perf_counter())
    trend = compute_trend(frame, TrendOptions(), host=HOST)
    marks.append(time.perf_counter())
    render_text(trend)
    marks.append(time.perf_counter())
    save_png(trend_figure(trend), out / "breakdown.png")
    marks.append(time.perf_counter())
    steps = ("read the table", "to pandas", "series + change points", "text", "PNG")
    took = [
        f"{step} {1000 * (b - a):.0f} ms"
        for step, a, b in zip(steps, marks, marks[1:], strict=False)
    ]
    print("in-process, warm: " + ", ".join(took))


def generate(sources: list[Path], host_dir: Path, days: float) -> int:
    """Replicas of `sources` every 5 minutes (snapshots) and every hour (baselines, beside the
    snapshot of the same minute, as the daemon's schedule writes them)."""
    docs = [json.loads((s / "summary.json").read_text()) for s in sources]
    end = datetime.now(UTC).replace(second=0, microsecond=0)
    end -= timedelta(minutes=end.minute % 5)
    start = end - timedelta(days=days)
    host_dir.mkdir(parents=True)
    count, t = 0, start
    while t <= end:
        which = min(int((t - start) / (end - start) * len(sources)), len(sources) - 1)
        for baseline in (False, True) if t.minute == 0 else (False,):
            _replica(sources[which], docs[which], host_dir, t, baseline)
            count += 1
        t += timedelta(minutes=5)
    return count


def _replica(source: Path, doc: dict, host_dir: Path, when: datetime, baseline: bool) -> None:
    name = when.strftime("%Y%m%dT%H%M%SZ")
    folder = host_dir / (name + ("-baseline" if baseline else ""))
    folder.mkdir()
    out = dict(doc, name=name, created_at=when.isoformat(timespec="seconds"), host=HOST,
               kind="baseline" if baseline else "snapshot")  # fmt: skip
    if not out.get("fingerprint"):
        out["fingerprint"] = {
            "model": (doc.get("serving") or {}).get("model_name"),
            "serving": {"benchmark_source": source.name},
            "notes": {"*": "benchmarks/trend.py: the source snapshot had no fingerprint"},
        }
    (folder / "summary.json").write_text(json.dumps(out, indent=2) + "\n")
    for other in source.iterdir():
        if other.name != "summary.json":
            os.link(other, folder / other.name)


def time_append_path(table: TrendTable) -> tuple[list[float], float]:
    """Append COMPACT_EVERY rows as the store does (copies of the last row, renamed), then
    compact: the per-write cost and the compaction's, at the table's full size."""
    main, _, _ = table.read()
    assert main is not None
    last = main.slice(main.num_rows - 1).to_pylist()[0]
    appends = []
    for i in range(COMPACT_EVERY):
        row = dict(last, name=f"99991231T{i:06d}Z")
        t0 = time.perf_counter()
        table.append(row)
        appends.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    table.compact(keep=set(main["name"].to_pylist()))  # the extra rows have no folder: dropped
    return appends, time.perf_counter() - t0


def _timed(command: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


if __name__ == "__main__":
    sys.exit(main())

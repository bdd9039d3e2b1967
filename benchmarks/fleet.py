"""How fast `vllm-sidecar aggregate` answers over a fleet's output folders.

    python benchmarks/fleet.py [--out /tmp/fleet-bench] [--hosts 4] [--deployments 2] [--days 1]

Lays out OUT/<host>/ for `--hosts` hosts, each running `--deployments` deployments of the same
model and fingerprint, a snapshot every 5 minutes each over `--days` days, every folder a
replica of a real recorded window (tests/fixtures/diff: the ten steady `mixed` windows in turn;
the last deployment of the last host the three `prefill-heavy` ones, the outlier to find), with
its name, time, host and deployment rewritten in summary.json, and the stacks.parquet of a real
window (tests/fixtures/flame/decode-heavy) hard-linked into each folder. Then it times
`aggregate` as a fresh process, as an operator runs it: the first run (no tables: each host's
rebuilt from its summaries) and warm runs (the tables current; the median of --repeat).
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

_TESTS = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
STEADY = sorted((_TESTS / "diff" / "steady-mixed").iterdir())
PREFILL = sorted((_TESTS / "diff" / "prefill-heavy").iterdir())
STACKS = _TESTS / "flame" / "decode-heavy" / "stacks.parquet"
START = datetime(2026, 11, 1, tzinfo=UTC)


def generate(out: Path, hosts: int, deployments: int, days: float) -> int:
    per = int(days * 24 * 12)
    docs = {p: json.loads((p / "summary.json").read_text()) for p in (*STEADY, *PREFILL)}
    count = 0
    for h in range(hosts):
        host = f"node-{h + 1}"
        for d in range(deployments):
            odd = h == hosts - 1 and d == deployments - 1
            sources = PREFILL if odd else STEADY
            for i in range(per):
                when = START + timedelta(minutes=5 * i, seconds=7 * d)
                name = when.strftime("%Y%m%dT%H%M%SZ")
                folder = out / host / name
                folder.mkdir(parents=True)
                doc = dict(docs[sources[i % len(sources)]], name=name, host=host,
                           created_at=when.isoformat(), kind="snapshot",
                           deployment=f"tiny@{8000 + d}")  # fmt: skip
                (folder / "summary.json").write_text(json.dumps(doc))
                os.link(STACKS, folder / "stacks.parquet")
                count += 1
    return count


def _timed(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("/tmp/fleet-bench"))
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--deployments", type=int, default=2)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    started = time.perf_counter()
    count = generate(args.out, args.hosts, args.deployments, args.days)
    print(f"generated {count} folders ({args.hosts} hosts x {args.deployments} deployments) "
          f"under {args.out} in {time.perf_counter() - started:.1f} s")  # fmt: skip
    cli = [sys.executable, "-m", "sidecar.cli", "aggregate", str(args.out)]
    print(f"first aggregate (rebuilds {args.hosts} tables from {count} summaries): "
          f"{_timed(cli):.2f} s")  # fmt: skip
    warm = [_timed(cli) for _ in range(args.repeat)]
    print(f"warm aggregate, text: {statistics.median(warm):.2f} s (median of {args.repeat}: "
          f"{', '.join(f'{t:.2f}' for t in warm)})")  # fmt: skip
    doc = json.loads(subprocess.run([*cli, "--format", "json"], check=True, capture_output=True,
                                    text=True).stdout)  # fmt: skip
    odd = [(o["host"], o["deployment"]) for o in doc["outliers"]]
    print(f"in-process work {doc['took_s']:.2f} s; outliers {odd}; m = {doc['method']['tested']} "
          f"tests in {doc['method']['rounds']} rounds")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

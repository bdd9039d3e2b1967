"""How long `vllm-sidecar export tensorboard` takes over days of a daemon's output.

    python -m benchmarks.tb_export [--days 7] [--out /tmp/tb-bench] [--repeat 3]

The store is laid out as benchmarks/trend.py lays it (a snapshot every 5 minutes, a baseline
every hour, replicas of the real summaries kept as test fixtures, schema 1, 2 and 3). Then it
times the export as an operator runs it, a fresh process each time (the first into an empty
logdir, then re-exports over it), and reads the runs back with TensorBoard's reader to count
the steps: the same after every export (no step written twice).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.trend import FIXTURES, HOST, generate

_CLI = "import sys; from sidecar.cli import main; sys.exit(main())"
_REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("/tmp/tb-bench"))
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    if args.out.exists():
        shutil.rmtree(args.out)
    store, logdir = args.out / "out", args.out / "tb"
    count = generate(list(FIXTURES), store / HOST, args.days)
    print(f"{count} snapshot folders over {args.days:g} days under {store}")
    times = [_export(store, logdir) for _ in range(1 + args.repeat)]
    steps = _steps(logdir)
    print(f"first export: {times[0]:.2f} s; re-exports: "
          f"{', '.join(f'{t:.2f}' for t in times[1:])} s "
          f"(median {statistics.median(times[1:]):.2f} s); "
          f"{1000 * statistics.median(times) / count:.2f} ms per snapshot")  # fmt: skip
    print(f"steps read back: {steps} (snapshots: {count})")
    return 0 if steps == count else 1


def _export(store: Path, logdir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(_REPO)}
    argv = [sys.executable, "-c", _CLI, "export", "tensorboard", str(store), "--logdir",
            str(logdir)]  # fmt: skip
    started = time.perf_counter()
    subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def _steps(logdir: Path) -> int:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    total = 0
    for run in sorted(p for p in logdir.glob("*/*") if p.is_dir()):
        acc = EventAccumulator(str(run), size_guidance={"scalars": 0})
        acc.Reload()
        total += len(acc.Scalars("sampling/samples"))
    return total


if __name__ == "__main__":
    sys.exit(main())

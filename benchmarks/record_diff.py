"""Record real windows for `vllm-sidecar diff` into tests/fixtures/diff (`make record-diff`,
about 15 minutes on the 2-core dev box); the unit tests check the method on this record:

- steady-mixed/   STEADY windows of the same steady `mixed` load, back to back: every pair of
                  them is a comparison that must say "no significant change" (the measured
                  false-alarm rate, printed here and checked in tests/unit/analyze/test_compare.py);
- prefill-heavy/  the same server, the load switched to long prompts: against steady-mixed the
                  diff must find tokenisation up in the API server and compute up in the worker;
- max-num-seqs-1/ the server restarted with --max-num-seqs 1 under the same `mixed` load: a real
                  configuration regression (no batching), which the fingerprint names first and
                  `--fail-on` must fail on.

Only summary.json is kept of each snapshot (the diff reads nothing else).
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from devtools.diff_windows import RATE_HZ, SEGMENT_S, WINDOW_S, take_windows
from devtools.live_window import SERVER_ENV
from devtools.server import VllmServer
from sidecar.analyze.compare import Side, compare
from sidecar.store.summary_io import read_summary

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "diff"


def keep(folders: list[Path], dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    for folder in folders:
        (dest / folder.name).mkdir(parents=True, exist_ok=True)
        shutil.copy(folder / "summary.json", dest / folder.name / "summary.json")


def false_alarms(dest: Path) -> tuple[int, int]:
    summaries = [read_summary(p) for p in sorted(dest.iterdir())]
    pairs = list(itertools.combinations(summaries, 2))
    alarms = sum(bool(compare(Side("A", (a,)), Side("B", (b,))).significant) for a, b in pairs)
    return alarms, len(pairs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steady", type=int, default=10, help="steady mixed windows")
    parser.add_argument("--others", type=int, default=3, help="windows of each other side")
    args = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="record-diff-") as tmp:
        work = Path(tmp)
        with VllmServer(log_path=work / "server.log", extra_env=SERVER_ENV) as server:
            keep(take_windows(server, "mixed", args.steady, work / "a"), FIXTURE / "steady-mixed")
            print(f"steady-mixed: {args.steady} windows", flush=True)
            keep(take_windows(server, "prefill-heavy", args.others, work / "b"),
                 FIXTURE / "prefill-heavy")  # fmt: skip
        with VllmServer(log_path=work / "server2.log", extra_env=SERVER_ENV,
                        extra_args=("--max-num-seqs", "1")) as server:  # fmt: skip
            keep(take_windows(server, "mixed", args.others, work / "c"),
                 FIXTURE / "max-num-seqs-1")  # fmt: skip
    alarms, pairs = false_alarms(FIXTURE / "steady-mixed")
    meta = {
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window_s": WINDOW_S, "segment_s": SEGMENT_S, "rate_hz": RATE_HZ,
        "steady_pairs": pairs, "steady_false_alarms": alarms,
        "minutes": round((time.monotonic() - started) / 60, 1),
    }  # fmt: skip
    (FIXTURE / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

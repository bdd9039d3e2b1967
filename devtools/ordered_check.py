"""Record what the time slices of a window rest on (issue 22, item 1), on the real vLLM CPU server:

1. The speedscope reading is py-spy's raw output: on each of vLLM's processes (API server,
   EngineCore, worker) under the mixed load, two py-spy run side by side at the same rate, one
   `--format raw`, one `--format speedscope` read back by sidecar/parsers/speedscope.py. Every
   frame the reading prints must be one raw printed, and the stacks agree as far as two
   samplers of the same moments can (the share of the read samples whose whole stack raw has).
2. The samples in order: the three processes sampled for `--seconds` (180 by default) at
   `--rate` Hz through speedscope, each sample classified by the shipped rules, binned per
   `BIN_S` by role and phase. sidecar/analyze/slices.py chooses the slices' length from that
   record (the autocorrelation of each phase share between consecutive slices), and
   tests/unit/analyze/test_slices.py checks the shipped default against it.

    python -m devtools.ordered_check [--seconds 180] [--rate 10]   # make ordered-check

The record: tests/fixtures/noise/ordered.json. Runs under the live-check lock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from devtools.loadgen import background_load
from devtools.matrix import live_lock
from devtools.server import VllmServer, descendants
from sidecar.analyze.slices import BIN_S, choose_unit
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.parsers import parse_raw
from sidecar.parsers.speedscope import read_speedscope
from sidecar.sampling.pyspy import ShortNames, SubprocessPySpy

ROOT = Path(__file__).resolve().parents[1]
RECORD = ROOT / "tests" / "fixtures" / "noise" / "ordered.json"
# One process's side-by-side pair kept as it came (a few seconds of the worker), for the
# parser's unit tests (tests/unit/parsers/test_speedscope.py).
PAIR = ROOT / "tests" / "fixtures" / "parsers" / "speedscope"


def _pyspy(pid: int, rate: int, seconds: float, fmt: str, out: Path) -> None:
    binary = SubprocessPySpy.find().binary
    subprocess.run([binary, "record", "--pid", str(pid), "--rate", str(rate), "--duration",
                    str(int(seconds)), "--format", fmt, "--output", str(out), "--threads",
                    "--idle", "--nonblocking"], capture_output=True, check=True,
                   timeout=seconds + 60)  # fmt: skip


def _side_by_side(pid: int, rate: int, seconds: float, tmp: Path) -> dict[str, Any]:
    raw_out, ss_out = tmp / f"{pid}.raw", tmp / f"{pid}.json"
    runs = [threading.Thread(target=_pyspy, args=(pid, rate, seconds, f, o))
            for f, o in (("raw", raw_out), ("speedscope", ss_out))]  # fmt: skip
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    raw = Counter[str]()
    for line in raw_out.read_text().splitlines():
        if line.strip():
            key, n = line.rsplit(" ", 1)
            raw[key] += int(n)
    read = read_speedscope(ss_out.read_text(), rate, 1.0, ShortNames().of(pid))
    mine = Counter[str]()
    for line in read.raw.splitlines():
        key, n = line.rsplit(" ", 1)
        mine[key] += int(n)
    raw_frames = {f for key in raw for f in key.split(";")}
    my_frames = {f for key in mine for f in key.split(";")}
    return {
        "pid": pid,
        "raw_samples": sum(raw.values()),
        "read_samples": sum(mine.values()),
        "read_frames": len(my_frames),
        "read_frames_not_in_raw": sorted(my_frames - raw_frames)[:20],
        "raw_frames_not_read": sorted(raw_frames - my_frames)[:20],
        "read_samples_whose_stack_raw_has": round(
            sum(n for k, n in mine.items() if k in raw) / max(1, sum(mine.values())), 4
        ),
        "slices": len(read.parts),
    }


def _pyspy_pair(pid: int, rate: int, seconds: float, tmp: Path) -> None:
    """A short pair of the worker kept for the parser's tests, with the short names py-spy
    printed for it (the test reads the speedscope with those, no /proc)."""
    pair = tmp / "pair"
    pair.mkdir()
    runs = [threading.Thread(target=_pyspy, args=(pid, rate, seconds, f, pair / n))
            for f, n in (("raw", "worker.raw"), ("speedscope", "worker.json"))]  # fmt: skip
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    doc = json.loads((pair / "worker.json").read_text())
    names = ShortNames()
    files = sorted({f["file"] for f in doc["shared"]["frames"] if f.get("file")})
    PAIR.mkdir(parents=True, exist_ok=True)
    for n in ("worker.raw", "worker.json"):
        (PAIR / n).write_text((pair / n).read_text())
    short = {f: names.short(pid, f) for f in files}
    (PAIR / "short_names.json").write_text(json.dumps({"rate_hz": rate, "short": short},
                                                      indent=1) + "\n")  # fmt: skip


def _ordered(pids: list[int], rate: int, seconds: float, tmp: Path) -> dict[str, Any]:
    outs = {pid: tmp / f"{pid}-long.json" for pid in pids}
    runs = [threading.Thread(target=_pyspy, args=(pid, rate, seconds, "speedscope", outs[pid]))
            for pid in pids]  # fmt: skip
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    classifier = Classifier(load_rules())
    bins: list[dict[str, dict[str, int]]] = []
    labels: dict[str, tuple[str, str] | None] = {}
    names = ShortNames()
    for pid in pids:
        read = read_speedscope(outs[pid].read_text(), rate, BIN_S, names.of(pid))
        for i, part in enumerate(read.parts):
            while len(bins) <= i:
                bins.append({})
            for key, n in part.items():
                if key not in labels:
                    parsed = parse_raw(f'process {pid}:"vllm";{key} 1\n').stacks
                    label = classifier.classify(parsed[0]) if parsed and parsed[0].frames else None
                    labels[key] = (label.role.value, label.phase.value) if label else None
                if (lab := labels[key]) is not None:
                    by_phase = bins[i].setdefault(lab[0], {})
                    by_phase[lab[1]] = by_phase.get(lab[1], 0) + n
    return {"rate_hz": rate, "seconds": seconds, "bin_s": BIN_S, "bins": bins}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=180.0)
    ap.add_argument("--rate", type=int, default=10)
    ap.add_argument("--out", type=Path, default=RECORD)
    args = ap.parse_args(argv)
    with live_lock(), tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with VllmServer() as server, background_load(server.base_url, "mixed",
                                                     duration_s=args.seconds + 120,
                                                     stop_on_exit=True):  # fmt: skip
            time.sleep(10)  # the load reaches its steady state
            pids = [server.pid, *descendants(server.pid)]
            checks = [_side_by_side(pid, args.rate, 15, tmp) for pid in pids]
            worker = pids[-1]
            _pyspy_pair(worker, args.rate, 3, tmp)
            ordered = _ordered(pids, args.rate, args.seconds, tmp)
    choice = choose_unit(ordered["bins"], ordered["bin_s"])
    record = {
        "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "how": "python -m devtools.ordered_check "
        f"--seconds {args.seconds:g} --rate {args.rate} (tiny vLLM CPU server, mixed load, "
        "8 clients)",
        "machine": f"{os.cpu_count()} cores",
        "side_by_side": checks,
        "ordered": ordered,
        "choice": choice.to_dict(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({"side_by_side": checks, "choice": choice.to_dict()}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What one 20 s snapshot against another can tell, measured on the real vLLM CPU server (issue 22):
`make diff-power` records the windows into tests/fixtures/diff-power, and
tests/unit/diff/test_power_record.py computes every figure below again from them with the
shipped `diff` (no process), so the README's claims rest on recorded windows.

Each chunk starts the tiny server, runs the `mixed` load, and takes `vllm-sidecar snapshot
--duration 20` windows exactly as an operator would (the default rate and segments, so the
default time slices): `--mixed N` windows of it, then, for a chunk with `--other W`, the load
switched to W and N windows of that. Pairs:
- steady: consecutive mixed windows two by two (0-1, 2-3, ...): the same load, so any
  significant phase-share change is a false alarm; over 40 pairs or more the count and its
  Clopper-Pearson interval must sit within the family-wise 5 %;
- shift (W = prefill-heavy): mixed window i against W window i; worker `forward` (or compute)
  and API server `input_processing` must come out significant and up in 9 pairs of 10 or more;
- power (W = mixed+prefill-heavy:P, P % of the requests prefill-heavy instead of mixed): the
  share of pairs where the worker's forward share comes out significant, per step P;
- rates (`--rates 5,20`): the windows alternate the rates, so that what a higher rate buys is
  measured side by side on one server and load: the steady and shift pairs per rate, and how
  many effective samples the mixed windows' forward share rests on. Not at the default rate,
  so not counted in the three above.

A chunk holds the live-check lock for its whole run (about 10-12 minutes for 2 x 10 windows).

    python -m devtools.diff_power --chunk steady-1 --mixed 20
    python -m devtools.diff_power --chunk shift --mixed 10 --other prefill-heavy
    python -m devtools.diff_power --chunk mix20 --mixed 10 --other mixed+prefill-heavy:20
    python -m devtools.diff_power --chunk rates --mixed 12 --other prefill-heavy --rates 5,20
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from devtools.diff_windows import take_windows
from devtools.live_window import SERVER_ENV
from devtools.matrix import live_lock
from devtools.server import VllmServer

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "diff-power"
WINDOW_S = 20.0
# What diff reads of a summary, kept; the rest (processes, threads, GPU, KV cache, the report's
# sections) is left out so that a hundred windows stay small. The result still reads as a
# summary (every section left out has defaults).
KEEP = ("schema", "name", "created_at", "kind", "host", "deployment", "phases", "by_role",
        "role_samples", "sampling", "serving", "fingerprint", "resources")  # fmt: skip


def take(
    server: VllmServer, workload: str, count: int, out: Path, rates: tuple[float, ...] = ()
) -> list[Path]:
    """COUNT 20 s windows at `snapshot`'s default rate and segments (its default slices); with
    `rates`, window i at rates[i % len(rates)] instead (the rates side by side)."""
    return take_windows(server, workload, count, out, window_s=WINDOW_S, segment_s=None,
                        rate_hz=None, rates=rates)  # fmt: skip


def keep(folder: Path, dest: Path) -> None:
    data = json.loads((folder / "summary.json").read_text())
    trimmed: dict[str, Any] = {k: data[k] for k in KEEP if k in data}
    for p in trimmed.get("resources", {}).get("processes", []):
        p.pop("title", None)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "summary.json").write_text(json.dumps(trimmed, separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunk", required=True, help="the record's folder under diff-power/")
    ap.add_argument("--mixed", type=int, default=10, help="mixed windows first")
    ap.add_argument("--other", default=None, help="then this workload, as many windows")
    ap.add_argument("--rates", default="", help="e.g. 5,20: the windows alternate these rates")
    args = ap.parse_args(argv)
    rates = tuple(float(r) for r in args.rates.split(",") if r.strip())
    started = time.monotonic()
    dest = FIXTURE / args.chunk
    with live_lock(), tempfile.TemporaryDirectory(prefix="diff-power-") as tmp:
        locked = time.monotonic()
        work = Path(tmp)
        with VllmServer(log_path=work / "server.log", extra_env=SERVER_ENV) as server:
            sides = [("mixed", take(server, "mixed", args.mixed, work / "mixed", rates))]
            if args.other:
                sides.append(
                    (args.other, take(server, args.other, args.mixed, work / "other", rates))
                )
        shutil.rmtree(dest, ignore_errors=True)
        for label, folders in sides:
            for i, folder in enumerate(folders):
                keep(folder, dest / ("mixed" if label == "mixed" else "other") / f"{i:02d}")
    meta = {
        "recorded": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "window_s": WINDOW_S,
        "mixed": args.mixed,
        "other": args.other,
        **({"rates": list(rates)} if rates else {}),
        "how": f"python -m devtools.diff_power {' '.join(argv or sys.argv[1:])}",
        "minutes_locked": round((time.monotonic() - locked) / 60, 1),
        "minutes_waited": round((locked - started) / 60, 1),
    }
    (dest / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

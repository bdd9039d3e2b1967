"""The figures of the diff's power record (tests/fixtures/diff-power, `make diff-power`), computed
from the recorded windows with the shipped `diff` (sidecar.analyze.compare, one window a side,
no history): devtools/diff_power.py writes them to results.json after the last chunk, and
tests/unit/diff/test_power_record.py computes them again and checks them and the bars.
No process runs here.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scipy import stats

from sidecar.analyze.compare import ALPHA, Change, Side, compare
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "diff-power"
RESULTS = FIXTURE / "results.json"
FORWARD = ("worker", "forward")
COMPUTE = ("worker", "compute")
TOKENISE = ("api_server", "input_processing")


@dataclass(frozen=True, slots=True)
class Chunk:
    name: str
    other: str | None
    mixed: tuple[SnapshotSummary, ...]
    others: tuple[SnapshotSummary, ...]
    rates: tuple[float, ...] = ()  # the windows alternate these rates (not the default's)


def chunks(root: Path = FIXTURE) -> Iterator[Chunk]:
    for folder in sorted(p for p in root.iterdir() if (p / "meta.json").exists()):
        meta = json.loads((folder / "meta.json").read_text())
        mixed = _windows(folder / "mixed")
        others = _windows(folder / "other") if meta.get("other") else ()
        yield Chunk(folder.name, meta.get("other"), mixed, others, tuple(meta.get("rates", ())))


def _windows(folder: Path) -> tuple[SnapshotSummary, ...]:
    if not folder.is_dir():
        return ()
    return tuple(read_summary(p) for p in sorted(folder.iterdir()) if p.is_dir())


def _one(a: SnapshotSummary, b: SnapshotSummary) -> tuple[Change, ...]:
    return compare(Side("A", (a,)), Side("B", (b,))).shares


def _find(shares: tuple[Change, ...], key: tuple[str, str]) -> Change | None:
    return next((c for c in shares if (c.role, c.name) == key), None)


def _up(c: Change | None) -> bool:
    return c is not None and c.significant and (c.change or 0) > 0


def _interval(k: int, n: int) -> list[float]:
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=0.95, method="exact")
    return [round(ci.low, 4), round(ci.high, 4)]


def figures(root: Path = FIXTURE) -> dict[str, Any]:
    steady: list[dict[str, Any]] = []
    shift: list[dict[str, Any]] = []
    power: dict[str, list[dict[str, Any]]] = {}
    by_rate: list[dict[str, Any]] = []
    rate_cost: list[dict[str, Any]] = []
    for chunk in chunks(root):
        if chunk.rates:
            by_rate.extend(_rates(chunk))
            rate_cost.extend(_rate_cost(chunk))
            continue
        m = chunk.mixed
        for i in range(0, len(m) - 1, 2):
            shares = _one(m[i], m[i + 1])
            flagged = [f"{c.role}/{c.name}" for c in shares if c.significant]
            steady.append({"chunk": chunk.name, "a": m[i].name, "b": m[i + 1].name,
                           "significant": flagged})  # fmt: skip
        for a, b in zip(m, chunk.others, strict=False):
            shares = _one(a, b)
            fwd = _find(shares, FORWARD)
            row = {
                "chunk": chunk.name, "a": a.name, "b": b.name,
                "forward_pp": _pp(fwd), "forward_significant": bool(fwd and fwd.significant),
                "forward_or_compute_up": _up(fwd) or _up(_find(shares, COMPUTE)),
                "input_processing_up": _up(_find(shares, TOKENISE)),
            }  # fmt: skip
            if chunk.other == "prefill-heavy":
                shift.append(row)
            elif chunk.other:
                power.setdefault(chunk.other, []).append(row)
    alarms = sum(bool(p["significant"]) for p in steady)
    both = sum(r["forward_or_compute_up"] and r["input_processing_up"] for r in shift)
    curve = []
    for step, rows in sorted(power.items(), key=lambda kv: _percent(kv[0])):
        detected = sum(r["forward_significant"] for r in rows)
        curve.append({
            "prefill_heavy_percent": _percent(step), "pairs": len(rows),
            "detected": detected, "detected_share": round(detected / len(rows), 3),
            "mean_forward_change_pp": _mean([r["forward_pp"] for r in rows]),
        })  # fmt: skip
    return {
        "alpha": ALPHA,
        "steady": {
            "pairs": len(steady),
            "false_alarms": alarms,
            "interval_95": _interval(alarms, len(steady)) if steady else None,
            "rows": steady,
        },
        "shift": {"pairs": len(shift), "both_up": both, "rows": shift},
        "power": curve,
        "power_rows": power,
        "rates": by_rate,
        "rate_cost": rate_cost,
    }


def _rate_cost(chunk: Chunk) -> Iterator[dict[str, Any]]:
    """What the higher rate cost the server, side by side: per load, each window at the last
    rate against the window at the first rate just before it (same load, a minute apart), the
    ratio of their requests served per second; the mean ratio with its 95 % t interval."""
    k = len(chunk.rates)
    for load, windows in (("mixed", chunk.mixed), (chunk.other, chunk.others)):
        ratios = [
            high / low
            for lo, hi in zip(windows[0::k], windows[k - 1 :: k], strict=False)
            if (low := _requests_per_s(lo)) and (high := _requests_per_s(hi))
        ]
        if len(ratios) < 2:
            continue
        mean = statistics.fmean(ratios)
        half = stats.t.ppf(0.975, len(ratios) - 1) * statistics.stdev(ratios) / len(ratios) ** 0.5
        yield {
            "load": load, "rates_hz": [chunk.rates[0], chunk.rates[-1]], "pairs": len(ratios),
            "requests_per_s_ratio": round(mean, 4),
            "interval_95": [round(mean - half, 4), round(mean + half, 4)],
        }  # fmt: skip


def _requests_per_s(window: SnapshotSummary) -> float | None:
    s = window.serving
    return s.requests_finished / s.window_s if s.requests_finished and s.window_s else None


def _rates(chunk: Chunk) -> Iterator[dict[str, Any]]:
    """Per rate of a chunk whose windows alternate rates: its steady pairs' false alarms, its
    shift pairs' detections, and what the mixed windows' forward share rests on: the worker's
    samples against their effective number (Korn-Graubard: the share's variance over the
    slices, sidecar/analyze/intervals.py). Where the load itself moves between slices, more
    samples a second shrink the interval less than the square root of the rate would."""
    k = len(chunk.rates)
    for i, rate in enumerate(chunk.rates):
        mixed, others = chunk.mixed[i::k], chunk.others[i::k]
        steady = [_one(mixed[j], mixed[j + 1]) for j in range(0, len(mixed) - 1, 2)]
        shift = [_one(a, b) for a, b in zip(mixed, others, strict=False)]
        forward = [f for s in shift if (f := _find(s, FORWARD)) is not None and f.score]
        samples = [m.role_samples.get("worker", 0) for m in mixed]
        yield {
            "rate_hz": rate,
            "windows": len(mixed) + len(others),
            "steady_pairs": len(steady),
            "steady_false_alarms": sum(any(c.significant for c in s) for s in steady),
            "shift_pairs": len(shift),
            "forward_detected": sum(_up(_find(s, FORWARD)) for s in shift),
            "forward_or_compute_up": sum(
                _up(_find(s, FORWARD)) or _up(_find(s, COMPUTE)) for s in shift
            ),
            "input_processing_up": sum(_up(_find(s, TOKENISE)) for s in shift),
            "mean_forward_change_pp": _mean([_pp(f) for f in forward]),
            "mean_input_processing_change_pp": _mean([_pp(_find(s, TOKENISE)) for s in shift]),
            "prompt_tokens_ratio_median": _median(
                [
                    b.serving.prompt_tokens / a.serving.prompt_tokens
                    for a, b in zip(mixed, others, strict=False)
                    if a.serving.prompt_tokens and b.serving.prompt_tokens
                ]
            ),
            "mixed_worker_samples_median": statistics.median(samples) if samples else None,
            "mixed_forward_effective_n_median": (
                round(statistics.median(f.score[0][1] for f in forward), 1) if forward else None
            ),
            "forward_half_width_pp_median": (
                round(100 * statistics.median(w for f in forward if (w := f.half_width)), 2)
                if forward
                else None
            ),
            "sampler_cpu_share_median": _median(
                [w.sampling.sampler_cpu_share for w in (*mixed, *others)]
            ),
        }


def _mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(sum(known) / len(known), 2) if known else None


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return round(statistics.median(known), 4) if known else None


def _pp(c: Change | None) -> float | None:
    return None if c is None or c.change is None else round(100 * c.change, 2)


def _percent(step: str) -> int:
    return int(step.rsplit(":", 1)[1]) if ":" in step else 100


def write(root: Path = FIXTURE) -> dict[str, Any]:
    result = figures(root)
    (root / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def smallest_detected(curve: list[dict[str, Any]], share: float = 0.8) -> float | None:
    """The smallest mean forward change (pp) of a step detected in at least `share` of pairs."""
    hits = [
        c["mean_forward_change_pp"]
        for c in curve
        if c["detected_share"] >= share and c["mean_forward_change_pp"] is not None
    ]
    return min(hits, key=abs) if hits else None


if __name__ == "__main__":
    out = write()
    print(json.dumps({k: v for k, v in out.items() if k not in ("power_rows",)}, indent=1)[:4000])
    print("smallest change detected 80 % of the time:", smallest_detected(out["power"]), "pp")

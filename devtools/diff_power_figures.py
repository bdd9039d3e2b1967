"""The figures of the diff's power record (tests/fixtures/diff-power, `make diff-power`), computed
from the recorded windows with the shipped `diff` (sidecar.analyze.compare, one window a side,
no history): devtools/diff_power.py writes them to results.json after the last chunk, and
tests/unit/diff/test_power_record.py computes them again and checks them and the bars.
No process runs here.
"""

from __future__ import annotations

import json
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


def chunks(root: Path = FIXTURE) -> Iterator[Chunk]:
    for folder in sorted(p for p in root.iterdir() if (p / "meta.json").exists()):
        meta = json.loads((folder / "meta.json").read_text())
        mixed = _windows(folder / "mixed")
        others = _windows(folder / "other") if meta.get("other") else ()
        yield Chunk(folder.name, meta.get("other"), mixed, others)


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
    for chunk in chunks(root):
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
        changes = [r["forward_pp"] for r in rows if r["forward_pp"] is not None]
        curve.append({
            "prefill_heavy_percent": _percent(step), "pairs": len(rows),
            "detected": detected, "detected_share": round(detected / len(rows), 3),
            "mean_forward_change_pp": round(sum(changes) / len(changes), 2) if changes else None,
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
    }


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

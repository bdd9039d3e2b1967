"""`vllm-sidecar diff`'s verdict in words: the headline, each change as a sentence with its
unit, and the caveats said once (sidecar/diff/text.py lays them out as text and JSON).

A headline never says "no significant change" alone: it says what these samples could have
detected (the widest interval's half-width in each family of figures, sidecar.analyze.compare's
`detectable`), what could not be tested and why, and the largest changes that were not
significant, marked so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from sidecar.advice.findings import fmt_number
from sidecar.analyze.compare import (
    LATENCY_NAMES,
    RATES,
    Change,
    Comparison,
    Side,
    detectable,
)
from sidecar.sampling.pyspy import LATE_S
from sidecar.tables import share_text

# The notes of changes that are not tested for a reason of the whole side, not of the row:
# said once as a caveat, each row then reads "not tested".
ONE_WINDOW_NOTE = "one window on a side"
ONE_UNIT_NOTE = "one unit on a side"
NOT_TESTED = "not tested"
# What vLLM served (latency, throughput), then where the time goes (shares), then CPU.
QUOTA = (("serving", 2), ("share", 2), ("cost", 1), ("cores", 1))
REST_QUOTA = (("serving", 1), ("share", 1), ("cost", 1), ("cores", 1))
COUNTS = frozenset({"queue: requests waiting", "preemptions"})
BIG_RATIO = 2.0  # from here a change reads as a factor (x54.8), not a percentage (5375 %)


def verdict(c: Comparison, top: int = 6) -> list[str]:
    """The headline in plain words: the fingerprint, the workload, the significant changes
    largest first (or what these samples could have detected), then the largest of the rest."""
    lines = (
        [f"Ran differently: {', '.join(f.words() for f in c.fingerprint)}."]
        if c.fingerprint
        else []
    )
    for label in c.mixed:
        lines.append(f"Note: {label.split(':')[0]} mixes windows of different fingerprints.")
    if c.mix_differs:
        lines.append(f"The workload differs ({c.mix_differs}): costs per token and per "
                     "request and latencies compare unlike work, and --fail-on does not gate "
                     "on them.")  # fmt: skip
    custom = [ch for ch in c.custom if ch.significant]
    if custom:
        lines.append(
            "Custom metrics (tested apart): "
            + "; ".join(f"{ch.name} {ratio_words(ch.change)}" for ch in custom)
            + "."
        )
    found = c.significant
    if found:
        picked = _pick(found, top)
        more = f" (and {len(found) - len(picked)} more)" if len(found) > len(picked) else ""
        lines.append("Significant: " + "; ".join(change_words(ch) for ch in picked) + more + ".")
    else:
        lines.append(nothing_significant(c))
    rest = largest(c)
    if rest:
        head = "Largest of the rest" if found else "Largest changes"
        lines.append(f"{head}: " + "; ".join(change_words(ch, _mark(ch)) for ch in rest) + ".")
    return lines


def nothing_significant(c: Comparison) -> str:
    """No significant change, and what these samples could have told: the change each family
    could have shown in any of its figures (its widest interval's half-width: a change that
    large is at the edge of significance), and what went untested."""
    level = f"family-wise {100 * (1 - c.alpha):.0f} %"
    untested = sum(len(v) for v in _untested(c).values())
    if not c.tested:
        why = "see the caveat" if untested else "nothing was measured on both sides"
        return (f"No significant change could be found: none of the figures could be tested "
                f"with these samples ({why}).")  # fmt: skip
    could = []
    shares = detectable(c.shares)
    if shares is not None:
        could.append(f"\u00b1{100 * shares:.1f} pp in any phase share")
    for family, words in (
        ((*c.cores, *c.costs), "any CPU figure"),
        (c.serving, "any serving figure"),
    ):
        factor = detectable(family)
        if factor is not None:
            could.append(f"\u00d7/\u00f7{_factor(factor)} in {words}")
    said = (f"No significant change: none of the {c.tested} tested differences is outside its "
            f"interval ({level}). These samples could detect a change above about "
            f"{_or(could)}; smaller ones could go unseen (more windows, longer ones or a "
            "higher --rate narrow this).")  # fmt: skip
    if untested:
        said += f" {untested} figures were not tested (see the caveat)."
    return said


def largest(c: Comparison, top: int = 4) -> list[Change]:
    """The largest changes that are not significant (tested or not), a few of each kind: a
    large change nobody could test is still worth a look."""
    rest = [ch for ch in c.family if not ch.significant and 0 < ch.magnitude < math.inf]
    return _pick(sorted(rest, key=lambda ch: -ch.magnitude), top, REST_QUOTA)


def _pick(
    changes: Sequence[Change], top: int, quota: Sequence[tuple[str, int]] = QUOTA
) -> list[Change]:
    return [ch for kind, n in quota for ch in [x for x in changes if x.kind == kind][:n]][:top]


def _mark(ch: Change) -> str:
    return "not significant" if ch.tested else NOT_TESTED


def change_words(ch: Change, mark: str = "") -> str:
    """`worker compute up 14.0 pp (34.5% -> 48.5% of its samples)`, `TTFT mean up x5.1
    (60 ms -> 302 ms)`: the change first, then what it went from and to, with units, and
    `mark` (not significant, not tested) last."""
    who = f"{ch.role.replace('_', ' ')} " if ch.role else ""
    if ch.kind == "share":
        direction = "up" if (ch.change or 0) > 0 else "down"
        size = abs(ch.change or 0.0) * 100
        return (f"{who}{ch.name.replace('_', ' ')} {direction} {size:.1f} pp "
                f"({_pct(ch.a)} \u2192 {_pct(ch.b)} of its samples{_then(mark)})")  # fmt: skip
    what = ch.name
    phase = "" if ch.name == "all" else f" in {ch.name.replace('_', ' ')}"
    if ch.kind == "cost":
        what = f"{who}CPU per 1k generated tokens{phase}"
    elif ch.kind == "cores":
        what = f"{who}CPU time{phase}"
    if ch.a is None or ch.b is None or ch.change is None:
        return f"{what} {ratio_words(ch.change)}" + (f" ({mark})" if mark else "")
    factor = "" if ch.change >= BIG_RATIO else f", {times(ch.change)}"
    return (f"{what} {_direction(ch.change)} ({kind_value(ch, ch.a)} \u2192 "
            f"{kind_value(ch, ch.b)}{factor}{_then(mark)})")  # fmt: skip


def _then(mark: str) -> str:
    return f"; {mark}" if mark else ""


def ratio_words(v: float | None) -> str:
    """`up 12 % (x1.12)`; from x2 on a factor reads better than a percentage: `up x54.8`."""
    if v is None:
        return "changed"
    return _direction(v) if v >= BIG_RATIO else f"{_direction(v)} ({times(v)})"


def _direction(v: float) -> str:
    if v >= BIG_RATIO:
        return f"up {times(v)}"
    return f"{'up' if v > 1 else 'down'} {abs(v - 1) * 100:.0f} %"


def kind_value(ch: Change, v: float) -> str:
    """A figure's value with its unit, by kind."""
    if ch.kind == "serving":
        return serving_value(ch.name, v)
    if ch.kind == "cost":
        return f"{v:.3g} s"
    if ch.kind == "cores":
        return f"{v:.3g} cores"
    return f"{v:.4g}"


def times(v: float) -> str:
    """A ratio as a factor: x0.82, x1.43, x54.8, x1,200."""
    return f"\u00d7{_factor(v)}"


def _factor(v: float) -> str:
    if v >= 100:
        return f"{v:,.0f}"
    if v >= BIG_RATIO:
        return f"{v:.1f}"
    return f"{v:.2f}" if v >= 0.1 else f"{v:.2g}"


def serving_value(name: str, v: float | None) -> str:
    """A serving figure as the report prints it: latencies in ms or s, the KV cache's usage as
    a share, counts as counts, rates as they are (the unit is in the name)."""
    if v is None:
        return "-"
    if name in LATENCY_NAMES:
        return fmt_number(v, "s")
    if name == "KV cache usage":
        return _pct(v)
    if name in COUNTS:
        return f"{v:,.0f}" if float(v).is_integer() else f"{v:,.1f}"
    return f"{v:.4g}"


def _pct(v: float | None) -> str:
    return "-" if v is None else share_text(v)


def _or(items: Sequence[str], word: str = "or") -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + f" {word} " + items[-1]


def _and(items: Sequence[str]) -> str:
    return _or(items, "and")


# ---------------------------------------------------------------------------------- caveats


def side_wide(ch: Change) -> bool:
    """Not tested for a reason of a whole side (one window, one unit): said once, as a caveat."""
    return not ch.tested and (ch.note or "").startswith((ONE_WINDOW_NOTE, ONE_UNIT_NOTE))


def _untested(c: Comparison) -> dict[str, list[Change]]:
    """The changes not tested for a reason of a whole side, by that reason."""
    found: dict[str, list[Change]] = {ONE_WINDOW_NOTE: [], ONE_UNIT_NOTE: []}
    for ch in (*c.family, *c.custom):
        if side_wide(ch):
            found[ONE_WINDOW_NOTE if (ch.note or "").startswith(ONE_WINDOW_NOTE)
                  else ONE_UNIT_NOTE].append(ch)  # fmt: skip
    return found


def _figures(changes: Sequence[Change]) -> str:
    """`14 CPU, traffic and latency figures`: how many, of which kinds."""
    kinds = {_figure_kind(ch) for ch in changes}
    return f"{len(changes)} {_and([k for k in _FIGURE_KINDS if k in kinds])} figures"


_FIGURE_KINDS = ("phase share", "CPU", "traffic", "latency", "serving", "custom")
_RATE_NAMES = frozenset(name for name, _ in RATES)


def _figure_kind(ch: Change) -> str:
    if ch.kind in ("share", "custom"):
        return "phase share" if ch.kind == "share" else "custom"
    if ch.kind in ("cores", "cost"):
        return "CPU"
    if ch.name in LATENCY_NAMES:
        return "latency"
    return "traffic" if ch.name in _RATE_NAMES else "serving"


def untested_by_side(c: Comparison) -> list[str]:
    """Why whole groups of figures went untested, each once, with what would test them."""
    found = _untested(c)
    out = []
    few = _which(c, lambda side: len(side.summaries) < 2, "one window")
    if c.history_tested and c.history is not None:
        out.append(f"{few}: {_figures(c.history_tested)} are tested against "
                   f"{c.history.words()} (they vary between windows more than within one, and "
                   "a side of one window has no spread of its own)")  # fmt: skip
    if found[ONE_WINDOW_NOTE]:
        out.append(f"{few}: {_figures(found[ONE_WINDOW_NOTE])} are shown but not tested (they "
                   "vary between windows more than within one, so the windows are their "
                   "units); compare two windows or more a side (a time range: "
                   "PATH@SINCE..UNTIL, or --since/--until) to test them"
                   f"{_history_hint(c)}")  # fmt: skip
    if found[ONE_UNIT_NOTE]:
        few = _which(c, lambda side: len(side.units) < 2, "one unit")
        out.append(f"{few}: {_figures(found[ONE_UNIT_NOTE])} are shown but not tested (a "
                   "window written before schema 3, or of one py-spy segment, has no spread to "
                   "test against); compare windows of several segments, or two windows or more "
                   "a side")  # fmt: skip
    return out


def _history_hint(c: Comparison) -> str:
    """What the deployment's history could not do for a one-window side, and what would let it."""
    h = c.history
    if h is None or h.enough:  # enough: what is left untested (custom metrics) it cannot test
        return ""
    if h.off:
        return f"; {h.shortfall()}"
    return f", or let the deployment's history grow: testing against it {h.shortfall()}"


def _which(c: Comparison, few: Callable[[Side], bool], what: str) -> str:
    sides = [s.label.split(":")[0] for s in (c.a, c.b) if few(s)]
    if len(sides) == 2:
        return f"A and B have {what} each"
    return f"{sides[0] if sides else 'a side'} has {what}"


def caveats(c: Comparison) -> list[str]:
    """What the reader must know once: windows whose sampling the sidecar itself flagged (kept,
    but said), and figures a side cannot test."""
    out = []
    for side in (c.a, c.b):
        for s in side.summaries:
            sampling = s.sampling
            if sampling.partial:
                out.append(f"{side.label[0]}: {s.name} is partial ({sampling.partial_reason})")
            elif sampling.behind_s >= LATE_S:
                out.append(f"{side.label[0]}: py-spy fell {sampling.behind_s:.1f} s behind in "
                           f"{s.name}")  # fmt: skip
    return out + untested_by_side(c)


def untested_cell(ch: Change) -> str:
    """The interval column of a change that is not tested: the row's own reason, or
    "not tested" where the caveat says why for the whole side."""
    return NOT_TESTED if side_wide(ch) else (ch.note or "-")

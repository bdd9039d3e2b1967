"""Two sides (each one or more windows) compared: what differs in the fingerprint, the phase
shares per role, the workload-normalised CPU costs and the serving figures, every tested
difference with a simultaneous 95 % interval. Pure functions over `SnapshotSummary` records.

The method (README, "Comparing snapshots"):
- Units. Consecutive samples of a thread are correlated and windows differ in load, so the
  samples are not the units. For the phase shares, each time slice of a window is
  (`sampling.unit_s`, 2 s by default, schema 7: py-spy's speedscope output keeps the samples'
  order), long enough that neighbouring slices are nearly uncorrelated on the real server
  (sidecar/analyze/slices.py): a 20 s window is ten units. For CPU, costs and rates, and for
  the shares of a window written before schema 7, each py-spy segment of a window is
  (`sampling.blocks`), with its own role x phase counts, CPU seconds per role and vLLM's token
  counts. A summary written before schema 3 is one unit.
- Estimates. Every figure is a ratio of sums over a side's units (a share: phase samples over
  role samples; a cost: CPU seconds over generated tokens; a rate: tokens over seconds), and its
  variance is the ratio estimator's, from the spread of the units around it (the cluster-sample
  formula: n/(n-1) * sum (y_i - R x_i)^2 / (sum x_i)^2). Differences of shares are in
  percentage points, of costs and rates a ratio (compared on the log scale).
- Intervals. Welch's t with Welch-Satterthwaite degrees of freedom, and Bonferroni over every
  comparison the diff tests at once (m), so the chance that two sides of the same load show
  *any* significant change is at most 5 %; a difference is significant when its interval
  excludes no change. Each interval is one the figure can have: a difference of shares is
  Newcombe's hybrid score interval on the two sides' Wilson intervals at their effective
  sample sizes (sidecar/analyze/intervals.py: within [-1, 1], each share within [0, 1]), a
  ratio is Welch's interval of the log-ratio taken back (above 0). Checked on recorded real
  windows (tests/fixtures/diff).
- History. Where a side has one window (CPU, costs, rates and latencies then have no spread of
  their own), they are tested against how much each moves between the deployment's other
  windows of the same fingerprint at a comparable load, when there are enough of them
  (sidecar/analyze/history.py), in the same family; else they are shown, not tested.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.analyze.intervals import effective_n, newcombe, newcombe_p, t_ppf, t_sf
from sidecar.records import Phase
from sidecar.records.summary import Fingerprint, SnapshotSummary

if TYPE_CHECKING:  # history.py builds on this module; compare() only reads what it is given
    from sidecar.analyze.history import History

ALPHA = 0.05  # family-wise: over all the comparisons one diff tests
# Phases where a thread waits: CPU seconds are split over the others (a cost estimate).
WAITING = frozenset({Phase.IDLE.value, Phase.MODEL_WAIT.value, Phase.GPU_WAIT.value})
MIN_SHARE = 0.005  # a phase below this share on both sides is not compared (too few samples)
MIN_SAMPLES = 10  # fewer samples of a phase on both sides together: shown, not tested
MIN_BUSY_SHARE = 0.10  # a phase's cost is compared when it holds this much of a role's busy CPU
# The two sides served different work when the token mix moved this much (costs per token then
# compare unlike things: the diff says so, and --fail-on does not fail on them).
MIX_SHARE = 0.10  # prompt tokens' share of all tokens, absolute
MIX_RATIO = 1.5  # tokens per request, either way
MIN_COST_SAMPLES = 20  # ... and this many samples on each side: the split of CPU rests on them
ROLES = ("api_server", "engine_core", "worker", "other")
# Phases compared together as well, where a reader asks about them together (PHASES.md): the
# model's computation is forward and attention; a shift between the two is not more compute.
GROUPS: dict[str, tuple[str, ...]] = {"compute": (Phase.FORWARD.value, Phase.ATTENTION.value)}


# ---------------------------------------------------------------------------------- units


@dataclass(frozen=True, slots=True)
class Unit:
    """One py-spy segment (or one whole window written before schema 3)."""

    counts: Mapping[str, Mapping[str, int]]  # role -> phase -> samples
    cpu_s: Mapping[str, float]  # role -> CPU seconds over `span_s`
    generation_tokens: float | None
    prompt_tokens: float | None
    requests: float | None
    span_s: float | None
    window: str  # the snapshot it belongs to

    def role_samples(self, role: str) -> int:
        return sum(self.counts.get(role, {}).values())

    def busy_samples(self, role: str) -> int:
        return sum(n for p, n in self.counts.get(role, {}).items() if p not in WAITING)


def units_of(summary: SnapshotSummary) -> tuple[Unit, ...]:
    if summary.sampling.blocks:
        return tuple(
            Unit(b.counts, b.cpu_s, b.generation_tokens, b.prompt_tokens, b.requests,
                 b.span_s, summary.name)
            for b in summary.sampling.blocks
            if b.samples > 0
        )  # fmt: skip
    counts = {
        role: {p: round(share * summary.role_samples.get(role, 0)) for p, share in phases.items()}
        for role, phases in summary.by_role.items()
    }
    cpu: dict[str, float] = {}
    for p in summary.resources.processes:
        if p.cpu_s is not None:
            cpu[p.role] = cpu.get(p.role, 0.0) + p.cpu_s
    s = summary.serving
    span = s.window_s if s.window_s is not None else summary.sampling.duration_s or None
    return (Unit(counts, cpu, s.generation_tokens, s.prompt_tokens, s.requests_finished, span,
                 summary.name),)  # fmt: skip


def share_units_of(summary: SnapshotSummary) -> tuple[Unit, ...]:
    """The units of the phase shares: each segment's time slices (schema 7: `unit_s` seconds
    each, `parts`) where every segment kept them, else the segments (`units_of`). The slices'
    length is chosen so that they are nearly uncorrelated (README, "Comparing snapshots"),
    which makes one 20 s window ten units instead of two."""
    blocks = [b for b in summary.sampling.blocks if b.samples > 0]
    unit_s = summary.sampling.unit_s
    if not blocks or unit_s is None or not all(b.parts for b in blocks):
        return units_of(summary)
    return tuple(
        Unit(part, {}, None, None, None, unit_s, summary.name)
        for b in blocks
        for part in b.parts
        if any(part.values())
    )


# ---------------------------------------------------------------------------------- estimates


@dataclass(frozen=True, slots=True)
class Ratio:
    """sum(num) / sum(den) over n units, with the ratio estimator's variance (None: n < 2)."""

    value: float | None
    var: float | None
    n: int


def ratio(pairs: Iterable[tuple[float, float]]) -> Ratio:
    pairs = [(y, x) for y, x in pairs if math.isfinite(y) and math.isfinite(x)]
    n, total_x = len(pairs), sum(x for _, x in pairs)
    if n == 0 or total_x <= 0:
        return Ratio(None, None, n)
    r = sum(y for y, _ in pairs) / total_x
    if n < 2:
        return Ratio(r, None, n)
    var = n / (n - 1) * sum((y - r * x) ** 2 for y, x in pairs) / total_x**2
    return Ratio(r, var, n)


@dataclass(frozen=True, slots=True)
class Change:
    """One compared figure: A and B, the change (B - A for `pp`, B / A for `ratio`), its
    simultaneous interval, and whether the change is significant. `low`/`high` None: not tested
    (`note` says why)."""

    kind: str  # share | cost | serving
    role: str | None
    name: str  # the phase, or the figure
    a: float | None
    b: float | None
    scale: str  # "pp": a difference of shares; "ratio": B over A
    change: float | None
    low: float | None = None
    high: float | None = None
    significant: bool = False
    note: str | None = None
    p_adjusted: float | None = None  # Bonferroni-adjusted two-sided p (significant: < alpha)
    # Tested against the spread between this many other windows of the deployment (history);
    # None: against the sides' own units, or not tested.
    history_windows: int | None = None
    # Internal: the test statistic's parts, filled before the family's size is known.
    estimate: float | None = field(default=None, repr=False, compare=False)
    se: float | None = field(default=None, repr=False, compare=False)
    df: float | None = field(default=None, repr=False, compare=False)
    # A share's sides as (share, effective samples): its interval is Newcombe's, not Welch's.
    score: tuple[tuple[float, float], tuple[float, float]] | None = field(
        default=None, repr=False, compare=False
    )

    @property
    def tested(self) -> bool:
        return self.low is not None

    @property
    def half_width(self) -> float | None:
        """Half the interval: in share points for `pp`, as a factor for `ratio` (the half-width
        of the log-ratio's interval taken back: 1.5 is x/÷1.5). None: not tested."""
        if self.low is None or self.high is None:
            return None
        if self.scale == "pp":
            return (self.high - self.low) / 2
        if self.low <= 0:
            return math.inf
        return math.exp((math.log(self.high) - math.log(self.low)) / 2)

    @property
    def magnitude(self) -> float:
        """How large the change is, comparable across kinds: pp for shares, % for ratios."""
        if self.change is None:
            return 0.0
        if self.scale == "pp":
            return abs(self.change) * 100
        return abs(math.log(self.change)) * 100 if self.change > 0 else math.inf


def _welch(a: Ratio, b: Ratio, log: bool) -> tuple[float, float, float] | str:
    """(estimate, standard error, degrees of freedom) of B - A (of log B - log A), or why not."""
    if a.value is None or b.value is None:
        return "not measured on both sides"
    if a.var is None or b.var is None:
        return "one unit on a side: no spread to test against (schema < 3 or one segment)"
    va, vb = a.var, b.var
    if log:
        if a.value <= 0 or b.value <= 0:
            return "zero on a side"
        va, vb = va / a.value**2, vb / b.value**2
        estimate = math.log(b.value) - math.log(a.value)
    else:
        estimate = b.value - a.value
    se2 = va + vb
    # Units that agree exactly leave only rounding in the variance (1e-33, say): no spread.
    if math.sqrt(max(se2, 0.0)) <= 1e-9 * max(1.0, abs(estimate)):
        return "no spread between units"
    df = se2**2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    return estimate, math.sqrt(se2), df


def change_of(kind: str, role: str | None, name: str, a: Ratio, b: Ratio, log: bool) -> Change:
    """B against A: the change, and the test's parts (Welch) or why it is not tested."""
    scale = "ratio" if log else "pp"
    value: float | None = None
    if a.value is not None and b.value is not None:
        value = (b.value / a.value if a.value > 0 else None) if log else b.value - a.value
    test = _welch(a, b, log)
    if isinstance(test, str):
        return Change(kind, role, name, a.value, b.value, scale, value, note=test)
    estimate, se, df = test
    return Change(kind, role, name, a.value, b.value, scale, value, estimate=estimate, se=se,
                  df=df)  # fmt: skip


def simultaneous(changes: list[Change], alpha: float) -> list[Change]:
    """Bonferroni over the tested changes: each interval at 1 - alpha/m."""
    m = sum(c.se is not None for c in changes)
    out = []
    for c in changes:
        if c.se is None or c.estimate is None or c.df is None:
            out.append(c)
            continue
        t = t_ppf(1 - alpha / (2 * m), c.df)
        if c.score is not None:
            lo, hi = newcombe(*c.score, t)
            significant = lo > 0 or hi < 0
            p = min(1.0, m * newcombe_p(*c.score, c.df))
            out.append(replace(c, low=lo, high=hi, significant=significant, p_adjusted=p))
            continue
        lo, hi = c.estimate - t * c.se, c.estimate + t * c.se
        if c.scale == "ratio":
            lo, hi = math.exp(lo), math.exp(hi)
            significant = lo > 1 or hi < 1
        else:
            significant = lo > 0 or hi < 0
        p = min(1.0, m * 2 * t_sf(abs(c.estimate) / c.se, c.df))
        out.append(replace(c, low=lo, high=hi, significant=significant, p_adjusted=p))
    return out


def detectable(changes: Iterable[Change]) -> float | None:
    """The widest interval's half-width among the tested `changes` (one scale): the size of
    change these samples could detect in any of them (an estimate that large is at the edge of
    significance in the widest; narrower ones show smaller changes). None: none is tested."""
    widths = [w for c in changes if (w := c.half_width) is not None]
    return max(widths) if widths else None


# ---------------------------------------------------------------------------------- sides


@dataclass(frozen=True, slots=True)
class Side:
    """What one side of a comparison holds: its summaries (windows), oldest first."""

    label: str
    summaries: tuple[SnapshotSummary, ...]
    # The snapshot folders its windows were read from (where the loader looks for the
    # deployment's history); empty: given in memory.
    folders: tuple[Path, ...] = ()

    @property
    def units(self) -> tuple[Unit, ...]:
        return tuple(u for s in self.summaries for u in units_of(s))

    @property
    def share_units(self) -> tuple[Unit, ...]:
        """The phase shares' units: time slices where the windows kept them (schema 7)."""
        return tuple(u for s in self.summaries for u in share_units_of(s))

    @property
    def window_units(self) -> tuple[Unit, ...]:
        """One unit a window: its segments summed."""
        return tuple(merge(units_of(s)) for s in self.summaries)


def merge(units: Sequence[Unit]) -> Unit:
    counts: dict[str, dict[str, int]] = {}
    cpu: dict[str, float] = {}
    for u in units:
        for role, phases in u.counts.items():
            mine = counts.setdefault(role, {})
            for phase, n in phases.items():
                mine[phase] = mine.get(phase, 0) + n
        for role, seconds in u.cpu_s.items():
            cpu[role] = cpu.get(role, 0.0) + seconds
    return Unit(counts, cpu, _sum(u.generation_tokens for u in units),
                _sum(u.prompt_tokens for u in units), _sum(u.requests for u in units),
                _sum(u.span_s for u in units), units[0].window if units else "")  # fmt: skip


@dataclass(frozen=True, slots=True)
class Workload:
    """What a side served, per its units: the mix the costs are normalised by."""

    windows: int
    units: int
    seconds: float | None
    requests: float | None
    prompt_tokens: float | None
    generation_tokens: float | None

    @property
    def prompt_per_request(self) -> float | None:
        return _div(self.prompt_tokens, self.requests)

    @property
    def generated_per_request(self) -> float | None:
        return _div(self.generation_tokens, self.requests)

    @property
    def prompt_share(self) -> float | None:
        """Prompt tokens over all tokens: the prefill side of the mix."""
        both = _add(self.prompt_tokens, self.generation_tokens)
        return _div(self.prompt_tokens, both)


def workload(side: Side) -> Workload:
    units = side.units
    return Workload(
        windows=len(side.summaries),
        units=len(units),
        seconds=_sum(u.span_s for u in units),
        requests=_sum(u.requests for u in units),
        prompt_tokens=_sum(u.prompt_tokens for u in units),
        generation_tokens=_sum(u.generation_tokens for u in units),
    )


@dataclass(frozen=True, slots=True)
class FingerprintChange:
    field: str
    a: str
    b: str

    def words(self) -> str:
        return f"{self.field} {self.a} \u2192 {self.b}"


_FIELD_NAMES = {
    "vllm": "vLLM", "torch": "torch", "python": "Python", "attention_backend": "attention backend",
    "nvidia_driver": "NVIDIA driver", "cuda": "CUDA", "gpus": "GPUs", "model": "model",
    "cpu_model": "host CPU", "cpu_cores": "host cores", "sidecar": "vllm-sidecar",
    "rules": "rules",
}  # fmt: skip


def fingerprint_changes(
    a: Fingerprint | None, b: Fingerprint | None
) -> tuple[FingerprintChange, ...]:
    """What differs, most consequential first (software, serving flags, hardware, the sidecar).
    A side without a fingerprint (written before schema 3) compares as unknown: no change."""
    if a is None or b is None:
        return ()
    out: list[FingerprintChange] = []
    for f in fields(Fingerprint):
        if f.name in ("notes", "serving"):
            continue
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if f.name == "attention_backend" and None in (va, vb):
            continue  # read from each window's stacks: None is "not seen" (an idle window)
        if va != vb and not (va in (None, ()) and vb in (None, ())):
            out.append(FingerprintChange(_FIELD_NAMES.get(f.name, f.name), _text(va), _text(vb)))
        if f.name == "model":  # the serving flags right after the software and the model
            for flag in sorted(set(a.serving) | set(b.serving)):
                fa, fb = a.serving.get(flag, "default"), b.serving.get(flag, "default")
                if fa != fb:
                    out.append(FingerprintChange(flag.lstrip("-"), fa, fb))
    return tuple(out)


def side_fingerprints(side: Side) -> tuple[Fingerprint, ...]:
    """The distinct fingerprints of a side's windows (more than one: the side mixes runs)."""
    seen: list[Fingerprint] = []
    for s in side.summaries:
        fp = s.fingerprint
        if fp is not None and all(fingerprint_changes(fp, other) for other in seen):
            seen.append(fp)
    return tuple(seen)


# ---------------------------------------------------------------------------------- the diff


@dataclass(frozen=True, slots=True)
class Comparison:
    a: Side
    b: Side
    fingerprint: tuple[FingerprintChange, ...]
    mixed: tuple[str, ...]  # sides whose windows ran more than one fingerprint
    workloads: tuple[Workload, Workload]
    shares: tuple[Change, ...]
    cores: tuple[Change, ...]  # CPU seconds per second (cores) per role and busy phase
    costs: tuple[Change, ...]  # CPU seconds per 1,000 generated tokens
    serving: tuple[Change, ...]
    per_request: tuple[Change, ...]  # CPU seconds per request: estimates, not tested
    tested: int  # m: the comparisons the family-wise level is spread over
    alpha: float
    # The operator's custom metrics (schema 4), one value a window, tested as a family of
    # their own (their m apart from `tested`): they do not move the diff's verdict or gate.
    custom: tuple[Change, ...] = ()
    # The deployment's history a one-window side was tested against (sidecar/analyze/history.py);
    # None: none was given (the Python API's default).
    history: History | None = None

    @property
    def history_tested(self) -> tuple[Change, ...]:
        """The changes tested against the deployment's history."""
        return tuple(c for c in self.family if c.history_windows is not None)

    @property
    def significant(self) -> tuple[Change, ...]:
        found = [c for c in self.family if c.significant]
        return tuple(sorted(found, key=lambda c: -c.magnitude))

    @property
    def mix_differs(self) -> str | None:
        """Why the two sides served different work (then a cost per token compares unlike
        things), or None."""
        a, b = self.workloads
        why = []
        sa, sb = a.prompt_share, b.prompt_share
        if sa is not None and sb is not None and abs(sa - sb) > MIX_SHARE:
            why.append(f"prompt share of tokens {100 * sa:.0f} % \u2192 {100 * sb:.0f} %")
        ga, gb = a.generated_per_request, b.generated_per_request
        if ga and gb and not 1 / MIX_RATIO <= gb / ga <= MIX_RATIO:
            why.append(f"generated tokens per request {ga:.1f} \u2192 {gb:.1f}")
        pa, pb = a.prompt_per_request, b.prompt_per_request
        if pa and pb and not 1 / MIX_RATIO <= pb / pa <= MIX_RATIO:
            why.append(f"prompt tokens per request {pa:.0f} \u2192 {pb:.0f}")
        return "; ".join(why) or None

    @property
    def family(self) -> tuple[Change, ...]:
        """Every comparison the family-wise level covers."""
        return (*self.shares, *self.cores, *self.costs, *self.serving)


def compare(a: Side, b: Side, alpha: float = ALPHA, history: History | None = None) -> Comparison:
    """A against B. `history` (sidecar.analyze.history.history_for): the deployment's other
    windows; where a side has one window, CPU, costs, rates and latencies are tested against
    their spread (else shown, not tested)."""
    ua, ub = a.units, b.units
    # CPU use and traffic vary between windows far more than between the segments of one
    # (on steady load here: a role's CPU by up to 2x from one window to the next), so for them
    # the windows are the units, and a side needs two to be tested.
    wa, wb = a.window_units, b.window_units
    by_window = len(wa) >= 2 and len(wb) >= 2
    ca, cb = (wa, wb) if by_window else (ua, ub)
    parts = [
        _share_changes(a.share_units, b.share_units),
        _untested_unless(by_window, _cpu_changes("cores", ca, cb, lambda u: u.span_s)),
        _untested_unless(
            by_window, _cpu_changes("cost", ca, cb, lambda u: _kilo(u.generation_tokens))
        ),
        _untested_unless(by_window, _rate_changes(ca, cb)) + _latency_changes(a, b),
    ]
    if history is not None and not by_window:
        parts[1:] = [[against_history(c, history, a, b) for c in part] for part in parts[1:]]
    tested = iter(simultaneous([c for part in parts for c in part], alpha))
    shares, cores, costs, serving = (tuple(next(tested) for _ in part) for part in parts)
    per_request = _cpu_changes("per_request", ca, cb, lambda u: u.requests)
    fa, fb = side_fingerprints(a), side_fingerprints(b)
    return Comparison(
        a=a,
        b=b,
        fingerprint=fingerprint_changes(fa[-1] if fa else None, fb[-1] if fb else None),
        mixed=tuple(s.label for s, f in ((a, fa), (b, fb)) if len(f) > 1),
        workloads=(workload(a), workload(b)),
        shares=shares,
        cores=cores,
        costs=costs,
        serving=serving,
        per_request=tuple(
            replace(c, note=c.note or "an estimate; not tested") for c in per_request
        ),
        tested=sum(c.tested for c in (*shares, *cores, *costs, *serving)),
        alpha=alpha,
        custom=tuple(simultaneous(_custom_changes(a, b), alpha)),
        history=history,
    )


def against_history(ch: Change, history: History, a: Side, b: Side) -> Change:
    """A figure untested for want of a second window on a side, tested against the history's
    spread instead: log B/A, SE^2 = s^2 (1/n_a + 1/n_b), the pooled df (history.py says why).
    Too little history: still untested, the note saying how much would test it. (With one
    window on a side, what the segments' spread said (one unit, no spread) does not matter.)"""
    if ch.tested or ch.a is None or ch.b is None:
        return ch  # not measured on both sides: its note says so
    if not history.enough:
        if not (ch.note or "").startswith(ONE_WINDOW_NOTE):
            return ch
        return replace(ch, note=f"{ONE_WINDOW_NOTE}: not tested; {history.shortfall()}")
    if ch.change is None or ch.change <= 0:
        return replace(ch, note="zero on a side")
    sides = [s.summaries for s in (a, b) if len(s.summaries) >= 2]
    spread = history.spread(lambda s: window_figure(s, ch), sides)
    if spread is None:
        return replace(ch, note=f"measured in too few of the history's {history.windows} "
                                "windows to test")  # fmt: skip
    # 1/n a side, each window stretched where it is shorter than the history's (history.py)
    terms = [sum(map(history.stretch, s.summaries)) / len(s.summaries) ** 2 for s in (a, b)]
    se = math.sqrt(spread.var * sum(terms))
    if se <= 0:
        return replace(ch, note="no spread between the history's windows")
    return replace(ch, estimate=math.log(ch.change), se=se, df=spread.df, note=None,
                   history_windows=spread.windows)  # fmt: skip


def window_figure(s: SnapshotSummary, ch: Change) -> float | None:
    """The figure `ch` compares, in one window: a role's (phase's) cores or CPU seconds per 1k
    generated tokens, a rate, or a window reading (latency, queue, ...)."""
    if ch.kind == "serving":
        rate = dict(RATES).get(ch.name)
        if rate is not None:
            return _rate([merge(units_of(s))], rate).value
        reading = dict(LATENCIES).get(ch.name)
        return None if reading is None else getattr(s.serving, reading)
    per: dict[str, Callable[[Unit], float | None]] = {
        "cores": lambda u: u.span_s,
        "cost": lambda u: _kilo(u.generation_tokens),
    }
    if ch.kind not in per or ch.role is None:
        return None
    u = merge(units_of(s))
    y, x = _phase_cpu(u, ch.role, None if ch.name == "all" else ch.name), per[ch.kind](u)
    return y / x if y is not None and x else None


def _custom_changes(a: Side, b: Side) -> list[Change]:
    """Each custom metric either side recorded: the mean of its windows' values, B over A,
    Welch on the log scale over the windows when both sides have two or more (as a latency)."""
    names = list(dict.fromkeys(m.name for side in (a, b) for s in side.summaries
                               for m in s.custom))  # fmt: skip
    out = []
    for name in names:
        va, vb = ([m.value for s in side.summaries for m in s.custom
                   if m.name == name and m.value is not None] for side in (a, b))  # fmt: skip
        kinds = {(m.kind, m.unit) for side in (a, b) for s in side.summaries for m in s.custom
                 if m.name == name}  # fmt: skip
        change = replace(window_change(name, va, vb), kind="custom")
        if len(kinds) > 1:
            why = "measured differently on the two sides (kind or unit): not tested"
            change = replace(change, estimate=None, se=None, df=None, note=why)
        out.append(change)
    return out


ONE_WINDOW_NOTE = "one window on a side"
ONE_WINDOW = (
    "one window on a side: CPU and traffic vary between windows more than within one; "
    "compare two windows or more a side (a time range) to test"
)


def _untested_unless(tested: bool, changes: list[Change]) -> list[Change]:
    if tested:
        return changes
    return [replace(c, estimate=None, se=None, df=None, note=c.note or ONE_WINDOW)
            for c in changes]  # fmt: skip


def _kilo(tokens: float | None) -> float | None:
    return None if tokens is None else tokens / 1000


def _roles(ua: Sequence[Unit], ub: Sequence[Unit]) -> list[str]:
    present = [{r for u in us for r in u.counts if u.role_samples(r)} for us in (ua, ub)]
    both = present[0] & present[1]
    return [r for r in ROLES if r in both] + sorted(both - set(ROLES))


def _share_changes(ua: Sequence[Unit], ub: Sequence[Unit]) -> list[Change]:
    out = []
    for role in _roles(ua, ub):
        names: list[tuple[str, tuple[str, ...]]] = [(p.value, (p.value,)) for p in Phase]
        for group, members in GROUPS.items():
            if all(any(u.counts.get(role, {}).get(m) for u in (*ua, *ub)) for m in members):
                names.append((group, members))
        for name, members in names:
            pairs = [[(sum(u.counts.get(role, {}).get(m, 0) for m in members),
                       u.role_samples(role)) for u in us] for us in (ua, ub)]  # fmt: skip
            a, b = ratio(pairs[0]), ratio(pairs[1])
            hits = sum(y for side in pairs for y, _ in side)
            totals = (sum(x for _, x in pairs[0]), sum(x for _, x in pairs[1]))
            if (found := share_change(role, name, a, b, hits, totals)) is not None:
                out.append(found)
    return out


def share_change(
    role: str, name: str, a: Ratio, b: Ratio, hits: float, totals: tuple[float, float]
) -> Change | None:
    """The rules for a phase share (`hits`: its samples on both sides; `totals`: each side's
    samples of the role): not compared under MIN_SHARE on both sides (None), not tested under
    MIN_SAMPLES, else tested with each side's variance floored at the binomial one. Samples
    within a unit are positively correlated, so a side whose few units happen to agree (all
    zero, say) must not claim more certainty than independent samples would give; the floor
    uses the pooled share. The interval is Newcombe's on each side's share at its effective
    sample size (sidecar/analyze/intervals.py); the floored variances give the degrees of
    freedom."""
    if max(a.value or 0.0, b.value or 0.0) < MIN_SHARE:
        return None
    if hits < MIN_SAMPLES:
        return Change("share", role, name, a.value, b.value, "pp", _minus(b.value, a.value),
                      note=f"{hits:.0f} samples: too few to test")  # fmt: skip
    pooled = hits / max(sum(totals), 1)
    floored = [
        Ratio(r.value, None if r.var is None else max(r.var, pooled * (1 - pooled) / n), r.n)
        if n
        else r
        for r, n in zip((a, b), totals, strict=True)
    ]
    change = change_of("share", role, name, floored[0], floored[1], log=False)
    if change.se is None or a.value is None or b.value is None:
        return change
    score = ((a.value, effective_n(a.value, a.var, totals[0])),
             (b.value, effective_n(b.value, b.var, totals[1])))  # fmt: skip
    return replace(change, score=score)


def costed(shares: Sequence[float], hits: Sequence[float]) -> bool:
    """Whether a busy phase's CPU cost is compared: MIN_BUSY_SHARE of a side's busy samples,
    and MIN_COST_SAMPLES samples on each side."""
    return max(shares) >= MIN_BUSY_SHARE and min(hits) >= MIN_COST_SAMPLES


def _minus(b: float | None, a: float | None) -> float | None:
    return None if a is None or b is None else b - a


def _phase_cpu(u: Unit, role: str, phase: str | None) -> float | None:
    """The role's CPU seconds in this unit, split by its busy samples when `phase` is given."""
    cpu = u.cpu_s.get(role)
    if cpu is None:
        return None
    if phase is None:
        return cpu
    busy = u.busy_samples(role)
    return cpu * u.counts.get(role, {}).get(phase, 0) / busy if busy else 0.0


def _cpu_changes(
    kind: str, ua: Sequence[Unit], ub: Sequence[Unit], per: Callable[[Unit], float | None]
) -> list[Change]:
    """CPU seconds per `per` (a second: cores; 1,000 generated tokens; a request), per role and
    per busy phase. An estimate: each unit's measured CPU of the role, split by its busy
    samples; a phase is compared where it holds MIN_BUSY_SHARE of them and MIN_COST_SAMPLES
    samples on each side."""
    out = []
    for role in _roles(ua, ub):
        if not any(u.cpu_s.get(role) for u in (*ua, *ub)):
            continue  # a role that used no CPU (a helper process) costs nothing to compare
        phases: list[str | None] = [None]
        for phase in Phase:
            if phase.value in WAITING:
                continue
            shares = [ratio((u.counts.get(role, {}).get(phase.value, 0), u.busy_samples(role))
                            for u in us).value or 0.0 for us in (ua, ub)]  # fmt: skip
            hits = [sum(u.counts.get(role, {}).get(phase.value, 0) for u in us) for us in (ua, ub)]
            if costed(shares, hits):
                phases.append(phase.value)
        for name in phases:
            a, b = (
                ratio((y, x) for u in us
                      if (y := _phase_cpu(u, role, name)) is not None and (x := per(u)))
                for us in (ua, ub)
            )  # fmt: skip
            out.append(change_of(kind, role, name or "all", a, b, log=True))
    return out


RATES = (
    ("generation tokens/s", "generation_tokens"),
    ("prompt tokens/s", "prompt_tokens"),
    ("requests/s", "requests"),
)
# Window figures (one reading per window): tested when each side has two windows or more.
LATENCIES = (
    ("TTFT mean", "ttft_mean_s"), ("TTFT p50", "ttft_p50_s"), ("TTFT p95", "ttft_p95_s"),
    ("ITL mean", "itl_mean_s"), ("ITL p50", "itl_p50_s"), ("ITL p95", "itl_p95_s"),
    ("prefill time mean", "prefill_time_mean_s"), ("decode time mean", "decode_time_mean_s"),
    ("queue: requests waiting", "requests_waiting"), ("KV cache usage", "kv_cache_usage"),
    ("preemptions", "preemptions"),
)  # fmt: skip
LATENCY_NAMES = frozenset(name for name, _ in LATENCIES[:8])


def _rate_changes(ua: Sequence[Unit], ub: Sequence[Unit]) -> list[Change]:
    return [
        change_of("serving", None, name, _rate(ua, attr), _rate(ub, attr), log=True)
        for name, attr in RATES
    ]


def _latency_changes(a: Side, b: Side) -> list[Change]:
    out = []
    for name, attr in LATENCIES:
        va, vb = (
            [v for s in side.summaries if (v := getattr(s.serving, attr)) is not None]
            for side in (a, b)
        )
        out.append(window_change(name, va, vb))
    return out


def _rate(us: Sequence[Unit], attr: str) -> Ratio:
    return ratio((v, u.span_s) for u in us if (v := getattr(u, attr)) is not None and u.span_s)


def window_change(name: str, va: list[float], vb: list[float]) -> Change:
    """A figure read once per window: the mean of the windows, Welch on the log scale when
    both sides have two windows or more."""
    logs = [[math.log(x) for x in v if x > 0] for v in (va, vb)]
    la, lb = (Ratio(sum(v) / len(v), _var(v) / len(v) if len(v) > 1 else None, len(v))
              if v else Ratio(None, None, 0) for v in logs)  # fmt: skip
    means = (sum(va) / len(va) if va else None, sum(vb) / len(vb) if vb else None)
    return windows_change(name, means, (len(va), len(vb)), (la, lb))


def windows_change(
    name: str,
    means: tuple[float | None, float | None],
    windows: tuple[int, int],
    logs: tuple[Ratio, Ratio],
) -> Change:
    """The rules for a window figure, from each side's mean, number of windows and the mean of
    its logs (a Ratio over its readings above zero): not tested under two windows a side, nor
    when a side has under two readings above zero; else Welch on the logs."""
    ma, mb = means
    value = mb / ma if ma and mb is not None else None
    if min(windows) < 2:
        return Change("serving", None, name, ma, mb, "ratio", value,
                      note="one window on a side: not tested")  # fmt: skip
    la, lb = logs
    if la.n < 2 or lb.n < 2:
        return Change("serving", None, name, ma, mb, "ratio", value, note="zero on a side")
    test = change_of("serving", None, name, la, lb, log=False)
    return replace(test, a=ma, b=mb, scale="ratio", change=value)


def regressions(comparison: Comparison, threshold: float) -> tuple[Change, ...]:
    """What `--fail-on` fails on: a significant rise of a workload-normalised CPU cost, or of a
    latency tested over windows (or against the deployment's history), by more than
    `threshold` (0.10: 10 %). Nothing when the two sides served different work (the token mix
    moved): a cost per token and a latency then compare unlike requests (longer prompts take
    longer to a first token), not the server."""
    if comparison.mix_differs:
        return ()
    gated = (*comparison.costs, *(c for c in comparison.serving if c.name in LATENCY_NAMES))
    worse = [c for c in gated if c.significant and (c.change or 0) > 1 + threshold]
    return tuple(sorted(worse, key=lambda c: -(c.change or 0)))


# ---------------------------------------------------------------------------------- helpers


def _var(values: Sequence[float]) -> float:
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / (len(values) - 1)


def _sum(values: Iterable[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return sum(found) if found else None


def _div(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def _text(value: object) -> str:
    if value is None or value == ():
        return "unknown"
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value)
    return str(value)

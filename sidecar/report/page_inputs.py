"""The HTML page's edges: what it shows, gathered from a snapshot folder or an output folder,
and the page written.

A snapshot folder gives its summary, its findings and its flame graph. An output folder (the
daemon's store, `OUT` or `OUT/<host>`) gives its latest snapshot's, plus the trend plot of the
seven days up to it and the diff of the latest baseline against it (what `trend --plot` and
`diff --baseline` show). A part that cannot be made becomes a `Missing` with the reason, and the
page says so in its place: a snapshot without stacks still has a page.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TypeVar

from sidecar.advice.rules import AdviceRules
from sidecar.errors import InputError
from sidecar.extras import extra_of, pip_line
from sidecar.records.summary import SnapshotSummary
from sidecar.report.page import DiffView, FindingLike, Missing, PageInputs
from sidecar.store.layout import OutputTree, SnapshotKind
from sidecar.store.summary_io import SUMMARY_NAME, read_summary

TREND_S = 7 * 86400  # the trend plot's span, up to the page's snapshot (trend's --since 7d)
FLAME_MIN_WIDTH = 0.001  # flamegraph's default --min-width (0.1 %)

Note = Callable[[str], None]
_P = TypeVar("_P")


def page_inputs(
    path: Path, host: str | None, generator: str, note: Note, advice: AdviceRules | None = None
) -> PageInputs:
    """The page's inputs for PATH: a snapshot folder, or an output folder (then HOST picks the
    host folder where OUT holds several, as `trend --host` does)."""
    if not path.is_dir():
        raise InputError(
            f"{path} is not a folder: name a snapshot folder or the daemon's output folder"
        )
    if (path / SUMMARY_NAME).is_file():
        return _inputs(path, generator, store=None, note=note, advice=advice)
    store = OutputTree(path).host_folder(host)
    return _inputs(latest_snapshot(store), generator, store=store, note=note, advice=advice)


def latest_snapshot(store: Path) -> Path:
    """The store's latest regular snapshot (the one `diff --baseline` compares), else its
    latest baseline."""
    tree = OutputTree(store)
    latest = tree.latest(SnapshotKind.SNAPSHOT) or tree.latest()
    if latest is None:
        raise InputError(
            f"no snapshot folders under {store}: point at a snapshot folder or the daemon's "
            "output.dir"
        )
    return latest.path


def _inputs(
    folder: Path, generator: str, store: Path | None, note: Note, advice: AdviceRules | None
) -> PageInputs:
    summary = read_summary(folder)
    return PageInputs(
        summary=summary,
        source=str(folder),
        findings=findings_of(summary, advice),
        flame_svg=flame_of(folder),
        trend_png=None
        if store is None
        else _needing_extra("trend plot", trend_of, store, folder, note),
        diff=None if store is None else _needing_extra("diff", diff_of, store),
        generator=generator,
    )


def findings_of(
    summary: SnapshotSummary, advice: AdviceRules | None = None
) -> tuple[FindingLike, ...]:
    """What `report` prints as findings: ADVICE's rules (None: the packaged advice.yaml)."""
    from sidecar.advice.findings import findings

    return tuple(findings(summary, advice))


def _needing_extra(part: str, make: Callable[..., _P], *args: object) -> _P | Missing:
    """MAKE(*ARGS), or a Missing that names the `pip install` when a library of an extra is
    not installed (the core install has no scipy or matplotlib): the rest of the page stands."""
    try:
        return make(*args)
    except ModuleNotFoundError as exc:
        extra = extra_of(exc.name or "")
        if extra is None:
            raise
        return Missing(f"No {part}: it needs {exc.name}, which {pip_line(extra)} installs")


def flame_of(folder: Path) -> str | Missing:
    from sidecar.flame.files import snapshot_svg

    try:
        return snapshot_svg(folder, FLAME_MIN_WIDTH)
    except InputError as exc:
        return Missing(f"No flame graph: {exc}")


def trend_of(store: Path, folder: Path, note: Note) -> bytes | Missing:
    """The trend plot of the TREND_S up to FOLDER's snapshot, as PNG bytes."""
    from sidecar.store.layout import parse_name
    from sidecar.trend.plot import png_bytes, trend_figure
    from sidecar.trend.series import TrendOptions, compute_trend
    from sidecar.trend.source import load_table, summary_reader

    named = parse_name(folder.name)
    end = datetime.fromtimestamp(named[1], UTC) if named else None
    start = datetime.fromtimestamp(named[1] - TREND_S, UTC) if named else None
    try:
        table = load_table(store, note=note)
        # Up to the snapshot itself: the table's time is its window's start, which the folder
        # name gives to the second (truncated).
        options = TrendOptions(start=start, end=None if end is None else end + timedelta(seconds=1))
        # The level changes as `trend` reports them: each tested by diff on its windows.
        windows = summary_reader(store, note)
        result = compute_trend(table.to_pandas(), options, host=store.name, windows=windows)
    except InputError as exc:
        return Missing(f"No trend: {exc}")
    return png_bytes(trend_figure(result))


def diff_of(store: Path) -> DiffView | Missing:
    """The latest baseline against the latest snapshot, as `diff --baseline STORE` has it."""
    from sidecar.analyze.compare import compare
    from sidecar.diff.sides import baseline_sides, history_of
    from sidecar.diff.text import SIGNIFICANT_HEADERS, caveats, significant_rows, verdict

    folders = OutputTree(store).snapshots()
    baselines = sum(1 for f in folders if f.kind is SnapshotKind.BASELINE)
    if not baselines or baselines == len(folders):
        return Missing(
            f"No diff: {store} holds {baselines} baselines and {len(folders) - baselines} "
            "snapshots; the diff needs one of each (`vllm-sidecar run` writes a baseline "
            "every hour)"
        )
    a, b = baseline_sides(store)
    c = compare(a, b, history=history_of(a, b))
    return DiffView(
        a=a.label,
        b=b.label,
        verdict=tuple(verdict(c)),
        headers=SIGNIFICANT_HEADERS,
        significant=tuple(tuple(row) for row in significant_rows(c)),
        caveats=tuple(caveats(c)),
    )


def write_page(text: str, path: Path) -> None:
    from sidecar.flame.files import write_files

    write_files([(path, text)])


def default_name(inputs: PageInputs) -> Path:
    return Path(f"report-{inputs.summary.name}.html")

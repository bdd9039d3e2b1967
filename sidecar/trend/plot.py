"""The trend as a PNG: one panel of phase shares per role, one of throughput, one of latency;
baselines as ticks along each panel's foot, fingerprint changes as labelled dashed lines,
level changes as triangles. matplotlib (Agg, no display) is imported here only.

Artists that tests look for carry a gid: "baselines" (one LineCollection per panel, a segment
per baseline), "fingerprint" (a line per change, per panel), "changes" (a change point's
markers), "points" (a series' line).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: a daemon host has no display

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from sidecar.store.atomic import write_file
from sidecar.store.trend_table import CUSTOM_PREFIX
from sidecar.trend.series import ROLES, Trend, short_name

PANEL_H = 2.4  # inches per panel
MANY_BASELINES = 40  # beyond this, baselines are ticks at the foot rather than full lines
LABEL_CHARS = 60
LABEL_BOX = {"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}
GAP_FACTOR = 3.0  # a gap: points further apart than this many times their median spacing


def trend_figure(trend: Trend) -> Figure:
    names = [s.name for s in trend.series]
    panels: list[tuple[str, list[str], float]] = [
        (f"{role}: share of samples (%)", [n for n in names if n.startswith(f"share.{role}.")],
         100.0)
        for role in ROLES
    ]  # fmt: skip
    other_shares = [n for n in names if n.startswith("main.") or n.startswith("share.other.")]
    panels.append(("other shares (%)", other_shares, 100.0))
    custom = [n for n in names if n.startswith(CUSTOM_PREFIX)]  # before the suffix rules below
    panels.append(("custom metrics (as configured)", custom, 1.0))
    panels.append(("throughput (per s)",
                   [n for n in names if n.endswith("per_s") and n not in custom], 1.0))  # fmt: skip
    latency = [n for n in names if n.endswith("_s") and not n.endswith("per_s")
               and n not in custom]  # fmt: skip
    panels.append(("latency (ms)", latency, 1000.0))
    plain = [n for n in names if not any(n in p[1] for p in panels)]
    panels.append(("other figures", plain, 1.0))
    panels = [p for p in panels if p[1]]
    fig, axes = plt.subplots(len(panels) or 1, 1, sharex=True, squeeze=False,
                             figsize=(13, PANEL_H * max(len(panels), 1) + 0.8))  # fmt: skip
    for ax, (title, series, scale) in zip(axes[:, 0], panels, strict=False):
        _panel(ax, trend, title, series, scale)
        _marks(ax, trend, label=ax is axes[0, 0])
    rows = trend.rows
    fig.suptitle(
        f"vllm-sidecar trend: {trend.host}, {len(rows)} snapshots "
        f"({len(trend.baselines)} baselines), {rows.index[0]:%Y-%m-%d %H:%M} to "
        f"{rows.index[-1]:%Y-%m-%d %H:%M} UTC",
        fontsize=11,
        y=1 - 0.15 / fig.get_figheight(),
        va="top",
    )
    bottom = axes[-1, 0]
    bottom.xaxis_date()
    locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
    bottom.xaxis.set_major_locator(locator)
    bottom.xaxis.set_major_formatter(mdates.ConciseDateFormatter(locator))  # type: ignore[no-untyped-call]
    fig.text(0.01, 0.005, _key(trend), fontsize=8, color="0.3")
    # Fixed margins (the legends sit right of the panels): tight_layout would draw it twice.
    height = fig.get_figheight()
    fig.subplots_adjust(left=0.06, right=0.83, top=1 - 0.8 / height, bottom=0.6 / height,
                        hspace=0.35)  # fmt: skip
    return fig


def save_png(fig: Figure, path: Path) -> None:
    """The figure as a PNG file, written atomically (sidecar/store/atomic.py); it is closed."""
    try:
        write_file(path, lambda handle: fig.savefig(handle, format="png", dpi=100),
                   durable=False)  # fmt: skip
    finally:
        plt.close(fig)


def png_bytes(fig: Figure) -> bytes:
    """The figure as PNG bytes, for a page that embeds it (a data: URI); the figure is closed."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def _key(trend: Trend) -> str:
    many = len(trend.baselines) > MANY_BASELINES
    parts = [("grey ticks at the foot" if many else "grey dotted lines") + ": baselines"]
    if trend.fingerprint_changes:
        parts.append("red dashed: the fingerprint changed")
    parts.append("triangles: a series changed level (at its new level)")
    if trend.bucket_s is not None:
        parts.append(f"lines: {trend.bucket_s // 60:g}-minute medians, dots: the snapshots")
    return "; ".join(parts)


def _panel(ax: Axes, trend: Trend, title: str, series: list[str], scale: float) -> None:
    changes = {s.name: s.changes for s in trend.series}
    for name in series:
        raw = trend.rows[name].dropna()
        points = with_gaps(trend.points[name].dropna())
        (line,) = ax.plot(_x(points.index), points.to_numpy() * scale, lw=1.2,
                          label=short_name(name), gid="points")  # fmt: skip
        if trend.bucket_s is not None:  # the snapshots behind the medians, faint
            ax.scatter(_x(raw.index), raw.to_numpy() * scale, s=2, alpha=0.15,
                       color=line.get_color(), linewidths=0)  # fmt: skip
        found = changes.get(name, ())
        if found:
            ax.plot(_x([c.time for c in found]), [c.after * scale for c in found], "v", ms=9,
                    color=line.get_color(), markeredgecolor="black", gid="changes")  # fmt: skip
    ax.set_title(title, fontsize=9, loc="left")
    ax.grid(alpha=0.3)
    ax.tick_params(labelsize=8)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)


def with_gaps(points: pd.Series, factor: float = GAP_FACTOR) -> pd.Series:
    """POINTS (time-indexed, without NaN) with a NaN midway across each gap, so that the line
    breaks there rather than drawing hours without snapshots (the sidecar down, the target
    gone) as a straight, smooth change. A gap: consecutive points more than FACTOR times the
    median spacing apart (a store's `gaps`, recorded by record_gap, are such holes too)."""
    if len(points) < 3:
        return points
    index = pd.DatetimeIndex(points.index)
    steps = np.diff(index.asi8)
    usual = float(np.median(steps))
    wide = np.flatnonzero(steps > factor * usual)
    if usual <= 0 or not len(wide):
        return points
    middles = index[wide] + (index[wide + 1] - index[wide]) / 2
    breaks = pd.Series(np.nan, index=middles, name=points.name, dtype=float)
    return pd.concat([points.astype(float), breaks]).sort_index()


def _marks(ax: Axes, trend: Trend, *, label: bool) -> None:
    if trend.baselines:
        top = 0.05 if len(trend.baselines) > MANY_BASELINES else 1.0
        ax.vlines(_x(trend.baselines), 0, top, transform=ax.get_xaxis_transform(),
                  colors="0.5", lw=0.6, linestyles="-" if top < 1 else ":",
                  gid="baselines")  # fmt: skip
    first, last = trend.rows.index[0], trend.rows.index[-1]
    for k, change in enumerate(trend.fingerprint_changes):
        ax.axvline(float(_x([change.time])[0]), color="crimson", ls="--", lw=1.2, gid="fingerprint")
        if not label:
            continue
        text = change.label
        if len(text) > LABEL_CHARS:
            text = text[: LABEL_CHARS - 1] + "…"
        # Left of the line in the last 40% (clear of the legend); staggered down, so that
        # changes close in time keep readable labels.
        late = change.time > first + 0.6 * (last - first)
        x = float(_x([change.time])[0])
        ax.annotate(text, (x, 1.0), xycoords=("data", "axes fraction"),
                    xytext=(-3 if late else 3, -3 - 12 * (k % 4)), textcoords="offset points",
                    va="top", ha="right" if late else "left", fontsize=8, color="crimson",
                    clip_on=False, bbox=LABEL_BOX)  # fmt: skip


def _x(times: Sequence[pd.Timestamp] | pd.Index) -> npt.NDArray[np.float64]:
    """Times as matplotlib's date numbers, in one vectorised step: given tz-aware pandas times,
    matplotlib converts them one datetime object at a time (3 s of a 30-day plot)."""
    index = pd.DatetimeIndex(times)
    naive = index.tz_convert("UTC").tz_localize(None) if index.tz is not None else index
    return np.asarray(mdates.date2num(naive.to_numpy()), dtype=np.float64)  # type: ignore[no-untyped-call]

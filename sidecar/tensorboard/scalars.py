"""`vllm-sidecar export tensorboard OUT --logdir DIR`: a store's snapshots as TensorBoard
scalars, one step per snapshot, at the snapshot's wall time.

    folders   every snapshot folder under OUT (a host folder, or each host in output.dir)
    read      each summary.json, of any schema (`summary_io`); an unreadable one is skipped
              with a warning that names it
    scalars   summary -> {tag: value} (`scalars`, pure): phase shares per role, serving
              figures, memory, CPU, GPU utilisation, sampling, findings, custom metrics
    runs      one TensorBoard run per host folder and deployment, DIR/<host>/<deployment>
              (the daemon names host folders after the host; OUT of `snapshot --out`
              is its own host folder and gives its name); steps
              0..n-1 in time order, each event at the window's start (summary `created_at`)
    write     each run written whole under a temporary name and swapped in (`tb_writer`)

Idempotent by rewriting: each export writes every run it has snapshots for anew, so exporting
the same OUT twice leaves the same steps (never two events of one tag at one step), and a new
export after more windows adds them. A run whose snapshots retention has since deleted stays
as it was. TensorBoard that is watching the folder sees a new event file whose steps start at
0 again and drops what it had read from the old one (its "purge orphaned data" rule).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from sidecar.advice.findings import findings
from sidecar.advice.rules import Severity
from sidecar.analyze.breakdown import memory_rows
from sidecar.errors import InputError
from sidecar.records.summary import SnapshotSummary
from sidecar.store.layout import OutputTree, parse_name, snapshot_names
from sidecar.store.trend_table import SERVING
from sidecar.tensorboard.event_files import Step, write_run

Note = Callable[[str], None]
GIB = 2**30
UNKNOWN_DEPLOYMENT = "unknown-deployment"  # schema 1 and 2 summaries name none
SHARE_TAGS = ("share/", "main/")


@dataclass(frozen=True, slots=True)
class RunWritten:
    path: Path
    steps: int
    first: str  # the first and last snapshot folders' names
    last: str


def scalars(s: SnapshotSummary) -> dict[str, float]:
    """Every figure of a snapshot TensorBoard plots, by tag; missing figures have no tag."""
    out: dict[str, float] = {}
    for prefix, section in (("share", s.by_role), ("main", s.main_thread)):
        for role, shares in section.items():
            out.update({f"{prefix}/{role}/{phase}": v for phase, v in shares.items()})
    out.update({f"serving/{f}": v for f in SERVING if (v := getattr(s.serving, f)) is not None})
    out.update(_memory(s))
    for p in s.resources.processes:
        if p.cpu_share is not None:  # cores: the role's processes' CPU over the window
            out[f"cpu/{p.role}_cores"] = out.get(f"cpu/{p.role}_cores", 0.0) + p.cpu_share
    utils = [u.mean_pct for u in s.gpu.utilization if u.mean_pct is not None]
    if utils:
        out["gpu/util_pct"] = sum(utils) / len(utils)
    out["sampling/samples"] = float(s.samples)
    out["sampling/duration_s"] = s.sampling.duration_s
    out["sampling/behind_s"] = s.sampling.behind_s
    out["sampling/partial"] = float(s.sampling.partial)
    if s.sampling.sampler_cpu_share is not None:
        out["sampling/sampler_cpu_share"] = s.sampling.sampler_cpu_share
    return out | _findings(s) | _custom(s)


def _memory(s: SnapshotSummary) -> dict[str, float]:
    """GiB: the host's used memory, the target's GPUs' (summed), the KV cache, RSS per role."""
    out: dict[str, float] = {}
    for r in memory_rows(s):
        used = r["used_bytes"]
        if used is None:
            continue
        if r["item"] == "device":
            key = "host" if r["device"] == "host" else "gpu"
            out[f"memory/{key}_used_gib"] = out.get(f"memory/{key}_used_gib", 0.0) + used / GIB
            if r["total_bytes"]:
                total = f"memory/{key}_total_gib"
                out[total] = out.get(total, 0.0) + r["total_bytes"] / GIB
        elif r["item"] == "process" and r["device"] == "host":
            key = f"memory/rss_gib/{r['role']}"
            out[key] = out.get(key, 0.0) + used / GIB
        elif r["item"] == "kv_cache":
            out["memory/kv_cache_gib"] = used / GIB
            if r["share_of_total"] is not None:
                out["memory/kv_cache_share"] = r["share_of_total"]
    return out


def _findings(s: SnapshotSummary) -> dict[str, float]:
    """How many findings fire, in all and per severity (the packaged advice rules)."""
    found = findings(s)
    out = {"findings/count": float(len(found))}
    for severity in Severity:
        out[f"findings/{severity.value}"] = float(sum(f.severity == severity for f in found))
    return out


def _custom(s: SnapshotSummary) -> dict[str, float]:
    """The operator's own series (schema 4's `custom` section: name, kind, value, unit,
    source), one tag each; none before schema 4."""
    metrics = getattr(s, "custom", ())
    return {f"custom/{m.name}": float(m.value) for m in metrics if m.value is not None}


# ---------------------------------------------------------------------------------- export


def export_tensorboard(
    out: Path, logdir: Path, host: str | None = None, note: Note = lambda _: None
) -> list[RunWritten]:
    """Every snapshot under OUT as steps of runs DIR/<host>/<deployment>, each run rewritten."""
    if logdir.exists() and not logdir.is_dir():
        raise InputError(f"--logdir {logdir} is a file: give a folder for TensorBoard's runs")
    started = time.perf_counter()
    runs: dict[tuple[str, str], list[tuple[float, str, dict[str, float]]]] = {}
    for folder, summary in _summaries(out, host, note):
        key = (folder.parent.name, summary.deployment or UNKNOWN_DEPLOYMENT)
        runs.setdefault(key, []).append((_wall(summary), folder.name, scalars(summary)))
    written = []
    for (host_name, deployment), rows in sorted(runs.items()):
        rows.sort(key=lambda r: (r[0], r[1]))
        shares = _share_tags(values for _, _, values in rows)
        steps = [Step(i, wall, _with_zeros(values, shares)) for i, (wall, _, values) in
                 enumerate(rows)]  # fmt: skip
        path = logdir / _safe(host_name) / _safe(deployment)
        write_run(path, steps)
        written.append(RunWritten(path, len(steps), rows[0][1], rows[-1][1]))
    note(f"exported {sum(r.steps for r in written)} snapshots into {len(written)} runs in "
         f"{time.perf_counter() - started:.1f} s")  # fmt: skip
    return written


def _share_tags(steps: Iterable[dict[str, float]]) -> dict[str, set[str]]:
    """`share/<role>` and `main/<role>` -> every phase tag of the run under it."""
    out: dict[str, set[str]] = {}
    for values in steps:
        for tag in values:
            if tag.startswith(SHARE_TAGS):
                out.setdefault(tag.rpartition("/")[0], set()).add(tag)
    return out


def _with_zeros(values: dict[str, float], shares: dict[str, set[str]]) -> dict[str, float]:
    """A summary lists only the phases a role was seen in: where the role was sampled, a phase
    another step of the run has is 0 here, not missing (TensorBoard would draw a line across
    the gap)."""
    seen = {tag.rpartition("/")[0] for tag in values if tag.startswith(SHARE_TAGS)}
    zeros = {tag: 0.0 for role in seen for tag in shares.get(role, ()) if tag not in values}
    return values | zeros


def _summaries(out: Path, host: str | None, note: Note) -> Iterator[tuple[Path, SnapshotSummary]]:
    from sidecar.store.summary_io import read_summary

    for host_dir in OutputTree(out).host_folders(host):
        names = sorted(snapshot_names(host_dir), key=_order)
        for name in names:
            try:
                yield host_dir / name, read_summary(host_dir / name)
            except InputError as exc:
                note(f"warning: skipped {host_dir / name}: {exc}")


def _order(name: str) -> tuple[float, int, str]:
    parsed = parse_name(name)
    return (parsed[1], parsed[2], name) if parsed else (0.0, 0, name)


def _wall(s: SnapshotSummary) -> float:
    when = datetime.fromisoformat(s.created_at)
    return (when.replace(tzinfo=UTC) if when.tzinfo is None else when).timestamp()


def _safe(name: str) -> str:
    """A folder name from a host or deployment (a served model name may hold `/`)."""
    return re.sub(r"[^A-Za-z0-9._@+-]", "_", name).lstrip(".") or "_"

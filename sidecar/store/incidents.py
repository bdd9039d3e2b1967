"""Incidents: what a stall leaves on disk, kept like a baseline.

OUT/<host>/incidents/<UTC>-stall/ holds a `py-spy dump --native` of every process of the
deployment (`dump-PID-ROLE.txt`, each headed by how it was taken) and the dumps' stacks as a
snapshot (summary.json with its `cause`, stacks.parquet, stacks.collapsed), so `report`,
`explain` and `flame` read it as they read any snapshot folder. The folder is apart from the
scheduled snapshots (their readers do not mistake it for a window) and kept for
`output.baseline_retention_days`.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

from sidecar import outproc
from sidecar.classify.classifier import Classifier
from sidecar.errors import OutputError
from sidecar.parsers import InputFormat, parse_text
from sidecar.records import ProcessInfo, StackSample
from sidecar.records.summary import Cause
from sidecar.records.window import SamplingMode, Window
from sidecar.store.atomic import make_folder
from sidecar.store.writers import write_snapshot
from sidecar.window.snapshot import Snapshot, build_snapshot

INCIDENTS = "incidents"


def incident_snapshot(
    dumps: Mapping[int, tuple[str, str]],
    processes: tuple[ProcessInfo, ...],
    classifier: Classifier,
    cause: Cause,
    wall: float,
    deployment: str | None = None,
) -> Snapshot:
    """The dumps' stacks (one per thread) as a snapshot with its cause."""
    stacks: list[StackSample] = []
    warnings: list[str] = []
    for pid, (_, text) in dumps.items():
        parsed = parse_text(text, f"dump of {pid}", InputFormat.PYSPY_DUMP)
        stacks.extend(replace(s, pid=s.pid or pid, source=None) for s in parsed.stacks)
        warnings.extend(parsed.warnings[:2])
    window = Window(started_at=wall, duration_s=0.0, rate_hz=0.0, stacks=tuple(stacks),
                    samples=sum(s.weight for s in stacks), errors=0, sampler_cpu_s=0.0,
                    segments=0, warnings=tuple(warnings), mode=SamplingMode.DUMP)  # fmt: skip
    snapshot = build_snapshot(window, processes, classifier, deployment=deployment)
    return replace(snapshot, cause=cause)


def write_incident(
    host_dir: Path,
    snapshot: Snapshot,
    dumps: Mapping[int, tuple[str, str]],
    processes: tuple[ProcessInfo, ...],
    min_free_bytes: int,
) -> Path:
    """The incident's folder under HOST_DIR/incidents/; OutputError when the disk is low (the
    stall is still logged and exported) or the folder cannot be written."""
    folder = host_dir / INCIDENTS
    make_folder(folder)  # 0750, as every folder of the store
    free = shutil.disk_usage(folder).free
    if free < min_free_bytes:
        raise OutputError(f"incident not written: {free / 2**20:.0f} MiB free under {folder}, "
                          f"below output.min_free_mb; free space there")  # fmt: skip
    roles = {p.pid: p.role.value for p in processes}
    extra = {f"dump-{pid}-{roles.get(pid, 'other')}.txt": f"# {how}\n{text}"
             for pid, (how, text) in dumps.items()}  # fmt: skip
    kind = snapshot.cause.kind if snapshot.cause else "incident"
    name = f"{snapshot.name}-{kind}"
    written = outproc.call(
        lambda: str(write_snapshot(snapshot, folder, name=name, kind="incident", extra=extra))
    )
    return Path(written)


def prune_incidents(host_dir: Path, max_age_s: float | None, now: float | None = None) -> int:
    """Delete incident folders older than `max_age_s` (baselines' retention); how many."""
    if max_age_s is None:
        return 0
    now = time.time() if now is None else now
    deleted = 0
    with contextlib.suppress(OSError):
        for path in (host_dir / INCIDENTS).iterdir():
            if path.is_dir() and now - path.stat().st_mtime > max_age_s:
                shutil.rmtree(path, ignore_errors=True)
                deleted += 1
    return deleted

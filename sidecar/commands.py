"""What the CLI's commands do, wired from their parts: target -> sampler -> snapshot -> writers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.classifier import Classifier
from sidecar.collect import Collector, host_procfs, metrics_source_for, open_gpu_reader
from sidecar.discovery import resolve_target
from sidecar.procfs import ProcFs
from sidecar.pyspy import SubprocessPySpy, whole_rate
from sidecar.rules import load_rules
from sidecar.sampler import RateController, Sampler
from sidecar.writers import write_snapshot

if TYPE_CHECKING:
    from sidecar.cli import SnapshotConfig

log = logging.getLogger("vllm_sidecar")


# The first words of the line `snapshot` prints on stderr when sampling begins (the demo waits
# for it to start its load).
SAMPLING_LINE = "sampling vLLM"


def take_snapshot(
    config: SnapshotConfig, progress: Callable[[str], None] | None = None
) -> tuple[Path, dict[str, Any]]:
    """One window, written; `progress` hears when py-spy has attached and sampling begins."""
    rules = load_rules(config.rules)  # a broken rules file fails before anything is attached
    procfs = ProcFs(config.proc_root)
    target = resolve_target(procfs, config.pid, config.any_python)
    runner = SubprocessPySpy.find(config.py_spy)
    if progress is not None:
        say = progress
        runner = replace(runner, on_sampling=lambda r, attach_s: say(
            f"{SAMPLING_LINE} {r.pid} for {r.duration_s:g} s at {whole_rate(r.rate_hz)} Hz "
            f"(py-spy attached in {attach_s:.1f} s)"))  # fmt: skip
    sampler = Sampler(
        runner=runner,
        pid=target.root.pid,
        controller=RateController(rate_hz=config.rate_hz, budget=config.cpu_budget),
        segment_s=5.0 if config.cpu_budget else config.duration_s,
        alive=lambda: target.still_alive(procfs),
    )
    collector = Collector(
        target=target,
        sampler=sampler,
        classifier=Classifier(rules),
        procfs=procfs,
        metrics=metrics_source_for(target, config.metrics_url, timeout_s=2.0),
        gpu=open_gpu_reader(config.gpu),
        host_procfs=host_procfs(config.host_proc_root),
    )
    try:
        snap = collector.collect(config.duration_s)
    finally:
        if collector.gpu:
            collector.gpu.close()
    folder = write_snapshot(snap, config.out)
    if snap.window.partial:
        log.warning("partial window: %s", snap.window.partial_reason)
    return folder, snap.summary_dict()

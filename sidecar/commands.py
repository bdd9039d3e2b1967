"""What the CLI's commands do, wired from their parts: target -> sampler -> snapshot -> writers."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.records.summary import SnapshotSummary
from sidecar.sampling.pyspy import SubprocessPySpy, whole_rate
from sidecar.sampling.sampler import RateController, Sampler
from sidecar.store.writers import write_snapshot
from sidecar.target.discovery import configured_target
from sidecar.target.procfs import ProcFs
from sidecar.vllm_metrics import HttpMetricsSource
from sidecar.vllm_metrics.custom import custom_reader
from sidecar.window.pipeline import (
    WindowReaders,
    host_procfs,
    metrics_for,
    open_gpu_reader,
    profile_window,
)

if TYPE_CHECKING:
    from sidecar.config.settings import Config, SnapshotOptions

log = logging.getLogger("vllm_sidecar")


# The first words of the line `snapshot` prints on stderr when sampling begins (the demo waits
# for it to start its load).
SAMPLING_LINE = "sampling vLLM"


def take_snapshot(
    config: Config, options: SnapshotOptions, progress: Callable[[str], None] | None = None
) -> tuple[Path, SnapshotSummary]:
    """One window, written; `progress` hears when py-spy has attached and sampling begins."""
    rules = load_rules(config.rules)  # a broken rules file fails before anything is attached
    procfs = ProcFs(config.target.proc_root)
    target = configured_target(procfs, config.target)
    runner = SubprocessPySpy.find(config.sampling.py_spy)
    if progress is not None:
        say = progress
        runner = replace(runner, on_sampling=lambda r, attach_s: say(
            f"{SAMPLING_LINE} {r.pid} for {r.duration_s:.3g} s at {whole_rate(r.rate_hz)} Hz "
            f"(py-spy attached in {attach_s:.1f} s)"))  # fmt: skip
    budget = config.sampling.cpu_budget
    sampler = Sampler(
        runner=runner,
        pid=target.root.pid,
        controller=RateController(rate_hz=config.sampling.rate_hz, budget=budget),
        segment_s=min(config.sampling.segment_s, options.duration_s),
        alive=lambda: target.still_alive(procfs),
    )
    url = config.metrics.url
    configured = HttpMetricsSource(url, timeout_s=config.metrics.timeout_s) if url else None
    metrics, unread = metrics_for(target, configured, config.metrics.timeout_s)
    if unread is not None:
        log.warning("vLLM's /metrics will not be read: %s", unread)
    custom = custom_reader(config.custom_metrics, config.metrics.timeout_s,
                           metrics.url if metrics else None)  # fmt: skip
    readers = WindowReaders(procfs=procfs, metrics=metrics, metrics_unread=unread,
                            gpu=open_gpu_reader(config.gpu), custom=custom,
                            host_procfs=host_procfs(config.target.host_proc))  # fmt: skip
    began = time.monotonic()
    try:
        snap = profile_window(target, sampler, Classifier(rules), readers, options.duration_s)
    finally:
        if readers.gpu:
            readers.gpu.close()
    folder = write_snapshot(snap, options.out)
    if progress is not None:  # where a slow window's time went, for the operator
        w = snap.window
        progress(
            f"sampled {w.duration_s:.1f} s in {w.segments} segments over {w.elapsed_s:.1f} s "
            f"(py-spy attach {w.attach_s:.1f} s); read, classified and written in "
            f"{time.monotonic() - began - w.elapsed_s:.1f} s"
        )
    if snap.window.partial:
        log.warning("partial window: %s", snap.window.partial_reason)
    return folder, snap.summary()

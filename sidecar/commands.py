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
from sidecar.store.writers import write_snapshot
from sidecar.target.discovery import configured_target
from sidecar.target.procfs import ProcFs
from sidecar.window.pipeline import profile_window
from sidecar.window.readers import configured_metrics, open_gpu_reader, readers_for, sampler_for

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
    sampler = sampler_for(config, runner, target, options.duration_s,
                          alive=lambda: target.still_alive(procfs))  # fmt: skip
    readers = readers_for(config, target, procfs, open_gpu_reader(config.gpu),
                          configured_metrics(config))  # fmt: skip
    if readers.metrics_unread is not None:
        log.warning("vLLM's /metrics will not be read: %s", readers.metrics_unread)
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

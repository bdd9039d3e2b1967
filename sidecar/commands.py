"""What the CLI's commands do, wired from their parts: target -> sampler -> snapshot -> writers."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.classifier import Classifier
from sidecar.collect import Collector, host_procfs, metrics_source_for, open_gpu_reader
from sidecar.discovery import Deployment, discover, find_deployment, no_server_error
from sidecar.errors import AttachError, ConfigError
from sidecar.procfs import ProcFs
from sidecar.records.summary import SnapshotSummary
from sidecar.rules import load_rules
from sidecar.sampler import RateController, Sampler, SubprocessPySpy, whole_rate
from sidecar.writers import write_snapshot

if TYPE_CHECKING:
    from sidecar.config import Config, SnapshotOptions, TargetConfig

log = logging.getLogger("vllm_sidecar")


def resolve_target(procfs: ProcFs, pid: int | None, any_python: bool = False) -> Deployment:
    if pid is not None:
        return find_deployment(procfs, pid, allow_non_vllm=any_python)
    found = discover(procfs)
    if not found:
        raise no_server_error(procfs)
    if len(found) > 1:
        listing = "; ".join(f"pid {d.root.pid} ({d.root.title[:60]})" for d in found)
        raise ConfigError(f"found {len(found)} vLLM servers: {listing}. Pick one with --pid.")
    return found[0]


def configured_target(procfs: ProcFs, t: TargetConfig) -> Deployment:
    """The deployment a daemon config names: its pid, the pid in its pid file, or discovery."""
    pid = t.pid
    if t.pid_file is not None:
        pid = read_pid_file(t.pid_file)
    elif pid is None and not t.discover:
        raise ConfigError("no target: set target.pid, target.pid_file or target.discover")
    return resolve_target(procfs, pid, t.any_python)


def read_pid_file(path: Path) -> int:
    try:
        return int(path.read_text().split()[0])
    except FileNotFoundError:
        raise AttachError(f"pid file {path} does not exist (yet): is vLLM running?") from None
    except (OSError, ValueError, IndexError) as exc:
        raise AttachError(f"pid file {path} holds no PID: {exc}") from None


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
            f"{SAMPLING_LINE} {r.pid} for {r.duration_s:g} s at {whole_rate(r.rate_hz)} Hz "
            f"(py-spy attached in {attach_s:.1f} s)"))  # fmt: skip
    budget = config.sampling.cpu_budget
    sampler = Sampler(
        runner=runner,
        pid=target.root.pid,
        controller=RateController(rate_hz=config.sampling.rate_hz, budget=budget),
        segment_s=5.0 if budget else options.duration_s,
        alive=lambda: target.still_alive(procfs),
    )
    collector = Collector(
        target=target,
        sampler=sampler,
        classifier=Classifier(rules),
        procfs=procfs,
        metrics=metrics_source_for(target, config.metrics.url, config.metrics.timeout_s),
        gpu=open_gpu_reader(config.gpu),
        host_procfs=host_procfs(config.target.host_proc),
    )
    try:
        snap = collector.collect(options.duration_s)
    finally:
        if collector.gpu:
            collector.gpu.close()
    folder = write_snapshot(snap, options.out)
    if snap.window.partial:
        log.warning("partial window: %s", snap.window.partial_reason)
    return folder, snap.summary()

"""Process and host readings through psutil (the OS boundary here, injected as `PsutilReader`).

The KV cache's arithmetic is `sidecar.target.kvcache`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import psutil

from sidecar.records import ProcessInfo
from sidecar.records.readings import HostMemory, ProcessStats

log = logging.getLogger("vllm_sidecar")


class PsutilReader:
    """CPU time at the window's start and end; memory and threads at its end."""

    def __init__(self) -> None:
        self._start: dict[tuple[int, int], float] = {}

    def start(self, processes: Iterable[ProcessInfo]) -> None:
        self._start = {p.key: t for p in processes if (t := _cpu_time(p.pid)) is not None}

    def finish(self, processes: Iterable[ProcessInfo], window_s: float) -> tuple[ProcessStats, ...]:
        return tuple(self._stats(p, window_s) for p in processes)

    def _stats(self, p: ProcessInfo, window_s: float) -> ProcessStats:
        try:
            proc = psutil.Process(p.pid)
            with proc.oneshot():
                rss, threads = proc.memory_info().rss, proc.num_threads()
                cpu = sum(proc.cpu_times()[:2])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return ProcessStats(p.pid, p.role.value, None, None, None, None)
        start = self._start.get(p.key)
        used = cpu - start if start is not None else None
        share = used / window_s if used is not None and window_s > 0 else None
        return ProcessStats(p.pid, p.role.value, rss, used, share, threads)

    @staticmethod
    def host_memory() -> HostMemory:
        vm = psutil.virtual_memory()
        return HostMemory(total_bytes=vm.total, available_bytes=vm.available, used_bytes=vm.used)


def cpu_time(pid: int) -> float | None:
    """User + system CPU seconds of PID, all its threads; None when it cannot be read."""
    return _cpu_time(pid)


def _cpu_time(pid: int) -> float | None:
    try:
        return float(sum(psutil.Process(pid).cpu_times()[:2]))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None

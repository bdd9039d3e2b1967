"""A snapshot's memory and computation as tidy rows: one row per item, units in the column
names. The Python interface (`sidecar.api`) turns them into pandas DataFrames; the rows are
plain dicts built from the typed summary alone, so any schema version gives them and they can
be tested without pandas.

Memory is in long form: one row per (item, device), so a process that holds host memory (RSS)
and GPU memory is two rows, and `df.groupby("device")` or a pivot gives either view.
"""

from __future__ import annotations

from typing import Any

from sidecar.records.gpu import GpuDevice, GpuProcess
from sidecar.records.summary import SnapshotSummary

MEMORY_COLUMNS = ("item", "role", "pid", "device", "name", "used_bytes", "total_bytes",
                  "share_of_total")  # fmt: skip
COMPUTATION_COLUMNS = ("scope", "role", "phase", "samples", "share_of_role")
# scope: "all_threads" (every thread of the role: the report's table) or "main_thread" (each
# process's main thread: where the engine loop, the model step and the event loop run).
SCOPES = {"all_threads": "by_role", "main_thread": "main_thread"}


def memory_rows(s: SnapshotSummary) -> list[dict[str, Any]]:
    """Devices (the host, then each GPU NVML read), each process on each device, and the KV
    cache. `share_of_total` is used over the device's total (the KV cache's: over the memory
    of the devices it lives on, as the report's share)."""
    rows = _device_rows(s)
    rss = {p.pid: p.rss_bytes for p in s.resources.processes}
    on_gpu = _gpu_memory_by_pid(s.gpu.devices)
    for proc in s.target.processes:
        role = proc.role.value
        rows.append(_row("process", role, proc.pid, "host", proc.title, rss.get(proc.pid)))
        for label, used in sorted(on_gpu.get(proc.pid, {}).items()):
            rows.append(_row("process", role, proc.pid, label, proc.title, used))
    kv = s.kv_cache
    if kv is not None and kv.bytes:
        where = kv.share_of or "host"
        name = ", ".join(kv.share_devices) or where
        rows.append(_row("kv_cache", "kv_cache", None, where, name, kv.bytes, share=kv.share))
    return rows


def computation_rows(s: SnapshotSummary) -> list[dict[str, Any]]:
    """Phase shares per role, for all threads and for the main threads. `samples` is the
    count behind an all-threads share (the summary keeps the role's total); the summary keeps
    no such total for the main threads, so theirs is None."""
    rows = []
    for scope, section in SCOPES.items():
        for role, shares in getattr(s, section).items():
            total = s.role_samples.get(role) if scope == "all_threads" else None
            for phase, share in shares.items():
                samples = round(total * share) if total is not None else None
                rows.append({"scope": scope, "role": role, "phase": phase,
                             "samples": samples, "share_of_role": share})  # fmt: skip
    return rows


def _device_rows(s: SnapshotSummary) -> list[dict[str, Any]]:
    rows = []
    host = s.resources.host_memory
    if host is not None:
        used = host.total_bytes - host.available_bytes
        rows.append(_row("device", None, None, "host", "host memory", used, host.total_bytes))
    mine = set(s.gpu.target.labels) if s.gpu.target is not None else None
    for d in s.gpu.devices:
        if mine is None or d.label in mine:  # the target's GPUs, all of them when unknown
            rows.append(_row("device", None, None, d.label, d.name, d.memory_used_bytes,
                             d.memory_total_bytes))  # fmt: skip
    return rows


def _gpu_memory_by_pid(devices: tuple[GpuDevice, ...]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {}
    for d in devices:
        for p in d.processes:
            if p.target_pid is not None and p.used_memory_bytes is not None:
                mine = out.setdefault(p.target_pid, {})
                label = _label(p)
                mine[label] = mine.get(label, 0) + p.used_memory_bytes
    return out


def _label(p: GpuProcess) -> str:
    return f"gpu{p.device_index}" + (f"/mig{p.mig_index}" if p.mig_index is not None else "")


def _row(item: str, role: str | None, pid: int | None, device: str, name: str | None,
         used: int | None, total: int | None = None,
         share: float | None = None) -> dict[str, Any]:  # fmt: skip
    if share is None and used is not None and total:
        share = used / total
    return {"item": item, "role": role, "pid": pid, "device": device, "name": name,
            "used_bytes": used, "total_bytes": total, "share_of_total": share}  # fmt: skip

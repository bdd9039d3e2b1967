"""Which GPUs the target uses, and its figures on each of them (one line per GPU).

A host's other GPUs (another tenant, another vLLM) are none of the target's business: the
memory line and the KV share count the target's GPUs only. They are found, best first:

1. NVML's process lists: the devices (or MIG instances) where a target PID holds a context.
2. The target's environment (`/proc/PID/environ`), when NVML lists none of its processes
   (a sidecar in a container without the host's PID namespace often gets empty lists):
   `CUDA_VISIBLE_DEVICES` (indexes, `GPU-`/`MIG-` UUIDs) chooses among the devices the
   container has (`NVIDIA_VISIBLE_DEVICES` when it lists them, else all), and vLLM's workers
   take the first tensor x pipeline parallel of those, one each.
3. Nothing known: the first tensor x pipeline parallel devices, or all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from sidecar.records.gpu import (
    GpuDevice,
    GpuFigures,
    GpuReading,
    GpuSelection,
    GpuUse,
    GpuUtilization,
    TargetGpus,
)

Environ = Callable[[int], Mapping[str, str] | None]
T = TypeVar("T")


def target_gpus(
    reading: GpuReading, pids: Sequence[int], environ: Environ, world_size: int | None = None
) -> TargetGpus | None:
    """The GPUs the target (its processes `pids`, as the sidecar's /proc names them) uses.

    `world_size` is tensor x pipeline parallel from vLLM's command line, when it says.
    None when the reading has no devices (CPU mode, NVML unavailable).
    """
    if not reading.available or not reading.devices:
        return None
    held = [p for p in reading.processes() if p.target_pid is not None]
    if held:
        labels = _unique(_label(p.device_index, p.mig_index) for p in held)
        owners = ", ".join(str(pid) for pid in _unique(p.target_pid for p in held))
        return _selection(reading, labels, GpuSelection.NVML_PROCESSES, f"PIDs {owners}")
    return _from_environ(reading, pids, environ, world_size)


def gpu_figures(
    reading: GpuReading | None,
    target: TargetGpus | None,
    utilization: Sequence[GpuUtilization] = (),
) -> GpuFigures | None:
    """The target's GPUs as they were at the window's end, with their utilisation over it."""
    if reading is None or target is None:
        return None
    return figures_of(reading.devices, target, utilization)


def figures_of(
    devices: Sequence[GpuDevice],
    target: TargetGpus,
    utilization: Sequence[GpuUtilization] = (),
) -> GpuFigures:
    """The same from a snapshot's devices (what the report has, long after the window)."""
    util = {u.label: u for u in utilization}
    by_label = {d.label: d for d in devices}
    uses = (_use(by_label[label], util) for label in target.labels if label in by_label)
    return GpuFigures(target, tuple(uses), tuple(utilization))


# ------------------------------------------------------------------------------------- helpers


def _use(device: GpuDevice, util: Mapping[str, GpuUtilization]) -> GpuUse:
    held = [p.used_memory_bytes for p in device.processes if p.target_pid is not None]
    known = [m for m in held if m is not None]
    return GpuUse(
        label=device.label,
        index=device.index,
        name=device.name,
        memory_used_bytes=device.memory_used_bytes,
        memory_total_bytes=device.memory_total_bytes,
        target_memory_bytes=sum(known) if known else None,
        # Utilisation is the physical GPU's: a MIG instance reports none of its own.
        utilization=util.get(f"gpu{device.index}"),
    )


def _from_environ(
    reading: GpuReading, pids: Sequence[int], environ: Environ, world_size: int | None
) -> TargetGpus:
    physical = [d for d in reading.devices if not d.mig]
    envs = [(pid, env) for pid in pids if (env := environ(pid)) is not None]
    chosen = [(pid, env) for pid, env in envs if "CUDA_VISIBLE_DEVICES" in env]
    first = world_size
    if chosen:
        labels: list[str] = []
        for _, env in chosen:
            visible = _visible(reading, _container(physical, env), env["CUDA_VISIBLE_DEVICES"])
            labels += visible[:first]
        pid, env = chosen[0]
        detail = f"CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']} of PID {pid}"
        detail += f", first {first} (tensor x pipeline parallel)" if first else ""
        caveats = _order_caveat(physical, env)
        return _selection(reading, _unique(labels), GpuSelection.CUDA_VISIBLE_DEVICES, detail,
                          caveats)  # fmt: skip
    container = _container(physical, envs[0][1]) if envs else [d.label for d in physical]
    if first is not None:
        detail = f"no CUDA_VISIBLE_DEVICES; vLLM's {first} workers take the first {first}"
        return _selection(reading, container[:first], GpuSelection.DEVICE_ORDER, detail)
    why = "the target's environment is unreadable" if not envs else "no CUDA_VISIBLE_DEVICES"
    detail = f"NVML lists none of the target's processes and {why}"
    return _selection(reading, container, GpuSelection.ALL_DEVICES, detail)


def _container(physical: list[GpuDevice], env: Mapping[str, str]) -> list[str]:
    """The labels of the GPUs a container was given, in its order (its CUDA index 0, 1, ...).

    `NVIDIA_VISIBLE_DEVICES` counts only when it lists devices: `--gpus device=2,3` in Docker
    leaves the image's `all` in it while the container sees two GPUs.
    """
    value = env.get("NVIDIA_VISIBLE_DEVICES", "all").strip()
    if value in ("", "all", "void", "none"):
        return [d.label for d in physical]
    found: list[str] = []
    for entry in value.split(","):
        device = _match(physical, entry.strip(), [d.label for d in physical])
        if device is not None:
            found.append(device)
    return found


def _visible(reading: GpuReading, container: list[str], value: str) -> list[str]:
    """CUDA_VISIBLE_DEVICES against the container's devices. CUDA stops at the first entry
    it cannot resolve (so `-1` hides everything after it), and so does this."""
    found: list[str] = []
    for entry in value.split(","):
        label = _match(list(reading.devices), entry.strip(), container)
        if label is None:
            break
        found.append(label)
    return found


def _match(devices: list[GpuDevice], entry: str, order: list[str]) -> str | None:
    """An index into `order`, or a (prefix of a) `GPU-`/`MIG-` UUID, as CUDA reads them."""
    if entry.isdigit():
        return order[int(entry)] if int(entry) < len(order) else None
    if entry.startswith(("GPU-", "MIG-")):
        hits = [d.label for d in devices if d.uuid and d.uuid.startswith(entry)]
        return hits[0] if len(hits) == 1 else None
    return None


def _order_caveat(physical: list[GpuDevice], env: Mapping[str, str]) -> tuple[str, ...]:
    """CUDA numbers devices fastest first unless told otherwise; NVML by PCI bus."""
    mixed = len({d.name for d in physical}) > 1
    if mixed and env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        return (
            "this host's GPUs differ and CUDA_DEVICE_ORDER is not PCI_BUS_ID: CUDA numbers "
            "them fastest first, NVML by PCI bus, so CUDA_VISIBLE_DEVICES indexes may name "
            "other GPUs than these",
        )
    return ()


def _selection(
    reading: GpuReading,
    labels: Sequence[str],
    how: GpuSelection,
    detail: str,
    caveats: tuple[str, ...] = (),
) -> TargetGpus:
    by_label = {d.label: d for d in reading.devices}
    kept = [label for label in labels if label in by_label]
    indexes = _unique(by_label[label].index for label in kept)
    return TargetGpus(tuple(kept), tuple(indexes), how, detail, caveats)


def _label(index: int, mig_index: int | None) -> str:
    return f"gpu{index}" if mig_index is None else f"gpu{index}/mig{mig_index}"


def _unique(items: Iterable[T]) -> list[T]:
    """`items` in their order, each once."""
    return list(dict.fromkeys(items))

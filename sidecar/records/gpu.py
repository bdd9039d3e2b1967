"""The GPU stage's frozen records: what one NVML reading saw, with None where it saw nothing.

Every number may be None: the device does not support that query (a GeForce card has no PCIe
throughput counter, a MIG instance no power reading), or the query failed this tick. Which
fields were unsupported and which failed is carried in the reading, not raised (STYLE.md 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.sizes import format_bytes, format_share

CPU_MODE = "no NVIDIA GPU: CPU mode"  # the start of a CPU_MODE reading's reason, for people


class GpuMode(StrEnum):
    """What a reading could do. No GPU is a host's state, not a failure; an NVML that fails
    on a GPU host is (the daemon counts it)."""

    GPU = "gpu"  # NVML answered: devices and their numbers
    CPU_MODE = "cpu_mode"  # no NVML bindings, library, driver or device: a CPU host, for good
    UNAVAILABLE = "unavailable"  # NVML failed to start, went away or lost the GPUs: retried


class PidMatch(StrEnum):
    """Which of a target's PIDs an outside PID (NVML's) turned out to be."""

    HOST = "host"  # its PID in the host's (initial) namespace: what NVML documents today
    LOCAL = "local"  # its PID in its own innermost namespace
    VIEW = "view"  # its PID in the namespace of the /proc we read, when that is neither
    NONE = "none"  # not one of the targets


class ProcessKind(StrEnum):
    """Which of NVML's process lists named the process (nvidia-smi's C, G and C+G)."""

    COMPUTE = "compute"
    GRAPHICS = "graphics"
    BOTH = "compute+graphics"


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """One process with a context on one device (or MIG instance), as NVML reported it.

    `pid` is NVML's number. When it is one of the targets, `target_pid` is the PID the caller
    named that target by (its `--proc-root` view), and `pid_host` / `pid_local` are its PIDs in
    the host's and its own namespace (None when unknown); `matched` says which one NVML's
    number was. For other processes (another tenant, a host daemon) all three are None.
    """

    pid: int
    device_index: int
    used_memory_bytes: int | None = None  # None: NVML_VALUE_NOT_AVAILABLE (WDDM, some MIG)
    mig_index: int | None = None
    kind: ProcessKind = ProcessKind.COMPUTE
    matched: PidMatch = PidMatch.NONE
    target_pid: int | None = None
    pid_host: int | None = None
    pid_local: int | None = None


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One physical GPU, or one MIG instance of it (`mig` True, `mig_index` set).

    A MIG instance shares its parent's `index`; clocks, power, temperature and PCIe belong to
    the parent and stay None on the instance. `mig_enabled` is the parent's current MIG mode
    (None: not MIG-capable, or unknown).
    """

    index: int
    uuid: str | None = None
    name: str | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    util_gpu_pct: int | None = None
    util_memory_pct: int | None = None
    pcie_tx_bytes_per_s: int | None = None
    pcie_rx_bytes_per_s: int | None = None
    power_w: float | None = None
    sm_clock_mhz: int | None = None
    temperature_c: int | None = None
    mig: bool = False
    mig_enabled: bool | None = None
    mig_index: int | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    lost: bool = False  # NVML said the GPU fell off the bus / needs a reset this tick
    processes: tuple[GpuProcess, ...] = ()

    @property
    def label(self) -> str:
        """`gpu0`, or `gpu0/mig1` for a MIG instance: the prefix of its field names."""
        return (
            f"gpu{self.index}" if self.mig_index is None else f"gpu{self.index}/mig{self.mig_index}"
        )


@dataclass(frozen=True, slots=True)
class NvmlSystem:
    """The NVIDIA driver's version and the CUDA version it supports ("550.54.15", "12.4");
    each None when NVML could not say, and `reason` why (no NVML: a CPU host)."""

    driver: str | None = None
    cuda: str | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class GpuReading:
    """All devices at one instant. A `mode` other than GPU means no numbers at all, and
    `reason` says why.

    `unsupported` names the queries that will not answer on this hardware (`gpu0.power`);
    `errors` the ones that failed only this time (`gpu1.utilization: Timeout`).
    """

    taken_at: float  # monotonic seconds
    wall_time: float  # seconds since the epoch
    mode: GpuMode
    devices: tuple[GpuDevice, ...] = ()
    reason: str | None = None
    unsupported: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def available(self) -> bool:
        """NVML answered: the reading has numbers."""
        return self.mode is GpuMode.GPU

    def processes(self) -> tuple[GpuProcess, ...]:
        return tuple(process for device in self.devices for process in device.processes)

    def for_target(self, target_pid: int) -> tuple[GpuProcess, ...]:
        """The contexts that target `target_pid` holds, one per device or MIG instance."""
        return tuple(p for p in self.processes() if p.target_pid == target_pid)


DEFAULT_INTERVAL_S = 1.0


@dataclass(frozen=True, slots=True)
class GpuUtilization:
    """One GPU's utilisation over the window: `samples` polls that answered, their mean,
    minimum and maximum (percent); `missed` polls at which it did not answer."""

    label: str  # gpu0
    samples: int
    mean_pct: float | None
    min_pct: int | None
    max_pct: int | None
    missed: int = 0
    interval_s: float = DEFAULT_INTERVAL_S
    first_at: float | None = None  # monotonic seconds of the first and last poll
    last_at: float | None = None

    @property
    def text(self) -> str:
        """`util 88% mean (80-95%, 12 samples)`, or `util not reported` without samples."""
        if self.mean_pct is None:
            return "util not reported"
        return (
            f"util {self.mean_pct:.0f}% mean ({self.min_pct}-{self.max_pct}%, "
            f"{self.samples} samples)"
        )


class GpuSelection(StrEnum):
    """How the target's GPUs were decided."""

    NVML_PROCESSES = "nvml process list"
    CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
    DEVICE_ORDER = "first devices in order"  # no variable set: workers take devices 0, 1, ...
    ALL_DEVICES = "all devices"


@dataclass(frozen=True, slots=True)
class TargetGpus:
    """The devices the target uses, by label (`gpu2`, `gpu0/mig1`), and how that was decided.

    `indexes` are the physical GPUs (NVML's order) behind `labels`, each once.
    """

    labels: tuple[str, ...]
    indexes: tuple[int, ...]
    how: GpuSelection
    detail: str
    caveats: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class GpuUse:
    """One of the target's GPUs at the window's end, with its utilisation through the window.

    `target_memory_bytes` is what NVML says the target's processes hold on it (None when NVML
    listed none of them there).
    """

    label: str
    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    target_memory_bytes: int | None = None
    utilization: GpuUtilization | None = None

    @property
    def text(self) -> str:
        """`GPU 2 (NVIDIA H100 80GB HBM3): 74.0 GiB / 79.6 GiB (93.0%), vLLM 73.5 GiB; util
        88% mean (80-95%, 12 samples)`."""
        name = gpu_name(self.label)
        used, total = self.memory_used_bytes, self.memory_total_bytes
        line = f"GPU {name}" + (f" ({self.name})" if self.name else "") + ": "
        line += f"{format_bytes(used)} / {format_bytes(total)} ({format_share(used, total)})"
        if self.target_memory_bytes is not None:
            line += f", vLLM {format_bytes(self.target_memory_bytes)}"
        if self.utilization is not None:
            line += f"; {self.utilization.text}"
        return line


@dataclass(frozen=True, slots=True)
class GpuFigures:
    """The target's GPUs and one `GpuUse` per GPU: what the report's GPU lines print."""

    target: TargetGpus
    devices: tuple[GpuUse, ...]
    utilization: tuple[GpuUtilization, ...] = ()  # every GPU's, polled through the window

    @property
    def memory_totals(self) -> dict[str, int]:
        """Memory of each of the target's GPUs, by label: the KV share's denominator."""
        return {d.label: d.memory_total_bytes for d in self.devices if d.memory_total_bytes}

    def lines(self) -> list[str]:
        """`GPUs used: 2, 3 (nvml process list)` then one line per GPU, for the report."""
        head = f"GPUs used: {', '.join(gpu_name(label) for label in self.target.labels) or 'none'}"
        head += f" ({self.target.how}: {self.target.detail})"
        return [head, *(d.text for d in self.devices), *self.target.caveats]


def gpu_name(label: str) -> str:
    """`gpu2` -> `2`, `gpu0/mig1` -> `0 MIG 1`: a GPU as the report names it."""
    return label.removeprefix("gpu").replace("/mig", " MIG ")

"""The GPU stage's frozen records: what one NVML reading saw, with None where it saw nothing.

Every number may be None: the device does not support that query (a GeForce card has no PCIe
throughput counter, a MIG instance no power reading), or the query failed this tick. Which
fields were unsupported and which failed is carried in the reading, not raised (STYLE.md 7).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sidecar.pidmap import PidMatch

CPU_MODE = "no NVIDIA GPU: CPU mode"


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
    """All devices at one instant. `available` False means no numbers at all, and why.

    `unsupported` names the queries that will not answer on this hardware (`gpu0.power`);
    `errors` the ones that failed only this time (`gpu1.utilization: Timeout`).
    """

    taken_at: float  # monotonic seconds
    wall_time: float  # seconds since the epoch
    available: bool
    devices: tuple[GpuDevice, ...] = ()
    reason: str | None = None
    unsupported: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    def processes(self) -> tuple[GpuProcess, ...]:
        return tuple(process for device in self.devices for process in device.processes)

    def for_target(self, target_pid: int) -> tuple[GpuProcess, ...]:
        """The contexts that target `target_pid` holds, one per device or MIG instance."""
        return tuple(p for p in self.processes() if p.target_pid == target_pid)

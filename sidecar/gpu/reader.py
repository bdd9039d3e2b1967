"""`NvmlReader`: one GPU reading per tick, every NVML call through one wrapper.

`NvmlReader._call` turns an `NvmlError` into a `None` and applies `sidecar.gpu.policy.POLICY`
(read that module for the table): unsupported fields are named in the reading, failures of one
tick counted in it, a lost GPU marked lost, a vanished driver makes the reading unavailable.
Each (field, code) is logged once per reader. No library or no device is CPU mode, logged once.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from sidecar.gpu.nvml import (
    NVML_CLOCK_SM,
    NVML_DEVICE_MIG_ENABLE,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_TEMPERATURE_GPU,
    NvmlApi,
    NvmlError,
    NvmlProcessInfo,
    NvmlReturn,
    PynvmlApi,
    cuda_version_text,
)
from sidecar.gpu.policy import (
    CPU_MODE_CODES,
    START_HINTS,
    Outcome,
    rule_for,
)
from sidecar.records.gpu import (
    CPU_MODE,
    GpuDevice,
    GpuMode,
    GpuProcess,
    GpuReading,
    NvmlSystem,
    PidMatch,
    ProcessKind,
)
from sidecar.target.pidmap import PidMap

log = logging.getLogger("vllm_sidecar.gpu")
T = TypeVar("T")


class _DeviceLost(Exception):
    pass


class _NvmlGone(Exception):
    pass


class NvmlReader:
    """Reads every GPU (and MIG instance) through an `NvmlApi`; never raises for NVML's sake."""

    def __init__(
        self,
        api: NvmlApi | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._api: NvmlApi = api if api is not None else PynvmlApi()
        self._clock = clock
        self._wall_clock = wall_clock
        self._open = False
        self._cpu_mode: str | None = None  # the reason, once NVML said there is no GPU
        self._logged: set[tuple[object, ...]] = set()
        self._unsupported: list[str] = []
        self._errors: list[str] = []
        # read() and read_utilization() (the poller's thread) share the per-read lists above.
        self._lock = threading.Lock()

    def __enter__(self) -> NvmlReader:
        self.open()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def open(self) -> str | None:
        """Start NVML if needed. None when ready, else why not (CPU mode is for good)."""
        if self._open:
            return None
        if self._cpu_mode is not None:
            return self._cpu_mode
        try:
            self._api.init()
        except NvmlError as error:
            return self._start_failed(error)
        self._open = True
        try:
            count = self._api.device_count()
        except NvmlError as error:
            self.close()  # pynvml counts inits: every one needs its shutdown
            return self._start_failed(error)
        if count == 0:
            self.close()
            self._cpu_mode = f"{CPU_MODE} (NVML sees no devices)"
            self._log_once(logging.INFO, ("start",), self._cpu_mode)
            return self._cpu_mode
        return None

    def close(self) -> None:
        if not self._open:
            return
        self._open = False
        try:
            self._api.shutdown()
        except NvmlError as error:
            log.debug("nvmlShutdown failed: %s", error)

    def read(self, pids: PidMap | Mapping[int, int] | None = None) -> GpuReading:
        """Every device now. `pids` names the targets: a PidMap, or {host PID: local PID}."""
        taken_at, wall_time = self._clock(), self._wall_clock()
        reason = self.open()
        if reason is not None:
            mode = GpuMode.CPU_MODE if self._cpu_mode is not None else GpuMode.UNAVAILABLE
            return GpuReading(taken_at, wall_time, mode, reason=reason)
        pidmap = pids if isinstance(pids, PidMap) or pids is None else PidMap.from_pairs(pids)
        with self._lock:
            self._unsupported, self._errors = [], []
            try:
                count = self._call("nvml.device_count", self._api.device_count) or 0
                devices = tuple(d for i in range(count) for d in self._read_gpu(i, pidmap))
            except _NvmlGone as gone:
                self.close()  # the next read starts NVML again
                return GpuReading(taken_at, wall_time, GpuMode.UNAVAILABLE, reason=str(gone))
            except _DeviceLost as lost:  # the device count itself: no device can be read
                return GpuReading(taken_at, wall_time, GpuMode.UNAVAILABLE, errors=(str(lost),),
                                  reason=f"NVML lost the GPUs while counting them ({lost}): "
                                  "check `dmesg` for Xid errors; a GPU reset or a reboot "
                                  "may be needed")  # fmt: skip
            unsupported, errors = tuple(self._unsupported), tuple(self._errors)
        self._warn_unmapped(pidmap, devices)
        return GpuReading(
            taken_at,
            wall_time,
            GpuMode.GPU,
            devices=devices,
            unsupported=unsupported,
            errors=errors,
        )

    def system(self) -> NvmlSystem:
        """The driver's version and its CUDA version, or why not (CPU mode, a failed call:
        logged by the same policy as `read`). Once per target: they change only with a new
        driver, which restarts vLLM anyway."""
        reason = self.open()
        if reason is not None:
            return NvmlSystem(reason=reason)
        with self._lock:
            self._unsupported, self._errors = [], []
            try:
                driver = self._call("nvml.driver_version", self._api.driver_version)
                cuda = self._call("nvml.cuda_driver_version", self._api.cuda_driver_version)
            except (_NvmlGone, _DeviceLost) as gone:
                return NvmlSystem(reason=str(gone))
            unsupported = [f"{field}: not supported" for field in self._unsupported]
            failed = ", ".join([*unsupported, *self._errors]) or None
        return NvmlSystem(
            driver=driver,
            cuda=cuda_version_text(cuda) if cuda is not None else None,
            reason=f"NVML did not answer: {failed}" if failed else None,
        )

    def read_utilization(self) -> dict[str, int | None]:
        """Each physical GPU's utilisation now (percent, None where it did not answer), by
        label; {} while NVML is not open. For `UtilizationPoller`, from its thread: it never
        starts or stops NVML, and what fails is logged by the same policy as `read`."""
        with self._lock:
            if not self._open:
                return {}
            self._unsupported, self._errors = [], []
            try:
                count = self._call("nvml.device_count", self._api.device_count) or 0
                return {f"gpu{i}": self._utilization(i) for i in range(count)}
            except (_NvmlGone, _DeviceLost):
                return {}  # read() says why; the next read() restarts NVML if it is gone

    def _utilization(self, index: int) -> int | None:
        label = f"gpu{index}"
        try:
            handle = self._call(f"{label}.handle", self._api.device_handle, index)
            rates = (
                self._call(f"{label}.utilization", self._api.utilization_rates, handle)
                if handle is not None
                else None
            )
        except _DeviceLost:
            return None
        return rates.gpu if rates is not None else None

    # --- the one wrapper --------------------------------------------------------------------

    def _call(self, field: str, fn: Callable[..., T], *args: object) -> T | None:
        """`fn(*args)`, or None with the policy applied; `field` names device and query."""
        try:
            return fn(*args)
        except NvmlError as error:
            rule = rule_for(error.code)
            hint = f"; {rule.hint}" if rule.hint else ""
            level = rule.level
            if rule.outcome is Outcome.TRANSIENT and (field, error.code) in self._logged:
                level = logging.DEBUG  # a flapping query must not flood the journal
            self._log_once(level, (field, error.code), "NVML %s: %s%s", field, error.name, hint)
            if rule.outcome is Outcome.UNSUPPORTED:
                self._unsupported.append(field)
            elif rule.outcome in (Outcome.TRANSIENT, Outcome.DEVICE_LOST):
                self._errors.append(f"{field}: {error.name}")
            if rule.outcome is Outcome.DEVICE_LOST:
                raise _DeviceLost(field) from error
            if rule.outcome is Outcome.NVML_GONE:
                raise _NvmlGone(f"NVML unavailable: {error.name} ({rule.hint})") from error
            return None

    def _log_once(self, level: int, key: tuple[object, ...], message: str, *args: object) -> None:
        if key in self._logged and level > logging.DEBUG:
            return
        self._logged.add(key)
        log.log(level, message, *args)

    def _start_failed(self, error: NvmlError) -> str:
        no_gpu = CPU_MODE_CODES.get(error.code) if isinstance(error.code, NvmlReturn) else None
        if no_gpu is not None:
            self._cpu_mode = f"{CPU_MODE} ({error.detail or no_gpu})"
            self._log_once(logging.INFO, ("start",), self._cpu_mode)
            return self._cpu_mode
        hint = "retried on the next reading"
        if isinstance(error.code, NvmlReturn):
            hint = START_HINTS.get(error.code, hint)
        reason = f"NVML did not start: {error.name} ({hint})"
        self._log_once(logging.WARNING, ("start", error.code), reason)
        return reason

    # --- devices ----------------------------------------------------------------------------

    def _read_gpu(self, index: int, pidmap: PidMap | None) -> list[GpuDevice]:
        label = f"gpu{index}"
        try:
            handle = self._call(f"{label}.handle", self._api.device_handle, index)
            if handle is None:
                return [GpuDevice(index=index)]
            mode = self._call(f"{label}.mig_mode", self._api.mig_mode, handle)
            mig_enabled = None if mode is None else mode[0] == NVML_DEVICE_MIG_ENABLE
            gpu = self._read_physical(label, index, handle, mig_enabled, pidmap)
            # Processes on a MIG GPU belong to its instances; the whole-GPU list needs root
            # and would count each process twice (NVML docs, nvmlDeviceGetComputeRunningProcesses).
            migs = self._read_migs(label, index, handle, pidmap) if mig_enabled else []
        except _DeviceLost:
            return [GpuDevice(index=index, lost=True)]
        return [gpu, *migs]

    def _read_physical(
        self,
        label: str,
        index: int,
        handle: object,
        mig_enabled: bool | None,
        pidmap: PidMap | None,
    ) -> GpuDevice:
        api, call = self._api, self._call
        common = self._common(label, index, handle)  # first: a lost GPU stops the rest
        tx = call(f"{label}.pcie_tx", api.pcie_throughput, handle, NVML_PCIE_UTIL_TX_BYTES)
        rx = call(f"{label}.pcie_rx", api.pcie_throughput, handle, NVML_PCIE_UTIL_RX_BYTES)
        power_mw = call(f"{label}.power", api.power_usage, handle)
        return GpuDevice(
            **common,
            # NVML's "KB/s" are KiB/s: nvidia-smi and nvitop multiply by 1024.
            pcie_tx_bytes_per_s=None if tx is None else tx * 1024,
            pcie_rx_bytes_per_s=None if rx is None else rx * 1024,
            power_w=None if power_mw is None else power_mw / 1000,
            sm_clock_mhz=call(f"{label}.sm_clock", api.clock_info, handle, NVML_CLOCK_SM),
            temperature_c=call(
                f"{label}.temperature", api.temperature, handle, NVML_TEMPERATURE_GPU
            ),
            mig_enabled=mig_enabled,
            processes=() if mig_enabled else self._processes(label, handle, index, None, pidmap),
        )

    def _common(self, label: str, index: int, handle: object) -> dict[str, Any]:
        """What a GPU and a MIG instance both answer: identity, memory, utilisation."""
        api, call = self._api, self._call
        memory = call(f"{label}.memory", api.memory_info, handle)
        rates = call(f"{label}.utilization", api.utilization_rates, handle)
        return {
            "index": index,
            "uuid": call(f"{label}.uuid", api.uuid, handle),
            "name": call(f"{label}.name", api.name, handle),
            "memory_used_bytes": memory.used if memory else None,
            "memory_total_bytes": memory.total if memory else None,
            "util_gpu_pct": rates.gpu if rates else None,
            "util_memory_pct": rates.memory if rates else None,
        }

    def _read_migs(
        self, label: str, index: int, handle: object, pidmap: PidMap | None
    ) -> list[GpuDevice]:
        slots = self._call(f"{label}.max_mig_device_count", self._api.max_mig_device_count, handle)
        found = []
        for slot in range(slots or 0):
            mig = self._call(f"{label}/mig{slot}.handle", self._api.mig_device_handle, handle, slot)
            if mig is not None:
                found.append(self._read_mig(f"{label}/mig{slot}", index, slot, mig, pidmap))
        return found

    def _read_mig(
        self, label: str, index: int, slot: int, handle: object, pidmap: PidMap | None
    ) -> GpuDevice:
        # Clocks, power, temperature and PCIe are the parent's; an instance is not asked.
        api, call = self._api, self._call
        return GpuDevice(
            **self._common(label, index, handle),
            mig=True,
            mig_enabled=True,
            mig_index=slot,
            gpu_instance_id=call(f"{label}.gpu_instance_id", api.gpu_instance_id, handle),
            compute_instance_id=call(
                f"{label}.compute_instance_id", api.compute_instance_id, handle
            ),
            processes=self._processes(label, handle, index, slot, pidmap),
        )

    # --- processes --------------------------------------------------------------------------

    def _processes(
        self, label: str, handle: object, index: int, slot: int | None, pidmap: PidMap | None
    ) -> tuple[GpuProcess, ...]:
        compute = self._call(f"{label}.compute_processes", self._api.compute_processes, handle)
        graphics = self._call(f"{label}.graphics_processes", self._api.graphics_processes, handle)
        seen: dict[int, tuple[int | None, ProcessKind]] = {}
        for kind, found in ((ProcessKind.COMPUTE, compute), (ProcessKind.GRAPHICS, graphics)):
            for info in found or []:
                seen[info.pid] = _merge(seen.get(info.pid), info, kind)
        return tuple(
            self._attribute(pid, used, kind, index, slot, pidmap)
            for pid, (used, kind) in sorted(seen.items())
        )

    def _attribute(
        self,
        pid: int,
        used: int | None,
        kind: ProcessKind,
        index: int,
        slot: int | None,
        pidmap: PidMap | None,
    ) -> GpuProcess:
        """Which target NVML's `pid` is, trying every namespace: never assume which one answered."""
        process = GpuProcess(
            pid=pid, device_index=index, used_memory_bytes=used, mig_index=slot, kind=kind
        )
        candidates = pidmap.candidates(pid) if pidmap is not None else []
        if not candidates:
            return process
        entry, matched = candidates[0]
        if len(candidates) > 1:
            others = ", ".join(f"{ns} PID of target {e.view}" for e, ns in candidates[1:])
            self._log_once(
                logging.WARNING,
                ("ambiguous", pid),
                "NVML PID %d is the %s PID of target %d and the %s; taking the first",
                pid, matched, entry.view, others,
            )  # fmt: skip
        if matched is not PidMatch.HOST:
            self._log_once(
                logging.INFO, ("namespace", matched), "NVML answered with %s PIDs", matched
            )
        return GpuProcess(
            pid=pid,
            device_index=index,
            used_memory_bytes=used,
            mig_index=slot,
            kind=kind,
            matched=matched,
            target_pid=entry.view,
            pid_host=entry.host,
            pid_local=entry.local,
        )

    def _warn_unmapped(self, pidmap: PidMap | None, devices: tuple[GpuDevice, ...]) -> None:
        if pidmap is None or not pidmap.unmapped:
            return
        unmatched = [p.pid for d in devices for p in d.processes if p.matched is PidMatch.NONE]
        if unmatched:
            self._log_once(
                logging.WARNING,
                ("unmapped",),
                "GPU processes %s match no target, and targets %s have no known host PID "
                "(NVML reports host PIDs): mount the host's /proc into the sidecar read-only "
                "(-v /proc:/host_proc:ro) or run it with pid: host",
                unmatched,
                list(pidmap.unmapped),
            )


def _merge(
    earlier: tuple[int | None, ProcessKind] | None, info: NvmlProcessInfo, kind: ProcessKind
) -> tuple[int | None, ProcessKind]:
    """One process in both lists is nvidia-smi's C+G; its memory is counted once."""
    if earlier is None:
        return info.used_gpu_memory, kind
    used = max((m for m in (earlier[0], info.used_gpu_memory) if m is not None), default=None)
    return used, ProcessKind.BOTH

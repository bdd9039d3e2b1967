"""`RecordedNvml`: the NVML seam played back from a fixture of what each call returned (a test double).

A fixture (YAML or JSON) holds, per device, what each call returned on real hardware, in
pynvml's shapes and units, or the error it raised:

    source: nvidia-smi / pynvml 12.560 on driver 550.54.15, H100 80GB HBM3
    driver_version: "550.54.15"      # nvmlSystemGetDriverVersion
    cuda_driver_version: 12040       # nvmlSystemGetCudaDriverVersion (CUDA 12.4)
    devices:
      - name: NVIDIA H100 80GB HBM3
        uuid: GPU-5a3ee0b4-...
        memory: {total: 85520809984, free: 6230310912, used: 79290499072}   # bytes
        utilization: {gpu: 97, memory: 58}                                     # percent
        pcie_tx: 10830          # KB/s
        power: {error: NVML_ERROR_NOT_SUPPORTED}
        compute_processes:
          - {pid: 412388, usedGpuMemory: 78613987328, gpuInstanceId: 4294967295, ...}

A key that is absent answers NVML_ERROR_NOT_SUPPORTED (a fixture says what a card has);
`{sequence: [a, b]}` answers a, then b, then b again, for readings that change between
ticks. `devtools.nvml_fixture.record_fixture` writes the same format from a live `PynvmlApi`
(`scripts/gpu_check.py --record`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sidecar.gpu.nvml import (
    NVML_CLOCK_SM,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_TEMPERATURE_GPU,
    NvmlError,
    NvmlMemory,
    NvmlProcessInfo,
    NvmlReturn,
    NvmlUtilization,
    process_info,
)

DEVICE_KEYS = frozenset(
    {
        "handle", "name", "uuid", "memory", "utilization", "pcie_tx", "pcie_rx", "power",
        "sm_clock", "temperature", "mig_mode", "max_mig_device_count", "mig_devices",
        "gpu_instance_id", "compute_instance_id", "compute_processes", "graphics_processes",
    }
)  # fmt: skip
TOP_KEYS = frozenset(
    {"source", "init", "device_count", "devices", "driver_version", "cuda_driver_version"}
)


@dataclass(frozen=True, slots=True)
class _Handle:
    path: tuple[int, ...]  # (gpu,) or (gpu, mig slot)


class RecordedNvml:
    """`NvmlApi` answering from a fixture; `calls` lists what was asked, in order."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        _check_keys(data, TOP_KEYS, "fixture")
        self._data = data
        self._devices = [_normalised(device) for device in data.get("devices") or []]
        self._served: dict[tuple[object, ...], int] = {}
        self.calls: list[tuple[object, ...]] = []

    @classmethod
    def load(cls, path: Path | str) -> RecordedNvml:
        return cls(yaml.safe_load(Path(path).read_text()))

    def init(self) -> None:
        self._answer(("init",), self._data, "init", default=None)

    def shutdown(self) -> None:
        self.calls.append(("shutdown",))

    def device_count(self) -> int:
        return int(self._answer(("device_count",), self._data, "device_count", len(self._devices)))

    def driver_version(self) -> str:
        return str(self._answer(("driver_version",), self._data, "driver_version", _UNSUPPORTED))

    def cuda_driver_version(self) -> int:
        key = "cuda_driver_version"
        return int(self._answer((key,), self._data, key, _UNSUPPORTED))

    def device_handle(self, index: int) -> object:
        if not 0 <= index < len(self._devices):
            raise NvmlError(NvmlReturn.INVALID_ARGUMENT)
        self._answer(("device_handle", index), self._devices[index], "handle", default=None)
        return _Handle((index,))

    def name(self, handle: object) -> str:
        return str(self._get("name", handle))

    def uuid(self, handle: object) -> str:
        return str(self._get("uuid", handle))

    def memory_info(self, handle: object) -> NvmlMemory:
        value = self._get("memory", handle)
        return NvmlMemory(int(value["total"]), int(value["free"]), int(value["used"]))

    def utilization_rates(self, handle: object) -> NvmlUtilization:
        value = self._get("utilization", handle)
        return NvmlUtilization(int(value["gpu"]), int(value["memory"]))

    def pcie_throughput(self, handle: object, counter: int) -> int:
        keys = {NVML_PCIE_UTIL_TX_BYTES: "pcie_tx", NVML_PCIE_UTIL_RX_BYTES: "pcie_rx"}
        if counter not in keys:
            raise NvmlError(NvmlReturn.INVALID_ARGUMENT)
        return int(self._get(keys[counter], handle))

    def power_usage(self, handle: object) -> int:
        return int(self._get("power", handle))

    def clock_info(self, handle: object, clock: int) -> int:
        if clock != NVML_CLOCK_SM:
            raise NvmlError(NvmlReturn.NOT_SUPPORTED)  # only the SM clock is recorded
        return int(self._get("sm_clock", handle))

    def temperature(self, handle: object, sensor: int) -> int:
        if sensor != NVML_TEMPERATURE_GPU:
            raise NvmlError(NvmlReturn.INVALID_ARGUMENT)
        return int(self._get("temperature", handle))

    def mig_mode(self, handle: object) -> tuple[int, int]:
        current, pending = self._get("mig_mode", handle)
        return int(current), int(pending)

    def max_mig_device_count(self, handle: object) -> int:
        return int(self._get("max_mig_device_count", handle))

    def mig_device_handle(self, handle: object, index: int) -> object:
        parent = _path(handle)
        self.calls.append(("mig_device_handle", parent, index))
        slots = self._device(parent).get("mig_devices") or {}
        if index not in slots:
            raise NvmlError(NvmlReturn.NOT_FOUND)  # an empty MIG slot, as NVML says it
        return _Handle((*parent, index))

    def gpu_instance_id(self, handle: object) -> int:
        return int(self._get("gpu_instance_id", handle))

    def compute_instance_id(self, handle: object) -> int:
        return int(self._get("compute_instance_id", handle))

    def compute_processes(self, handle: object) -> list[NvmlProcessInfo]:
        return [process_info(_Obj(entry)) for entry in self._get("compute_processes", handle)]

    def graphics_processes(self, handle: object) -> list[NvmlProcessInfo]:
        return [process_info(_Obj(entry)) for entry in self._get("graphics_processes", handle)]

    def _device(self, path: tuple[int, ...]) -> Mapping[str, Any]:
        device = self._devices[path[0]]
        return device["mig_devices"][path[1]] if len(path) > 1 else device

    def _get(self, key: str, handle: object) -> Any:
        path = _path(handle)
        return self._answer((key, path), self._device(path), key, _UNSUPPORTED)

    def _answer(
        self, call: tuple[object, ...], where: Mapping[str, Any], key: str, default: Any
    ) -> Any:
        """What the fixture recorded for `call`: a value, the next of a sequence, or an error."""
        self.calls.append(call)
        value = where.get(key, default)
        if isinstance(value, Mapping) and "sequence" in value:
            served = self._served.get(call, 0)
            self._served[call] = served + 1
            value = value["sequence"][min(served, len(value["sequence"]) - 1)]
        if value is _UNSUPPORTED:
            raise NvmlError(NvmlReturn.NOT_SUPPORTED)
        if isinstance(value, Mapping) and "error" in value:
            raise NvmlError(NvmlReturn.parse(str(value["error"])))
        return value


_UNSUPPORTED = object()


class _Obj:
    """A fixture's process entry with pynvml's attribute names (`.pid`, `.usedGpuMemory`)."""

    def __init__(self, entry: Mapping[str, Any]) -> None:
        self.__dict__.update(entry)


def _path(handle: object) -> tuple[int, ...]:
    if not isinstance(handle, _Handle):
        raise NvmlError(NvmlReturn.INVALID_ARGUMENT)
    return handle.path


def _check_keys(data: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValueError(f"unknown keys in NVML {where}: {unknown} (allowed: {sorted(allowed)})")


def _normalised(device: Mapping[str, Any]) -> dict[str, Any]:
    """Check a device's keys; MIG slots keyed by int (JSON can only write string keys)."""
    _check_keys(device, DEVICE_KEYS, "device")
    slots = {int(slot): mig for slot, mig in (device.get("mig_devices") or {}).items()}
    for mig in slots.values():
        _check_keys(mig, DEVICE_KEYS, "MIG device")
    return {**device, "mig_devices": slots}

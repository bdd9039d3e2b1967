"""`record_fixture`: ask a live NVML everything an NVML test fixture holds, in its format.

`scripts/gpu_check.py --record PATH` writes what this returns as YAML; the tests play such files
back through `tests/nvml_double.py` (`RecordedNvml`), which documents the format. An error a
call raises is recorded as `{error: NVML_ERROR_...}`; NotSupported is recorded by leaving the
key out (a fixture says what a card has).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sidecar.gpu.nvml import (
    NVML_CLOCK_SM,
    NVML_PCIE_UTIL_RX_BYTES,
    NVML_PCIE_UTIL_TX_BYTES,
    NVML_TEMPERATURE_GPU,
    NvmlApi,
    NvmlError,
    NvmlProcessInfo,
    NvmlReturn,
)

_RECORDED: tuple[tuple[str, Callable[[NvmlApi, object], Any]], ...] = (
    ("name", lambda api, h: api.name(h)),
    ("uuid", lambda api, h: api.uuid(h)),
    ("memory", lambda api, h: api.memory_info(h)._asdict()),
    ("utilization", lambda api, h: api.utilization_rates(h)._asdict()),
    ("pcie_tx", lambda api, h: api.pcie_throughput(h, NVML_PCIE_UTIL_TX_BYTES)),
    ("pcie_rx", lambda api, h: api.pcie_throughput(h, NVML_PCIE_UTIL_RX_BYTES)),
    ("power", lambda api, h: api.power_usage(h)),
    ("sm_clock", lambda api, h: api.clock_info(h, NVML_CLOCK_SM)),
    ("temperature", lambda api, h: api.temperature(h, NVML_TEMPERATURE_GPU)),
    ("mig_mode", lambda api, h: list(api.mig_mode(h))),
    ("max_mig_device_count", lambda api, h: api.max_mig_device_count(h)),
    ("gpu_instance_id", lambda api, h: api.gpu_instance_id(h)),
    ("compute_instance_id", lambda api, h: api.compute_instance_id(h)),
    ("compute_processes", lambda api, h: [_entry(p) for p in api.compute_processes(h)]),
    ("graphics_processes", lambda api, h: [_entry(p) for p in api.graphics_processes(h)]),
)


def record_fixture(api: NvmlApi, source: str) -> dict[str, Any]:
    """Ask a live NVML everything a fixture holds; errors are recorded, not raised."""
    api.init()
    try:
        devices = []
        for index in range(api.device_count()):
            handle = api.device_handle(index)
            device = _record(api, handle)
            slots = device.get("max_mig_device_count")
            if isinstance(slots, int):
                device["mig_devices"] = _record_mig(api, handle, slots)
            devices.append(device)
        return {"source": source, **_system(api), "devices": devices}
    finally:
        api.shutdown()


def _system(api: NvmlApi) -> dict[str, Any]:
    """The driver's versions: a fixture leaves out what NVML did not answer."""
    found: dict[str, Any] = {}
    for key, call in (("driver_version", api.driver_version),
                      ("cuda_driver_version", api.cuda_driver_version)):  # fmt: skip
        try:
            found[key] = call()
        except NvmlError:
            continue
    return found


def _record(api: NvmlApi, handle: object) -> dict[str, Any]:
    device: dict[str, Any] = {}
    for key, call in _RECORDED:
        try:
            device[key] = call(api, handle)
        except NvmlError as error:
            if error.code is not NvmlReturn.NOT_SUPPORTED:  # absent means NotSupported
                device[key] = {"error": f"NVML_ERROR_{getattr(error.code, 'name', error.code)}"}
    return device


def _record_mig(api: NvmlApi, handle: object, slots: int) -> dict[int, dict[str, Any]]:
    found = {}
    for slot in range(slots):
        try:
            found[slot] = _record(api, api.mig_device_handle(handle, slot))
        except NvmlError:
            continue  # an empty slot
    return found


def _entry(process: NvmlProcessInfo) -> dict[str, Any]:
    unset = 0xFFFFFFFF
    return {
        "pid": process.pid,
        "usedGpuMemory": process.used_gpu_memory,
        "gpuInstanceId": unset if process.gpu_instance_id is None else process.gpu_instance_id,
        "computeInstanceId": (
            unset if process.compute_instance_id is None else process.compute_instance_id
        ),
    }

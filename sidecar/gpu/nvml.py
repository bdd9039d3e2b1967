"""The NVML seam: the dozen calls the sidecar makes, as a Protocol, and its real implementation.

`NvmlApi` mirrors pynvml's calls one to one (same arguments, same units: KB/s, mW, MHz, °C),
but returns small records of its own and raises only `NvmlError`, whose `code` is NVML's
`nvmlReturn_t`. So the reader's error policy never sees pynvml, and the recorded fixtures
(`RecordedNvml`) stand in for the driver exactly.

pynvml is imported when `PynvmlApi.init` runs, never at import time: a CPU-only install works
without it, and core modules never import it (STYLE.md 10).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import IntEnum
from types import ModuleType
from typing import Any, NamedTuple, Protocol, TypeVar

T = TypeVar("T")

# Enum values from nvml.h, equal to pynvml's constants of the same names (tested).
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_CLOCK_SM = 1
NVML_TEMPERATURE_GPU = 0
NVML_DEVICE_MIG_ENABLE = 1
# gpuInstanceId / computeInstanceId of a process when MIG is off, and "no value" in general.
NVML_VALUE_NOT_AVAILABLE_UINT = 0xFFFFFFFF
NVML_VALUE_NOT_AVAILABLE_ULONGLONG = 0xFFFFFFFFFFFFFFFF


class NvmlReturn(IntEnum):
    """`nvmlReturn_t`: the names are pynvml's `NVML_ERROR_*` without the prefix."""

    UNINITIALIZED = 1
    INVALID_ARGUMENT = 2
    NOT_SUPPORTED = 3
    NO_PERMISSION = 4
    ALREADY_INITIALIZED = 5
    NOT_FOUND = 6
    INSUFFICIENT_SIZE = 7
    INSUFFICIENT_POWER = 8
    DRIVER_NOT_LOADED = 9
    TIMEOUT = 10
    IRQ_ISSUE = 11
    LIBRARY_NOT_FOUND = 12
    FUNCTION_NOT_FOUND = 13
    CORRUPTED_INFOROM = 14
    GPU_IS_LOST = 15
    RESET_REQUIRED = 16
    OPERATING_SYSTEM = 17
    LIB_RM_VERSION_MISMATCH = 18
    IN_USE = 19
    MEMORY = 20
    NO_DATA = 21
    VGPU_ECC_NOT_SUPPORTED = 22
    INSUFFICIENT_RESOURCES = 23
    FREQ_NOT_SUPPORTED = 24
    ARGUMENT_VERSION_MISMATCH = 25
    DEPRECATED = 26
    NOT_READY = 27
    GPU_NOT_FOUND = 28
    INVALID_STATE = 29
    RESET_TYPE_NOT_SUPPORTED = 30
    UNKNOWN = 999

    @classmethod
    def parse(cls, name: str) -> NvmlReturn:
        """`NVML_ERROR_NOT_SUPPORTED`, `NOT_SUPPORTED` or pynvml's `NVMLError_NotSupported`."""
        key = name.removeprefix("NVML_ERROR_").removeprefix("NVMLError_")
        if key in cls.__members__:
            return cls[key]
        for member in cls:
            if member.name.replace("_", "").lower() == key.lower():
                return member
        raise ValueError(f"not an NVML error name: {name!r}")


class NvmlError(Exception):
    """A failed NVML call. `code` is an `NvmlReturn` when NVML's value is one we know."""

    def __init__(self, code: int, detail: str = "") -> None:
        self.code: NvmlReturn | int = (
            NvmlReturn(code) if code in NvmlReturn._value2member_map_ else code
        )
        self.detail = detail
        super().__init__(f"{self.name}{f': {detail}' if detail else ''}")

    @property
    def name(self) -> str:
        """pynvml's class name for it, as logs and fixtures spell it: `NVMLError_NotSupported`."""
        if isinstance(self.code, NvmlReturn):
            words = self.code.name.title().replace("_", "")
            return f"NVMLError_{words}"
        return f"NVMLError({self.code})"


class NvmlMemory(NamedTuple):
    total: int  # bytes
    free: int
    used: int


class NvmlUtilization(NamedTuple):
    gpu: int  # percent of the last sample period with a kernel running
    memory: int  # percent of it with device memory being read or written


@dataclass(frozen=True, slots=True)
class NvmlProcessInfo:
    """`nvmlProcessInfo_t` with pynvml's conversions: no memory value -> None."""

    pid: int
    used_gpu_memory: int | None
    gpu_instance_id: int | None = None  # None when MIG is off (NVML says 0xFFFFFFFF)
    compute_instance_id: int | None = None


class NvmlApi(Protocol):
    """The NVML calls the reader makes. Every method raises `NvmlError` on failure."""

    def init(self) -> None: ...
    def shutdown(self) -> None: ...
    def device_count(self) -> int: ...
    def device_handle(self, index: int) -> object: ...
    def name(self, handle: object) -> str: ...
    def uuid(self, handle: object) -> str: ...
    def memory_info(self, handle: object) -> NvmlMemory: ...
    def utilization_rates(self, handle: object) -> NvmlUtilization: ...
    def pcie_throughput(self, handle: object, counter: int) -> int: ...  # KB/s
    def power_usage(self, handle: object) -> int: ...  # mW
    def clock_info(self, handle: object, clock: int) -> int: ...  # MHz
    def temperature(self, handle: object, sensor: int) -> int: ...  # °C
    def mig_mode(self, handle: object) -> tuple[int, int]: ...  # (current, pending)
    def max_mig_device_count(self, handle: object) -> int: ...
    def mig_device_handle(self, handle: object, index: int) -> object: ...
    def gpu_instance_id(self, handle: object) -> int: ...
    def compute_instance_id(self, handle: object) -> int: ...
    def compute_processes(self, handle: object) -> list[NvmlProcessInfo]: ...
    def graphics_processes(self, handle: object) -> list[NvmlProcessInfo]: ...
    def driver_version(self) -> str: ...  # "550.54.15"
    def cuda_driver_version(self) -> int: ...  # 12040: the CUDA version the driver supports


def process_info(obj: Any) -> NvmlProcessInfo:
    """Convert pynvml's friendly process object (`.pid`, `.usedGpuMemory`, ...)."""
    used = obj.usedGpuMemory
    if used is not None and int(used) >= NVML_VALUE_NOT_AVAILABLE_ULONGLONG:
        used = None  # pynvml maps this already; older versions did not
    return NvmlProcessInfo(
        pid=int(obj.pid),
        used_gpu_memory=None if used is None else int(used),
        gpu_instance_id=_instance_id(getattr(obj, "gpuInstanceId", None)),
        compute_instance_id=_instance_id(getattr(obj, "computeInstanceId", None)),
    )


def _instance_id(value: Any) -> int | None:
    if value is None or int(value) >= NVML_VALUE_NOT_AVAILABLE_UINT:
        return None
    return int(value)


def cuda_version_text(version: int) -> str:
    """NVML's CUDA driver version as nvidia-smi prints it: 12040 -> "12.4", 11080 -> "11.8"
    (`CUDA_VERSION_MAJOR/MINOR` of NVML's docs: major = v // 1000, minor = v % 1000 // 10)."""
    return f"{version // 1000}.{version % 1000 // 10}"


class PynvmlApi:
    """`NvmlApi` over the real `pynvml` module (the `nvidia-ml-py` distribution)."""

    def __init__(self, module_name: str = "pynvml") -> None:
        self._module_name = module_name
        self._nvml: ModuleType | None = None

    def init(self) -> None:
        try:
            module = importlib.import_module(self._module_name)
        except ImportError as error:
            # No bindings is no NVML, as far as the sidecar can tell: CPU mode.
            raise NvmlError(
                NvmlReturn.LIBRARY_NOT_FOUND, f"cannot import pynvml: {error}"
            ) from None
        self._nvml = module
        self._run(module.nvmlInit)

    def shutdown(self) -> None:
        self._run(self._lib.nvmlShutdown)

    def device_count(self) -> int:
        return int(self._run(self._lib.nvmlDeviceGetCount))

    def device_handle(self, index: int) -> object:
        return self._run(self._lib.nvmlDeviceGetHandleByIndex, index)

    def name(self, handle: object) -> str:
        return str(self._run(self._lib.nvmlDeviceGetName, handle))

    def uuid(self, handle: object) -> str:
        return str(self._run(self._lib.nvmlDeviceGetUUID, handle))

    def memory_info(self, handle: object) -> NvmlMemory:
        memory = self._run(self._lib.nvmlDeviceGetMemoryInfo, handle)
        return NvmlMemory(int(memory.total), int(memory.free), int(memory.used))

    def utilization_rates(self, handle: object) -> NvmlUtilization:
        rates = self._run(self._lib.nvmlDeviceGetUtilizationRates, handle)
        return NvmlUtilization(int(rates.gpu), int(rates.memory))

    def pcie_throughput(self, handle: object, counter: int) -> int:
        return int(self._run(self._lib.nvmlDeviceGetPcieThroughput, handle, counter))

    def power_usage(self, handle: object) -> int:
        return int(self._run(self._lib.nvmlDeviceGetPowerUsage, handle))

    def clock_info(self, handle: object, clock: int) -> int:
        return int(self._run(self._lib.nvmlDeviceGetClockInfo, handle, clock))

    def temperature(self, handle: object, sensor: int) -> int:
        return int(self._run(self._lib.nvmlDeviceGetTemperature, handle, sensor))

    def mig_mode(self, handle: object) -> tuple[int, int]:
        current, pending = self._run(self._lib.nvmlDeviceGetMigMode, handle)
        return int(current), int(pending)

    def max_mig_device_count(self, handle: object) -> int:
        return int(self._run(self._lib.nvmlDeviceGetMaxMigDeviceCount, handle))

    def mig_device_handle(self, handle: object, index: int) -> object:
        return self._run(self._lib.nvmlDeviceGetMigDeviceHandleByIndex, handle, index)

    def gpu_instance_id(self, handle: object) -> int:
        return int(self._run(self._lib.nvmlDeviceGetGpuInstanceId, handle))

    def compute_instance_id(self, handle: object) -> int:
        return int(self._run(self._lib.nvmlDeviceGetComputeInstanceId, handle))

    def compute_processes(self, handle: object) -> list[NvmlProcessInfo]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses", handle)

    def graphics_processes(self, handle: object) -> list[NvmlProcessInfo]:
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle)

    def driver_version(self) -> str:
        version = self._run(self._lib.nvmlSystemGetDriverVersion)
        return version.decode() if isinstance(version, bytes) else str(version)  # old pynvml

    def cuda_driver_version(self) -> int:
        return int(self._run(self._lib.nvmlSystemGetCudaDriverVersion))

    def _processes(self, function: str, handle: object) -> list[NvmlProcessInfo]:
        # The unversioned name raises NVMLLibraryMismatchError (not an NVMLError) when the
        # driver is older than the bindings; the versioned ones raise FunctionNotFound, so try
        # v3 (driver >= 510) and fall back to v2 (>= 470) ourselves.
        try:
            found = self._run(getattr(self._lib, f"{function}_v3"), handle)
        except NvmlError as error:
            if error.code is not NvmlReturn.FUNCTION_NOT_FOUND:
                raise
            found = self._run(getattr(self._lib, f"{function}_v2"), handle)
        return [process_info(obj) for obj in found]

    @property
    def _lib(self) -> ModuleType:
        if self._nvml is None:
            raise NvmlError(NvmlReturn.UNINITIALIZED, "PynvmlApi.init() was not called")
        return self._nvml

    def _run(self, fn: Callable[..., T], *args: object) -> T:
        with self._translated():
            return fn(*args)

    @contextmanager
    def _translated(self) -> Iterator[None]:
        """pynvml's NVMLError (one subclass per code, `.value` the code) -> NvmlError."""
        nvml_error: type[BaseException] = self._nvml.NVMLError if self._nvml else _Never
        try:
            yield
        except nvml_error as error:
            raise NvmlError(int(getattr(error, "value", NvmlReturn.UNKNOWN))) from error


class _Never(Exception):
    """Stands for pynvml.NVMLError before pynvml is imported: nothing raises it."""

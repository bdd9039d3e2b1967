"""GPU readings through NVML, behind a seam.

    records   GpuReading / GpuDevice / GpuProcess: the frozen output (no pynvml)
    nvml      NvmlApi (the Protocol), PynvmlApi (the real pynvml), NvmlError / NvmlReturn
    policy    POLICY: what each NVML error code does to a reading, as data
    reader    NvmlReader: one reading per tick, every call through its one wrapper
    record    record_fixture: a live NVML written as a test fixture (scripts/gpu_check.py)

The test double that plays fixtures back is `tests/nvml_double.py` (`RecordedNvml`).

Importing this package never imports pynvml; `PynvmlApi.init` does.
"""

from sidecar.gpu.nvml import NvmlApi, NvmlError, NvmlReturn, PynvmlApi
from sidecar.gpu.policy import POLICY, Outcome
from sidecar.gpu.reader import NvmlReader
from sidecar.gpu.records import CPU_MODE, GpuDevice, GpuProcess, GpuReading, ProcessKind

__all__ = [
    "CPU_MODE",
    "POLICY",
    "GpuDevice",
    "GpuProcess",
    "GpuReading",
    "NvmlApi",
    "NvmlError",
    "NvmlReader",
    "NvmlReturn",
    "Outcome",
    "ProcessKind",
    "PynvmlApi",
]

"""GPU readings through NVML, behind a seam.

    records      GpuReading / GpuDevice / GpuProcess: the frozen output (no pynvml)
    nvml         NvmlApi (the Protocol), PynvmlApi (the real pynvml), NvmlError / NvmlReturn
    policy       POLICY: what each NVML error code does to a reading, as data
    reader       NvmlReader: one reading per tick, every call through its one wrapper
    utilization  UtilizationPoller / GpuUtilization: utilisation through the window
    target       TargetGpus / GpuFigures: the GPUs the target uses, one line each
    record       record_fixture: a live NVML written as a test fixture (scripts/gpu_check.py)

The test double that plays fixtures back is `tests/nvml_double.py` (`RecordedNvml`).
Importing this package never imports pynvml; `PynvmlApi.init` does.
"""

from sidecar.gpu.nvml import NvmlApi, NvmlError, NvmlReturn, PynvmlApi
from sidecar.gpu.policy import POLICY, Outcome
from sidecar.gpu.reader import NvmlReader
from sidecar.gpu.target import figures_of, gpu_figures, target_gpus
from sidecar.gpu.utilization import UtilizationPoller
from sidecar.records.gpu import (
    CPU_MODE,
    GpuDevice,
    GpuFigures,
    GpuProcess,
    GpuReading,
    GpuSelection,
    GpuUse,
    GpuUtilization,
    NvmlSystem,
    ProcessKind,
    TargetGpus,
)

__all__ = [
    "CPU_MODE",
    "POLICY",
    "GpuDevice",
    "GpuFigures",
    "GpuProcess",
    "GpuReading",
    "GpuSelection",
    "GpuUse",
    "GpuUtilization",
    "NvmlApi",
    "NvmlError",
    "NvmlReader",
    "NvmlReturn",
    "NvmlSystem",
    "Outcome",
    "ProcessKind",
    "PynvmlApi",
    "TargetGpus",
    "UtilizationPoller",
    "figures_of",
    "gpu_figures",
    "target_gpus",
]

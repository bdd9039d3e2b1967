"""The one error policy for NVML calls, as data: one row per NVML return code.

Every call goes through `NvmlReader._call`, which turns an `NvmlError` into a `None` and decides,
from `POLICY` below, what else happens:

- UNSUPPORTED (NOT_SUPPORTED, FUNCTION_NOT_FOUND, INVALID_ARGUMENT, ARGUMENT_VERSION_MISMATCH,
  DEPRECATED): None, named in `unsupported`; info. NO_PERMISSION: the same, but a warning that
  names the fix.
- ABSENT (NOT_FOUND): None and nothing else; an empty MIG slot answers this. Debug.
- DEVICE_LOST (GPU_IS_LOST, RESET_REQUIRED, GPU_NOT_FOUND): that device is not asked anything
  more this tick; it appears with `lost=True` and the error in `errors`. Error.
- NVML_GONE (UNINITIALIZED, DRIVER_NOT_LOADED, LIBRARY_NOT_FOUND, LIB_RM_VERSION_MISMATCH):
  the whole reading is unavailable, and NVML is started again on the next read. Warning.
- TRANSIENT (every other code: TIMEOUT, UNKNOWN, NO_DATA, IRQ_ISSUE, ...): None, named in
  `errors`, asked again next tick. A warning the first time, debug after.

Each (field, code) is logged at its level once per reader: a field is `gpu0.power` or
`gpu0/mig1.memory`, so "once per field per device".

Starting NVML is separate: no bindings, no library, no driver or no device is CPU mode, a
`GpuReading(mode=GpuMode.CPU_MODE, reason="no NVIDIA GPU: CPU mode (...)")`, logged once at info;
other start failures (permissions, a driver upgraded under a running container) are logged
once as warnings with the fix and retried on the next read. The sidecar carries on either way.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import Enum
from typing import NamedTuple

from sidecar.gpu.nvml import NvmlReturn


class Outcome(Enum):
    UNSUPPORTED = "unsupported"
    ABSENT = "absent"
    TRANSIENT = "transient"
    DEVICE_LOST = "device_lost"
    NVML_GONE = "nvml_gone"


class Rule(NamedTuple):
    outcome: Outcome
    level: int
    hint: str = ""


_LOST_HINT = (
    "the GPU fell off the bus or needs a reset (look for Xid 79/48 in `dmesg`); "
    "reset it (`nvidia-smi -r`) or reboot"
)
_GONE_HINT = (
    "the NVIDIA driver went away or was upgraded under a running sidecar; "
    "restart the container (after a driver upgrade, reboot or reload the nvidia module)"
)
POLICY: Mapping[NvmlReturn, Rule] = {
    NvmlReturn.NOT_SUPPORTED: Rule(
        Outcome.UNSUPPORTED, logging.INFO, "this device does not report it; left empty"
    ),
    NvmlReturn.FUNCTION_NOT_FOUND: Rule(
        Outcome.UNSUPPORTED, logging.INFO, "the driver is older than this query"
    ),
    # A handle kind that rejects the query (MIG instances reject some device-wide ones).
    NvmlReturn.INVALID_ARGUMENT: Rule(Outcome.UNSUPPORTED, logging.INFO),
    NvmlReturn.ARGUMENT_VERSION_MISMATCH: Rule(
        Outcome.UNSUPPORTED, logging.INFO, "nvidia-ml-py and the driver disagree on a struct"
    ),
    NvmlReturn.DEPRECATED: Rule(Outcome.UNSUPPORTED, logging.INFO),
    NvmlReturn.NO_PERMISSION: Rule(
        Outcome.UNSUPPORTED,
        logging.WARNING,
        "run the sidecar as root, or with read access to /dev/nvidia*; "
        "on a MIG GPU, process lists of the whole GPU need root",
    ),
    NvmlReturn.NOT_FOUND: Rule(Outcome.ABSENT, logging.DEBUG),
    NvmlReturn.GPU_IS_LOST: Rule(Outcome.DEVICE_LOST, logging.ERROR, _LOST_HINT),
    NvmlReturn.RESET_REQUIRED: Rule(Outcome.DEVICE_LOST, logging.ERROR, _LOST_HINT),
    NvmlReturn.GPU_NOT_FOUND: Rule(Outcome.DEVICE_LOST, logging.ERROR, _LOST_HINT),
    NvmlReturn.UNINITIALIZED: Rule(Outcome.NVML_GONE, logging.WARNING, _GONE_HINT),
    NvmlReturn.DRIVER_NOT_LOADED: Rule(Outcome.NVML_GONE, logging.WARNING, _GONE_HINT),
    NvmlReturn.LIBRARY_NOT_FOUND: Rule(Outcome.NVML_GONE, logging.WARNING, _GONE_HINT),
    NvmlReturn.LIB_RM_VERSION_MISMATCH: Rule(Outcome.NVML_GONE, logging.WARNING, _GONE_HINT),
}
TRANSIENT = Rule(Outcome.TRANSIENT, logging.WARNING, "asked again next tick")

# Starting NVML: these codes mean "this machine has no usable NVIDIA GPU", not a fault.
CPU_MODE_CODES = {
    NvmlReturn.LIBRARY_NOT_FOUND: "libnvidia-ml.so.1 not found",
    NvmlReturn.DRIVER_NOT_LOADED: "the NVIDIA kernel driver is not loaded",
}
START_HINTS = {
    NvmlReturn.NO_PERMISSION: "give the container the GPUs (`--gpus all`, `runtime: nvidia`, "
    "or a `deploy.resources.reservations.devices` entry) or run it as root",
    NvmlReturn.LIB_RM_VERSION_MISMATCH: "the driver was upgraded without a reboot: reboot, "
    "or reload the nvidia kernel module",
}


def rule_for(code: int) -> Rule:
    return POLICY.get(code, TRANSIENT) if isinstance(code, NvmlReturn) else TRANSIENT

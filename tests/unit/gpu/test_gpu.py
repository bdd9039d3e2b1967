"""NvmlReader on recorded NVML answers (tests/fixtures/nvml), and the pynvml adapter's edges.

The fixtures hold what each pynvml call returns for one machine (see their README); the PIDs
in them are the host PIDs of the /proc trees in tests/fixtures/proc_ns, so the namespace
mapping is tested on the same deployment from both sides.
"""

from __future__ import annotations

import copy
import ctypes
import importlib.util
import logging
import sys
import types
from dataclasses import replace
from pathlib import Path
from typing import Any

import pynvml
import pytest
import yaml

from devtools.nvml_fixture import record_fixture
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules
from sidecar.gpu import (
    CPU_MODE,
    POLICY,
    GpuReading,
    GpuSelection,
    NvmlError,
    NvmlReader,
    NvmlReturn,
    Outcome,
    ProcessKind,
    PynvmlApi,
    UtilizationPoller,
    gpu_figures,
    target_gpus,
)
from sidecar.gpu import nvml as nvml_module
from sidecar.gpu.nvml import process_info
from sidecar.records import Role
from sidecar.records.gpu import GpuMode, PidMatch
from sidecar.records.window import Window
from sidecar.report.text import render
from sidecar.target.discovery import Deployment
from sidecar.target.pidmap import PidMap
from sidecar.target.procfs import ProcFs
from sidecar.window.pipeline import profile_window
from sidecar.window.readers import WindowReaders, open_gpu_reader
from tests.nvml_double import RecordedNvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
NVML = FIXTURES / "nvml"
PROC_NS = FIXTURES / "proc_ns"
LOGGER = "vllm_sidecar.gpu"


def fixture(name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((NVML / f"{name}.yaml").read_text())
    return data


def reader_for(data: dict[str, Any]) -> tuple[NvmlReader, RecordedNvml]:
    api = RecordedNvml(data)
    return NvmlReader(api, clock=lambda: 100.0, wall_clock=lambda: 1_700_000_000.0), api


def one_gpu(**fields: Any) -> dict[str, Any]:
    """The H100 recording with some calls' answers replaced."""
    data = fixture("h100_tp1")
    data["devices"][0].update(fields)
    return data


def messages(caplog: pytest.LogCaptureFixture, level: int | None = None) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == LOGGER and (level is None or r.levelno == level)
    ]


# --- one GPU, everything supported ---------------------------------------------------------------


def test_single_gpu_reading_converts_nvml_units() -> None:
    reader, _ = reader_for(fixture("h100_tp1"))
    reading = reader.read()
    assert (reading.available, reading.reason, reading.unsupported, reading.errors) == (
        True,
        None,
        (),
        (),
    )
    assert (reading.taken_at, reading.wall_time) == (100.0, 1_700_000_000.0)
    [gpu] = reading.devices
    assert gpu.label == "gpu0"
    assert (gpu.name, gpu.uuid) == (
        "NVIDIA H100 80GB HBM3",
        "GPU-5a3ee0b4-7c51-96a4-2f7d-a8c1d5e93b10",
    )
    assert (gpu.memory_used_bytes, gpu.memory_total_bytes) == (78023245824, 85520809984)
    assert (gpu.util_gpu_pct, gpu.util_memory_pct) == (97, 58)
    assert gpu.pcie_tx_bytes_per_s == 10830 * 1024  # NVML's KB/s are KiB/s
    assert gpu.pcie_rx_bytes_per_s == 118342 * 1024
    assert gpu.power_w == pytest.approx(412.345)  # from mW
    assert (gpu.sm_clock_mhz, gpu.temperature_c) == (1980, 61)
    assert (gpu.mig, gpu.mig_enabled, gpu.mig_index, gpu.lost) == (False, False, None, False)
    [process] = gpu.processes
    assert (process.pid, process.used_memory_bytes, process.kind) == (
        523190,
        77469597696,
        ProcessKind.COMPUTE,
    )
    assert (process.matched, process.target_pid) == (PidMatch.NONE, None)  # no targets named


def test_single_gpu_process_is_attributed_through_the_nested_namespaces() -> None:
    """The sidecar reads the outer container's /proc; NVML answers with host PIDs."""
    pidmap = PidMap.build(
        ProcFs(PROC_NS / "nested" / "outer"),
        [3301, 3342],
        host_procfs=ProcFs(PROC_NS / "nested" / "host"),
    )
    reader, _ = reader_for(fixture("h100_tp1"))
    [process] = reader.read(pidmap).for_target(3342)
    assert (process.matched, process.pid_host, process.pid_local) == (PidMatch.HOST, 523190, 28)
    assert process.device_index == 0


# --- two GPUs, vLLM with TP=2 --------------------------------------------------------------------


def docker_tp2(view: str, *, host_proc: bool = False) -> PidMap:
    pids = {"host": [412301, 412388, 412455, 412456], "container": [1, 87, 154, 155]}[view]
    host = ProcFs(PROC_NS / "docker_tp2" / "host") if host_proc else None
    return PidMap.build(ProcFs(PROC_NS / "docker_tp2" / view), pids, host_procfs=host)


def test_tp2_has_one_worker_per_gpu_seen_from_the_host() -> None:
    reader, _ = reader_for(fixture("a100_tp2"))
    reading = reader.read(docker_tp2("host"))
    assert [d.index for d in reading.devices] == [0, 1]
    attributed = {(p.device_index, p.pid, p.target_pid, p.matched) for p in reading.processes()}
    assert attributed == {
        (0, 412455, 412455, PidMatch.HOST),
        (1, 412456, 412456, PidMatch.HOST),
        (1, 398010, None, PidMatch.NONE),  # another tenant on GPU 1
    }
    assert reading.for_target(412388) == ()  # the EngineCore holds no context at TP=2


def test_tp2_from_inside_vllms_container_with_the_host_proc_mounted() -> None:
    reader, _ = reader_for(fixture("a100_tp2"))
    reading = reader.read(docker_tp2("container", host_proc=True))
    [worker0] = reading.for_target(154)
    [worker1] = reading.for_target(155)
    assert (worker0.device_index, worker0.pid, worker0.pid_local) == (0, 412455, 154)
    assert (worker1.device_index, worker1.pid, worker1.pid_local) == (1, 412456, 155)
    assert {worker0.matched, worker1.matched} == {PidMatch.HOST}
    assert worker0.used_memory_bytes == 77218152448


# --- MIG ----------------------------------------------------------------------------------------


def test_mig_gpu_lists_processes_per_instance() -> None:
    reader, api = reader_for(fixture("a100_mig"))
    reading = reader.read({701234: 87})
    parent, first, second = reading.devices
    assert (parent.mig, parent.mig_enabled, parent.processes) == (False, True, ())
    assert parent.power_w == pytest.approx(221.45)
    assert [d.label for d in reading.devices] == ["gpu0", "gpu0/mig0", "gpu0/mig1"]
    # An instance carries its parent's index: both are GPU 0 to NVML and to CUDA's order.
    assert (first.mig, first.index, first.gpu_instance_id, first.compute_instance_id) == (
        True,
        0,
        1,
        0,
    )
    assert first.name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert (first.memory_used_bytes, first.memory_total_bytes) == (37580963840, 42144366592)
    # Clocks, power, temperature and PCIe are the parent's: an instance is not asked for them.
    assert (first.power_w, first.sm_clock_mhz, first.temperature_c) == (None, None, None)
    assert not [c for c in api.calls if c[0] in ("power", "sm_clock") and c[1] != (0,)]
    [vllm] = first.processes
    assert (vllm.pid, vllm.mig_index, vllm.matched, vllm.target_pid) == (
        701234,
        0,
        PidMatch.HOST,
        87,
    )
    [tenant] = second.processes
    assert (tenant.pid, tenant.used_memory_bytes, tenant.mig_index) == (702881, None, 1)
    # The whole-GPU process list needs root in MIG mode and would count everything twice.
    assert ("compute_processes", (0,)) not in api.calls
    assert reading.unsupported == (
        "gpu0.utilization",
        "gpu0/mig0.utilization",
        "gpu0/mig0.graphics_processes",
        "gpu0/mig1.utilization",
        "gpu0/mig1.graphics_processes",
    )


# --- fields a card does not support -------------------------------------------------------------


def test_unsupported_fields_are_none_every_time_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    reader, _ = reader_for(fixture("geforce_laptop"))
    readings = [reader.read() for _ in range(3)]
    expected = ("gpu0.mig_mode", "gpu0.pcie_tx", "gpu0.pcie_rx", "gpu0.power")
    for reading in readings:
        [gpu] = reading.devices
        assert reading.unsupported == expected
        assert (gpu.pcie_tx_bytes_per_s, gpu.pcie_rx_bytes_per_s, gpu.power_w) == (None, None, None)
        assert (gpu.mig_enabled, gpu.util_gpu_pct, gpu.temperature_c) == (None, 73, 66)
    logged = messages(caplog, logging.INFO)
    assert len(logged) == 4
    for field in expected:
        assert sum(f"NVML {field}: NVMLError_NotSupported" in m for m in logged) == 1


def test_graphics_and_compute_contexts_are_merged_per_process() -> None:
    data = fixture("geforce_laptop")
    both = {
        "pid": 2011,
        "usedGpuMemory": 52428800,
        "gpuInstanceId": 4294967295,
        "computeInstanceId": 4294967295,
    }
    data["devices"][0]["compute_processes"].append(both)
    reader, _ = reader_for(data)
    kinds = {p.pid: (p.kind, p.used_memory_bytes) for p in reader.read().processes()}
    assert kinds == {
        1432: (ProcessKind.GRAPHICS, 4194304),
        2011: (ProcessKind.BOTH, 52428800),
        30711: (ProcessKind.COMPUTE, 1610612736),
    }


# --- PIDs in another namespace ------------------------------------------------------------------


def test_container_view_without_host_proc_cannot_attribute_and_says_how_to_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader, _ = reader_for(fixture("a100_tp2"))
    pidmap = docker_tp2("container")
    for _ in range(2):
        reading = reader.read(pidmap)
        assert {p.matched for p in reading.processes()} == {PidMatch.NONE}
    [warning] = messages(caplog, logging.WARNING)
    assert "no known host PID" in warning
    assert "/host_proc" in warning


def test_nvml_answering_in_the_containers_namespace_is_matched_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Never assume which namespace answered: a driver that translated PIDs would be matched."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    data = fixture("a100_tp2")
    data["devices"][0]["compute_processes"][0]["pid"] = 154
    reader, _ = reader_for(data)
    [worker0] = reader.read(docker_tp2("container", host_proc=True)).for_target(154)
    assert (worker0.pid, worker0.matched, worker0.pid_host) == (154, PidMatch.LOCAL, 412455)
    assert "NVML answered with local PIDs" in messages(caplog, logging.INFO)


def test_a_plain_host_to_local_mapping_works_as_targets() -> None:
    reader, _ = reader_for(fixture("a100_tp2"))
    [worker1] = reader.read({412456: 155}).for_target(155)
    assert (worker1.device_index, worker1.matched, worker1.pid_host) == (1, PidMatch.HOST, 412456)


def test_an_ambiguous_pid_takes_the_host_match_and_warns(caplog: pytest.LogCaptureFixture) -> None:
    reader, _ = reader_for(fixture("h100_tp1"))
    # NVML's 523190 is target A's host PID and target B's local PID.
    reading = reader.read(PidMap.from_pairs({523190: 28, 600001: 523190}))
    [process] = reading.processes()
    assert (process.matched, process.target_pid) == (PidMatch.HOST, 28)
    [warning] = messages(caplog, logging.WARNING)
    assert "NVML PID 523190 is the host PID of target 28" in warning


# --- no library, no device: CPU mode ------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "detail"),
    [
        ({"init": {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}}, "libnvidia-ml.so.1 not found"),
        (
            {"init": {"error": "NVML_ERROR_DRIVER_NOT_LOADED"}},
            "the NVIDIA kernel driver is not loaded",
        ),
        ({"devices": []}, "NVML sees no devices"),
    ],
    ids=["no-library", "no-driver", "no-device"],
)
def test_no_gpu_is_cpu_mode_logged_once(
    data: dict[str, Any], detail: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    reader, api = reader_for(data)
    readings = [reader.read() for _ in range(3)]
    for reading in readings:
        assert reading == GpuReading(
            100.0, 1_700_000_000.0, GpuMode.CPU_MODE, reason=f"{CPU_MODE} ({detail})"
        )
    assert messages(caplog) == [f"no NVIDIA GPU: CPU mode ({detail})"]
    assert api.calls.count(("init",)) == 1  # CPU mode is for good: NVML is not asked again


def test_opening_the_reader_on_a_cpu_host_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    """`run` and `snapshot` open the reader at start: one line for CPU mode (it was logged
    twice, by the reader and again by the opener)."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    api = RecordedNvml({"init": {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}})
    reader = open_gpu_reader(True, api)
    assert reader is not None
    assert not reader.read().available
    assert messages(caplog) == ["no NVIDIA GPU: CPU mode (libnvidia-ml.so.1 not found)"]
    assert open_gpu_reader(False, api) is None


def test_missing_pynvml_is_cpu_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # what `import pynvml` sees when absent
    reading = NvmlReader(PynvmlApi()).read()
    assert not reading.available and reading.mode is GpuMode.CPU_MODE
    assert reading.reason is not None
    assert reading.reason.startswith("no NVIDIA GPU: CPU mode (cannot import pynvml")


def _has_libnvidia_ml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_libnvidia_ml(), reason="this machine has an NVIDIA driver")
def test_real_pynvml_without_a_driver_is_cpu_mode() -> None:
    with NvmlReader() as reader:
        reading = reader.read()
    assert reading.reason == f"{CPU_MODE} (libnvidia-ml.so.1 not found)"


def test_other_start_failures_name_the_fix_and_are_retried(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader, api = reader_for({"init": {"error": "NVML_ERROR_NO_PERMISSION"}, "devices": []})
    first, second = reader.read(), reader.read()
    assert first.reason == second.reason
    assert first.reason is not None and "--gpus all" in first.reason
    assert first.mode is second.mode is GpuMode.UNAVAILABLE  # a failure, not a CPU host
    assert api.calls.count(("init",)) == 2
    assert len(messages(caplog, logging.WARNING)) == 1


# --- the error policy, one row per outcome -------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "outcome"),
    [
        (NvmlReturn.NOT_SUPPORTED, Outcome.UNSUPPORTED),
        (NvmlReturn.FUNCTION_NOT_FOUND, Outcome.UNSUPPORTED),
        (NvmlReturn.INVALID_ARGUMENT, Outcome.UNSUPPORTED),
        (NvmlReturn.NO_PERMISSION, Outcome.UNSUPPORTED),
        (NvmlReturn.NOT_FOUND, Outcome.ABSENT),
        (NvmlReturn.GPU_IS_LOST, Outcome.DEVICE_LOST),
        (NvmlReturn.RESET_REQUIRED, Outcome.DEVICE_LOST),
        (NvmlReturn.UNINITIALIZED, Outcome.NVML_GONE),
        (NvmlReturn.LIB_RM_VERSION_MISMATCH, Outcome.NVML_GONE),
    ],
)
def test_policy_table(code: NvmlReturn, outcome: Outcome) -> None:
    assert POLICY[code].outcome is outcome


def test_codes_without_a_row_are_transient() -> None:
    assert NvmlReturn.TIMEOUT not in POLICY
    assert NvmlReturn.UNKNOWN not in POLICY


def test_no_permission_is_unsupported_with_a_warning_that_names_the_fix(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reader, _ = reader_for(one_gpu(compute_processes={"error": "NVML_ERROR_NO_PERMISSION"}))
    reading = reader.read()
    assert reading.unsupported == ("gpu0.compute_processes",)
    assert reading.devices[0].processes == ()
    [warning] = messages(caplog, logging.WARNING)
    assert "NVMLError_NoPermission" in warning and "root" in warning


def test_transient_errors_are_counted_each_time_and_warned_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    power = {"sequence": [{"error": "NVML_ERROR_TIMEOUT"}, {"error": "NVML_ERROR_TIMEOUT"}, 412345]}
    reader, _ = reader_for(one_gpu(power=power))
    first, second, third = reader.read(), reader.read(), reader.read()
    assert first.errors == second.errors == ("gpu0.power: NVMLError_Timeout",)
    assert first.devices[0].power_w is None and first.unsupported == ()
    assert third.errors == () and third.devices[0].power_w == pytest.approx(412.345)
    assert len(messages(caplog, logging.WARNING)) == 1
    assert len(messages(caplog, logging.DEBUG)) == 1


def test_an_empty_mig_slot_is_absent_not_an_error() -> None:
    reader, _ = reader_for(fixture("a100_mig"))
    reading = reader.read()
    assert not any("mig2" in name for name in (*reading.unsupported, *reading.errors))


def test_a_lost_gpu_is_marked_and_the_others_still_read(caplog: pytest.LogCaptureFixture) -> None:
    data = fixture("a100_tp2")
    data["devices"][0]["utilization"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    reader, api = reader_for(data)
    reading = reader.read()
    lost, healthy = reading.devices
    assert (lost.lost, lost.memory_used_bytes, lost.processes) == (True, None, ())
    assert (healthy.lost, healthy.util_gpu_pct) == (False, 91)
    assert reading.errors == ("gpu0.utilization: NVMLError_GpuIsLost",)
    assert ("power", (0,)) not in api.calls  # nothing more is asked of a lost GPU
    [error] = messages(caplog, logging.ERROR)
    assert "Xid" in error


@pytest.mark.parametrize("code", ["NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED"])
def test_a_lost_gpu_while_counting_is_an_unavailable_reading_not_an_exception(code: str) -> None:
    """It escaped `read()` as a private exception on 0.1, which the daemon counts as a bug."""
    data = fixture("h100_tp1")
    data["device_count"] = {"sequence": [1, {"error": code}, {"error": code}]}
    reader, _ = reader_for(data)
    assert reader.open() is None  # open() asks for the count once, then each read asks again
    reading = reader.read()
    assert not reading.available and reading.devices == ()
    assert reading.mode is GpuMode.UNAVAILABLE
    assert reading.reason is not None and "dmesg" in reading.reason
    assert reader.read_utilization() == {}


def test_nvml_gone_mid_run_is_unavailable_then_restarted() -> None:
    count = {"sequence": [1, {"error": "NVML_ERROR_UNINITIALIZED"}, 1]}
    data = fixture("h100_tp1")
    data["device_count"] = count
    reader, api = reader_for(data)
    # open() asks for the count once, then each read asks again.
    assert reader.open() is None
    gone = reader.read()
    assert not gone.available and gone.mode is GpuMode.UNAVAILABLE
    assert gone.reason is not None and gone.reason.startswith(
        "NVML unavailable: NVMLError_Uninitialized"
    )
    back = reader.read()
    assert back.available and back.mode is GpuMode.GPU and back.devices[0].util_gpu_pct == 97
    assert api.calls.count(("init",)) == 2


def test_close_shuts_nvml_down_once() -> None:
    reader, api = reader_for(fixture("h100_tp1"))
    with reader:
        reader.read()
    reader.close()
    assert api.calls.count(("shutdown",)) == 1


# --- the recorded seam and the real module agree --------------------------------------------------


def test_return_codes_and_constants_are_pynvmls() -> None:
    for code in NvmlReturn:
        assert getattr(pynvml, f"NVML_ERROR_{code.name}") == code.value
        assert NvmlError(code).name == type(pynvml.NVMLError(code.value)).__name__
    assert nvml_module.NVML_PCIE_UTIL_TX_BYTES == pynvml.NVML_PCIE_UTIL_TX_BYTES
    assert nvml_module.NVML_PCIE_UTIL_RX_BYTES == pynvml.NVML_PCIE_UTIL_RX_BYTES
    assert nvml_module.NVML_CLOCK_SM == pynvml.NVML_CLOCK_SM
    assert nvml_module.NVML_TEMPERATURE_GPU == pynvml.NVML_TEMPERATURE_GPU
    assert nvml_module.NVML_DEVICE_MIG_ENABLE == pynvml.NVML_DEVICE_MIG_ENABLE


@pytest.mark.parametrize("name", ["NVML_ERROR_GPU_IS_LOST", "GPU_IS_LOST", "NVMLError_GpuIsLost"])
def test_error_names_parse_in_every_spelling(name: str) -> None:
    assert NvmlReturn.parse(name) is NvmlReturn.GPU_IS_LOST


def test_process_info_converts_pynvmls_own_structs() -> None:
    raw = pynvml.c_nvmlProcessInfo_v2_t(
        pid=412455, usedGpuMemory=2**64 - 1, gpuInstanceId=2**32 - 1, computeInstanceId=2**32 - 1
    )
    info = process_info(pynvml.nvmlStructToFriendlyObject(raw))
    assert (info.pid, info.used_gpu_memory, info.gpu_instance_id, info.compute_instance_id) == (
        412455,
        None,
        None,
        None,
    )
    mig = pynvml.c_nvmlProcessInfo_v2_t(
        pid=7, usedGpuMemory=1 << 30, gpuInstanceId=1, computeInstanceId=0
    )
    assert process_info(pynvml.nvmlStructToFriendlyObject(mig)).gpu_instance_id == 1


def test_pynvml_api_translates_errors_and_falls_back_to_v2(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in module with pynvml's own error classes: an old driver without the _v3 call."""
    fake = types.ModuleType("old_driver_pynvml")
    fake.NVMLError = pynvml.NVMLError  # type: ignore[attr-defined]

    def missing(handle: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)

    def unsupported(handle: object) -> None:
        raise pynvml.NVMLError_NotSupported()

    v2 = pynvml.c_nvmlProcessInfo_v2_t(
        pid=5, usedGpuMemory=1 << 20, gpuInstanceId=2**32 - 1, computeInstanceId=2**32 - 1
    )
    fake.nvmlInit = lambda: None  # type: ignore[attr-defined]
    fake.nvmlDeviceGetComputeRunningProcesses_v3 = missing  # type: ignore[attr-defined]
    fake.nvmlDeviceGetComputeRunningProcesses_v2 = lambda h: [pynvml.nvmlStructToFriendlyObject(v2)]  # type: ignore[attr-defined]
    fake.nvmlDeviceGetPowerUsage = unsupported  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "old_driver_pynvml", fake)
    api = PynvmlApi("old_driver_pynvml")
    api.init()
    [process] = api.compute_processes(object())
    assert (process.pid, process.used_gpu_memory) == (5, 1 << 20)
    with pytest.raises(NvmlError) as raised:
        api.power_usage(object())
    assert raised.value.code is NvmlReturn.NOT_SUPPORTED


def test_recorded_fixtures_reject_unknown_keys() -> None:
    with pytest.raises(ValueError, match="powr"):
        RecordedNvml(one_gpu(powr=1))


def test_record_fixture_round_trips_through_recorded_nvml() -> None:
    original = RecordedNvml(fixture("a100_mig"))
    recorded = record_fixture(original, "test")
    again = yaml.safe_load(yaml.safe_dump(recorded))
    first, _ = reader_for(fixture("a100_mig"))
    second, _ = reader_for(again)
    assert second.read({701234: 87}) == first.read({701234: 87})


def test_fixtures_are_not_modified_by_reading() -> None:
    data = fixture("a100_tp2")
    before = copy.deepcopy(data)
    reader, _ = reader_for(data)
    reader.read(docker_tp2("host"))
    assert data == before


# --- scripts/gpu_check.py without a GPU ----------------------------------------------------------


def load_gpu_check(monkeypatch: pytest.MonkeyPatch) -> Any:
    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    assert spec is not None and spec.loader is not None
    gpu_check = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "gpu_check", gpu_check)  # dataclasses look themselves up
    spec.loader.exec_module(gpu_check)
    return gpu_check


def test_gpu_check_without_a_gpu_says_so_and_exits_2(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    gpu_check = load_gpu_check(monkeypatch)
    no_library = RecordedNvml({"init": {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}})
    assert gpu_check.main(["--seconds", "1"], api=no_library) == 2
    assert "no NVIDIA GPU" in capsys.readouterr().err


def test_gpu_check_prints_the_sidecars_figures_and_checks_the_childs_gpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the recorded H100: the child is NVML's PID 523190; torch names the GPU by UUID."""
    gpu_check = load_gpu_check(monkeypatch)
    reader, _ = reader_for(fixture("h100_tp1"))
    samples = gpu_check.sample(reader, PidMap.from_pairs({523190: 523190}), 523190,
                               gpu_check.Samples())  # fmt: skip
    args = gpu_check.parse_args([])
    torch_uuid = {"uuid": "5a3ee0b4-7c51-96a4-2f7d-a8c1d5e93b10"}
    rows, failures = gpu_check.sidecar_figures(args, 523190, torch_uuid, samples, ())
    assert failures == ["NVML answered utilisation to readings but not to the poller"]
    assert dict(rows) == {
        "gpu0 memory used / total": "72.7 GiB / 79.6 GiB (nvidia-smi: 74408 MiB / 81559 MiB)",
        "child's GPU, as the sidecar finds it": "gpu0 (nvml process list: PIDs 523190)",
        "gpu0 utilisation, polled through the run": "not polled",
    }
    other = {"uuid": "00000000-7c51-96a4-2f7d-a8c1d5e93b10"}
    _, failures = gpu_check.sidecar_figures(args, 523190, other, samples, ())
    assert "the sidecar puts the child on ('gpu0',); torch on 0000" in failures[0]


# --- the target's GPUs on a shared host ----------------------------------------------------------

PROC_GPU = FIXTURES / "proc_gpu"
H100_TOTAL = 85_520_809_984


def h100x4_target() -> tuple[ProcFs, list[int]]:
    """vLLM TP=2 on GPUs 2 and 3 of four; another tenant's vLLM on GPUs 0 and 1."""
    return ProcFs(PROC_GPU / "h100x4_tp2"), [81301, 81388, 81455, 81456]


def test_tp2_on_a_shared_host_uses_only_the_gpus_holding_its_workers() -> None:
    procfs, pids = h100x4_target()
    reader, _ = reader_for(fixture("h100x4_tp2"))
    reading = reader.read(PidMap.build(procfs, pids))
    target = target_gpus(reading, pids, procfs.environ, world_size=2)
    assert target is not None
    assert (target.labels, target.indexes) == (("gpu2", "gpu3"), (2, 3))
    assert (target.how, target.detail) == (GpuSelection.NVML_PROCESSES, "PIDs 81455, 81456")
    figures = gpu_figures(reading, target)
    assert figures is not None
    assert figures.memory_totals == {"gpu2": H100_TOTAL, "gpu3": H100_TOTAL}
    assert figures.lines() == [
        "GPUs used: 2, 3 (nvml process list: PIDs 81455, 81456)",
        "GPU 2 (NVIDIA H100 80GB HBM3): 73.5 GiB / 79.6 GiB (92.3%), vLLM 73.0 GiB",
        "GPU 3 (NVIDIA H100 80GB HBM3): 73.5 GiB / 79.6 GiB (92.3%), vLLM 73.0 GiB",
    ]


def test_without_nvml_processes_cuda_visible_devices_decides() -> None:
    """A sidecar in vLLM's container: NVML lists no processes; CUDA_VISIBLE_DEVICES=1,3."""
    procfs, pids = ProcFs(PROC_GPU / "container_tp2"), [1, 87, 154, 155]
    reader, _ = reader_for(fixture("h100x4_container"))
    reading = reader.read(PidMap.build(procfs, pids))
    assert reading.processes() == ()
    target = target_gpus(reading, pids, procfs.environ, world_size=2)
    assert target is not None
    assert (target.labels, target.how) == (("gpu1", "gpu3"), GpuSelection.CUDA_VISIBLE_DEVICES)
    assert target.detail == (
        "CUDA_VISIBLE_DEVICES=1,3 of PID 1, first 2 (tensor x pipeline parallel)"
    )
    figures = gpu_figures(reading, target)
    assert figures is not None
    assert [d.target_memory_bytes for d in figures.devices] == [None, None]  # NVML said nothing
    assert figures.lines()[1] == "GPU 1 (NVIDIA H100 80GB HBM3): 73.5 GiB / 79.6 GiB (92.3%)"


def environ_of(**env: str) -> Any:
    return lambda pid: env


CONTAINER_UUIDS = (
    "GPU-3b2e1c40-5d6f-4071-8c8d-9e0f1a2b3c4d,GPU-4c3f2d51-6e70-4182-9d9e-0f1a2b3c4d5e"
)


@pytest.mark.parametrize(
    ("env", "world", "labels", "how"),
    [
        # The Kubernetes device plugin lists the container's GPUs by UUID; vLLM takes the first 2.
        ({"NVIDIA_VISIBLE_DEVICES": CONTAINER_UUIDS}, 2, ("gpu2", "gpu3"), GpuSelection.DEVICE_ORDER),
        # CUDA_VISIBLE_DEVICES counts within the container's devices.
        ({"NVIDIA_VISIBLE_DEVICES": "2,3", "CUDA_VISIBLE_DEVICES": "1"}, 1, ("gpu3",), GpuSelection.CUDA_VISIBLE_DEVICES),
        ({"CUDA_VISIBLE_DEVICES": "GPU-2a1d"}, None, ("gpu1",), GpuSelection.CUDA_VISIBLE_DEVICES),
        # CUDA stops at the first entry it cannot use.
        ({"CUDA_VISIBLE_DEVICES": "0,-1,1"}, None, ("gpu0",), GpuSelection.CUDA_VISIBLE_DEVICES),
        ({"CUDA_VISIBLE_DEVICES": ""}, None, (), GpuSelection.CUDA_VISIBLE_DEVICES),
        # Docker's --gpus leaves the image's `all`: the container's view is not known from it.
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, 2, ("gpu0", "gpu1"), GpuSelection.DEVICE_ORDER),
        ({}, None, ("gpu0", "gpu1", "gpu2", "gpu3"), GpuSelection.ALL_DEVICES),
    ],
    ids=["uuids-in-container", "index-in-container", "uuid-prefix", "stops-at-invalid", "empty",
         "docker-all", "nothing-known"],
)  # fmt: skip
def test_the_environment_names_the_gpus(
    env: dict[str, str], world: int | None, labels: tuple[str, ...], how: GpuSelection
) -> None:
    reader, _ = reader_for(fixture("h100x4_container"))
    target = target_gpus(reader.read(), [1], environ_of(**env), world_size=world)
    assert target is not None and (target.labels, target.how) == (labels, how)


def test_an_unreadable_environment_falls_back_to_all_devices_and_says_why() -> None:
    reader, _ = reader_for(fixture("h100x4_container"))
    target = target_gpus(reader.read(), [1], lambda pid: None)
    assert target is not None and target.how is GpuSelection.ALL_DEVICES
    assert target.detail.endswith("the target's environment is unreadable")


def test_cuda_indexes_on_a_host_of_mixed_gpus_are_a_caveat() -> None:
    data = fixture("h100x4_container")
    data["devices"][0]["name"] = "NVIDIA A100-SXM4-80GB"
    reader, _ = reader_for(data)
    target = target_gpus(reader.read(), [1], environ_of(CUDA_VISIBLE_DEVICES="1"))
    assert target is not None and "CUDA_DEVICE_ORDER" in target.caveats[0]
    ordered = environ_of(CUDA_VISIBLE_DEVICES="1", CUDA_DEVICE_ORDER="PCI_BUS_ID")
    target = target_gpus(reader.read(), [1], ordered)
    assert target is not None and target.caveats == ()


def test_a_mig_instance_is_the_targets_gpu() -> None:
    reader, _ = reader_for(fixture("a100_mig"))
    reading = reader.read({701234: 87})
    target = target_gpus(reading, [87], lambda pid: None)
    assert target is not None and (target.labels, target.indexes) == (("gpu0/mig0",), (0,))
    figures = gpu_figures(reading, target)
    assert figures is not None and figures.memory_totals == {"gpu0/mig0": 42144366592}
    assert figures.lines()[1].startswith("GPU 0 MIG 0 (NVIDIA A100-SXM4-80GB MIG 3g.40gb): ")


def test_no_devices_no_target_gpus() -> None:
    reader, _ = reader_for({"init": {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}})
    assert target_gpus(reader.read(), [1], lambda pid: None) is None
    assert gpu_figures(None, None) is None


# --- utilisation through the window --------------------------------------------------------------


class FakeTime:
    """A monotonic clock and a wait that advances it; polling ends after `polls` waits."""

    def __init__(self, polls: int, poll_s: float = 0.0) -> None:
        self.now, self.polls, self.poll_s = 0.0, polls, poll_s
        self.waits: list[float] = []

    def clock(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return len(self.waits) >= self.polls


def test_utilisation_is_polled_through_the_window_on_absolute_deadlines() -> None:
    reader, _ = reader_for(fixture("h100x4_tp2"))
    reader.read()  # the window's start takes each GPU's first answer
    fake = FakeTime(polls=4)
    poller = UtilizationPoller(reader, interval_s=1.0, clock=fake.clock, wait=fake.wait)
    poller.run()
    gpu0, _, gpu2, gpu3 = poller.summary()
    assert (gpu0.samples, gpu0.mean_pct) == (4, 64.0)
    assert (gpu2.label, gpu2.samples, gpu2.min_pct, gpu2.max_pct) == ("gpu2", 4, 4, 97)
    assert gpu2.mean_pct == pytest.approx((88 + 97 + 91 + 4) / 4)
    assert (gpu3.samples, gpu3.missed) == (3, 1)  # one poll timed out: counted, not averaged
    assert gpu3.mean_pct == pytest.approx((86 + 90 + 6) / 3)
    assert (gpu2.first_at, gpu2.last_at) == (0.0, 3.0)
    assert gpu2.text == "util 70% mean (4-97%, 4 samples)"


def test_a_slow_poll_skips_the_deadlines_it_missed() -> None:
    reader, _ = reader_for(fixture("h100_tp1"))
    fake = FakeTime(polls=3)

    def slow_clock() -> float:
        fake.now += 0.6  # each reading of the clock costs 0.6 s: a poll takes 1.2 s
        return fake.now

    poller = UtilizationPoller(reader, interval_s=1.0, clock=slow_clock, wait=fake.wait)
    reader.open()
    poller.run()
    assert all(0 < w <= 1.0 for w in fake.waits)
    [gpu] = poller.summary()
    assert gpu.samples == 3


def test_the_poller_thread_polls_at_least_once_and_stops() -> None:
    reader, _ = reader_for(fixture("h100x4_tp2"))
    reader.open()
    poller = UtilizationPoller(reader, interval_s=60.0)
    poller.start()
    summary = poller.stop()  # long before the first interval ends
    assert [u.samples for u in summary] == [1, 1, 1, 1]


def test_utilisation_reads_nothing_before_nvml_is_open_and_none_for_a_lost_gpu() -> None:
    data = fixture("a100_tp2")
    data["devices"][1]["utilization"] = {"error": "NVML_ERROR_GPU_IS_LOST"}
    reader, api = reader_for(data)
    assert reader.read_utilization() == {}
    assert ("init",) not in api.calls  # the poller never starts NVML
    reader.open()
    assert reader.read_utilization() == {"gpu0": 88, "gpu1": None}


def test_gpu_lines_carry_the_windows_utilisation() -> None:
    procfs, pids = h100x4_target()
    reader, _ = reader_for(fixture("h100x4_tp2"))
    reading = reader.read(PidMap.build(procfs, pids))
    fake = FakeTime(polls=4)
    poller = UtilizationPoller(reader, clock=fake.clock, wait=fake.wait)
    poller.run()
    figures = gpu_figures(reading, target_gpus(reading, pids, procfs.environ), poller.summary())
    assert figures is not None
    assert figures.lines()[1:] == [
        "GPU 2 (NVIDIA H100 80GB HBM3): 73.5 GiB / 79.6 GiB (92.3%), vLLM 73.0 GiB; "
        "util 70% mean (4-97%, 4 samples)",
        "GPU 3 (NVIDIA H100 80GB HBM3): 73.5 GiB / 79.6 GiB (92.3%), vLLM 73.0 GiB; "
        "util 61% mean (6-90%, 3 samples)",
    ]


# --- the collector's wiring: a window on the 4-GPU host ------------------------------------------


class InstantSampler:
    """A stack sampler whose window ends at once, with no stacks (they are not the point)."""

    def window(self, duration_s: float, stop: Any = None, laps: Any = None) -> Window:
        return Window(1_780_000_000.0, duration_s, 0.0, (), 0, 0, 0.0, 1)


class RecordedMetrics:
    """The recorded /metrics pair, with the cache labels of vLLM on GPUs (no budget label)."""

    url = "http://127.0.0.1:8001/metrics"

    def __init__(self) -> None:
        labels = (
            ('kv_cache_memory_bytes="1073741824"', 'kv_cache_memory_bytes="None"'),
            ('num_gpu_blocks="4096"', 'num_gpu_blocks="16384"'),
            ('block_size="128"', 'block_size="16"'),
        )
        self.texts = []
        for name in ("before", "after"):
            text = (FIXTURES / "metrics" / f"v0.32.0-cpu-{name}.txt").read_text()
            for old, new in labels:
                assert old in text
                text = text.replace(old, new)
            self.texts.append(text)

    def fetch(self) -> str:
        return self.texts.pop(0) if len(self.texts) > 1 else self.texts[0]


def test_a_collected_window_counts_the_targets_gpus_only() -> None:
    procfs, pids = h100x4_target()
    roles = (Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER, Role.WORKER)
    infos = [procfs.read(pid) for pid in pids]
    processes = tuple(replace(p, role=r) for p, r in zip(infos, roles, strict=True) if p)
    target = Deployment(root=processes[0], processes=processes)
    readers = WindowReaders(procfs=procfs, metrics=RecordedMetrics(),
                            gpu=NvmlReader(RecordedNvml(fixture("h100x4_tp2"))))  # fmt: skip
    snapshot = profile_window(target, InstantSampler(), Classifier(load_rules()), readers, 1.0,
                              host="h")  # type: ignore[arg-type]  # fmt: skip
    figures = snapshot.readings.gpu_figures
    assert figures is not None and figures.target.labels == ("gpu2", "gpu3")
    assert [d.utilization.samples for d in figures.devices if d.utilization] == [1, 1]
    # The start's utilisation is GPUs 2 and 3's (95, 94), no longer all four's mean (79.75).
    assert snapshot.readings.gpu_util_start == 94.5
    kv = snapshot.readings.kv_cache
    assert kv is not None and kv.bytes == 80 * (1 << 30)
    # The old share divided by all four GPUs' memory (25.1%) and had no bytes at all.
    assert (kv.share_devices, kv.share) == (("gpu2", "gpu3"), pytest.approx(0.502, abs=1e-3))
    # The report, from the written summary: the target's two GPUs, one line each under TP=2.
    text = render(snapshot.summary())
    lines = text.splitlines()
    assert lines[1] == "- GPU: 147.1/159.3 GiB (92.3%)"  # GPUs 2 and 3 only, not all four
    assert lines[2].startswith("  - GPUs used: 2, 3 (nvml process list")
    assert lines[3].startswith("  - GPU 2 (NVIDIA H100 80GB HBM3): ")
    assert lines[4].startswith("  - GPU 3 (NVIDIA H100 80GB HBM3): ")
    assert "KV Cache: 2 x 40.0 GiB = 80.0 GiB allocated" in text

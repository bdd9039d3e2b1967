"""The fingerprint: what the target ran, read from outside without touching vLLM.

Two snapshots can only be compared when they ran the same software on the same hardware with
the same flags; the fingerprint says what that was (sidecar/records/summary.py, `Fingerprint`):

    vLLM, torch   the target's installed distributions, read through `/proc/PID/root/` (a
    Python        container's files from outside) and its interpreter (sidecar/target/installed.py)
    model, flags  the API server's command line (sidecar/target/serveflags.py); absent =
                  vLLM's default
    CPU           `<proc root>/cpuinfo`: the host's model name and logical CPUs
    driver, CUDA  NVML (`NvmlReader.system`); None on a CPU host, with NVML's reason
    backend, GPUs each window: the attention backend whose module the window's stacks ran
                  (`vllm/v1/attention/backends/<name>.py`), the models of the target's GPUs
    sidecar, rules  this package's version; the rules file's `version:` and sha256

`read_target` reads the target's part once per deployment (`FingerprintCache`, keyed by the
root's PID and start time); `for_window` adds the window's part. Nothing here raises for what
it cannot read: the field is None and `notes[field]` says why (STYLE.md 7).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace

from sidecar.classify.rules import RuleSet
from sidecar.records import Role, StackSample
from sidecar.records.gpu import GpuFigures, GpuReading, NvmlSystem
from sidecar.records.summary import Fingerprint
from sidecar.target.discovery import Deployment
from sidecar.target.installed import (
    is_torch,
    is_vllm,
    python_version,
    read_distribution,
    site_packages,
    version_text,
)
from sidecar.target.modelconfig import serve_args
from sidecar.target.procfs import ProcFs
from sidecar.target.serveflags import config_file, serving_flags
from sidecar.version import sidecar_version

# vllm/v1/attention/backends/flash_attn.py (V1), vllm/attention/backends/flashinfer.py (V0),
# .../backends/mla/flashmla.py; py-spy names files short or in full: match the tail.
_BACKEND_FILE = re.compile(r"(?:^|/)vllm/(?:v1/)?attention/backends/((?:mla/)?\w+)\.py$")
# Modules under backends/ that are no attention backend: helpers, and the state backends of
# Mamba-style layers (a hybrid model runs those beside its attention backend).
_NOT_BACKENDS = frozenset(
    {
        "__init__", "utils", "fa_utils", "registry", "abstract", "composite", "no_attention",
        "mamba_attn", "mamba1_attn", "mamba2_attn", "linear_attn", "gdn_attn",
        "short_conv_attn", "recoverssm_metadata", "mla/common", "mla/indexer",
        "mla/sparse_utils", "mla/compressor_utils", "mla/index_group", "mla/sparse_indexer",
        "mla/sparse_swa", "mla/rocm_paged_mxfp4_indexer",
    }
)  # fmt: skip
# vLLM's names (AttentionBackendEnum, vllm/v1/attention/backends/registry.py) where they are
# not the module's name in capitals.
_BACKEND_NAMES = {
    "mla/flashattn_mla": "FLASH_ATTN_MLA",
    "mla/aiter_triton_mla": "ROCM_AITER_TRITON_MLA",
    "turboquant_attn": "TURBOQUANT",
    "ultraquant_attn": "ULTRAQUANT",
}


# ---------------------------------------------------------------------------------- the target


def read_target(procfs: ProcFs, target: Deployment, nvml: NvmlSystem | None) -> Fingerprint:
    """What the target runs and where: everything but the window's part. Once per target."""
    notes: dict[str, str] = {}
    process = target.api_server or target.root
    folders, python_xy, how = site_packages(procfs, target, process)
    vllm = read_distribution(procfs, process.pid, folders, is_vllm, "vllm", how, notes)
    torch = read_distribution(procfs, process.pid, folders, is_torch, "torch", how, notes)
    python = python_version(procfs, process, folders, python_xy, notes)
    args = process.cmdline if process.role is Role.API_SERVER else ()
    model = serve_args(args).model if args else None
    if model is None:
        notes["model"] = _no_api_server(target) or "no --model on the API server's command line"
    config = config_file(args)
    if config is not None:
        notes["serving"] = f"flags in --config {config} are not read: they are not shown"
    cpu_model, cpu_cores = _cpu(procfs, notes)
    driver, cuda = _nvml(nvml, notes)
    return Fingerprint(
        vllm=version_text(vllm),
        torch=torch.version if torch else None,
        python=python,
        nvidia_driver=driver,
        cuda=cuda,
        model=model,
        serving=serving_flags(args),
        cpu_model=cpu_model,
        cpu_cores=cpu_cores,
        notes=notes,
    )


def for_window(
    base: Fingerprint,
    stacks: Iterable[StackSample],
    gpu: GpuReading | None,
    figures: GpuFigures | None,
    rules: RuleSet,
) -> Fingerprint:
    """The target's fingerprint with this window's part: the attention backend its stacks
    ran, the models of its GPUs, and the sidecar and rules that took the snapshot."""
    notes = dict(base.notes)
    backend = attention_backend(stacks)
    if backend is None:
        requested = base.serving.get("attention-backend")
        notes["attention_backend"] = (
            "no frame under vllm/.../attention/backends/ in this window's stacks (an idle "
            "window runs no attention)"
            + (f"; --attention-backend {requested} was asked for" if requested else "")
        )
    gpus = _gpu_models(gpu, figures, notes)
    return replace(base, attention_backend=backend, gpus=gpus, sidecar=sidecar_version(),
                   rules=rules.fingerprint, notes=notes)  # fmt: skip


def attention_backend(stacks: Iterable[StackSample]) -> str | None:
    """vLLM's name of the attention backend whose module the stacks ran (`CPU_ATTN`,
    `FLASH_ATTN`); several, most samples first, when a model runs more than one."""
    seen: Counter[str] = Counter()
    for stack in stacks:
        names = {_backend_name(f.file) for f in stack.frames if "attention/backends/" in f.file}
        for name in names - {None}:
            seen[str(name)] += stack.weight
    return ", ".join(name for name, _ in seen.most_common()) or None


class FingerprintCache:
    """The target's part of the fingerprint, read once per deployment (its root's PID and
    start time: a restarted vLLM may run other software or flags). Keeps the latest only."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._value: Fingerprint | None = None
        self.reads = 0

    def get(self, target: Deployment, read: Callable[[], Fingerprint]) -> Fingerprint:
        if self._value is None or self._key != target.root.key:
            self._value, self._key = read(), target.root.key
            self.reads += 1
        return self._value


# ---------------------------------------------------------------------------------- hardware


def parse_cpuinfo(text: str) -> tuple[str | None, int | None]:
    """The first `model name` and the number of `processor` entries (logical CPUs)."""
    model = None
    cores = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "processor":
            cores += 1
        elif key == "model name" and model is None and value.strip():
            model = " ".join(value.split())
    return model, cores or None


def _cpu(procfs: ProcFs, notes: dict[str, str]) -> tuple[str | None, int | None]:
    text = procfs.cpuinfo()
    if text is None:
        notes["cpu_model"] = notes["cpu_cores"] = f"cannot read {procfs.root / 'cpuinfo'}"
        return None, None
    model, cores = parse_cpuinfo(text)
    if model is None:
        notes["cpu_model"] = "no `model name` in cpuinfo (ARM kernels do not name the CPU)"
    if cores is None:
        notes["cpu_cores"] = "no `processor` entries in cpuinfo"
    return model, cores


def _nvml(nvml: NvmlSystem | None, notes: dict[str, str]) -> tuple[str | None, str | None]:
    if nvml is None:
        notes["nvidia_driver"] = notes["cuda"] = "GPU readings disabled"
        return None, None
    if nvml.driver is None:
        notes["nvidia_driver"] = nvml.reason or "NVML did not say"
    if nvml.cuda is None:
        notes["cuda"] = nvml.reason or "NVML did not say"
    return nvml.driver, nvml.cuda


def _gpu_models(
    reading: GpuReading | None, figures: GpuFigures | None, notes: dict[str, str]
) -> tuple[str, ...]:
    """The models of the target's GPUs (all the host's when which ones is unknown)."""
    if reading is None or not reading.available:
        notes["gpus"] = (reading.reason or "no NVML") if reading else "GPU readings disabled"
        return ()
    if figures is not None and figures.devices:
        return tuple(d.name or "unknown" for d in figures.devices)
    devices = [d for d in reading.devices if not d.mig]
    if devices:
        notes["gpus"] = "the host's GPUs: which ones the target uses is unknown"
    return tuple(d.name or "unknown" for d in devices)


# ---------------------------------------------------------------------------------- helpers


def _no_api_server(target: Deployment) -> str | None:
    if target.api_server is not None:
        return None
    return f"no API server in deployment {target.root.pid} (an offline LLM?): no command line "\
           "to read the model and flags from"  # fmt: skip


def _backend_name(file: str) -> str | None:
    m = _BACKEND_FILE.search(file.replace("\\", "/"))
    if m is None or m.group(1) in _NOT_BACKENDS:
        return None
    module = m.group(1)
    return _BACKEND_NAMES.get(module) or module.removeprefix("mla/").upper()

"""Process and host readings through psutil, and the KV cache in bytes and as a share.

psutil is the OS boundary here (injected as `PsutilReader`); everything else is arithmetic
over frozen records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path

import psutil

from sidecar.records import ProcessInfo
from sidecar.records.readings import HostMemory, KvCache, ProcessStats

log = logging.getLogger("vllm_sidecar")

_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "fp8": 1,
                "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}  # fmt: skip


class PsutilReader:
    """CPU time at the window's start and end; memory and threads at its end."""

    def __init__(self) -> None:
        self._start: dict[tuple[int, int], float] = {}

    def start(self, processes: Iterable[ProcessInfo]) -> None:
        self._start = {p.key: t for p in processes if (t := _cpu_time(p.pid)) is not None}

    def finish(self, processes: Iterable[ProcessInfo], window_s: float) -> tuple[ProcessStats, ...]:
        return tuple(self._stats(p, window_s) for p in processes)

    def _stats(self, p: ProcessInfo, window_s: float) -> ProcessStats:
        try:
            proc = psutil.Process(p.pid)
            with proc.oneshot():
                rss, threads = proc.memory_info().rss, proc.num_threads()
                cpu = sum(proc.cpu_times()[:2])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return ProcessStats(p.pid, p.role.value, None, None, None, None)
        start = self._start.get(p.key)
        used = cpu - start if start is not None else None
        share = used / window_s if used is not None and window_s > 0 else None
        return ProcessStats(p.pid, p.role.value, rss, used, share, threads)

    @staticmethod
    def host_memory() -> HostMemory:
        vm = psutil.virtual_memory()
        return HostMemory(total_bytes=vm.total, available_bytes=vm.available, used_bytes=vm.used)


def _cpu_time(pid: int) -> float | None:
    try:
        return float(sum(psutil.Process(pid).cpu_times()[:2]))
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None


# ---------------------------------------------------------------------------------- KV cache


def kv_cache(
    cache_config: Mapping[str, str] | None,
    usage: float | None,
    gpu_total_bytes: int | None,
    host: HostMemory | None,
    bytes_per_token: int | None = None,
) -> KvCache | None:
    """KV-cache bytes from vLLM's own `cache_config_info` labels, best source first."""
    if not cache_config:
        return None
    block_size = _int(cache_config.get("block_size"))
    blocks = _int(cache_config.get("num_gpu_blocks"))
    size, source = _kv_bytes(cache_config, block_size, blocks, bytes_per_token)
    share_of, total = ("gpu", gpu_total_bytes) if gpu_total_bytes else ("host", None)
    if share_of == "host" and host is not None:
        total = host.total_bytes
    share = size / total if size and total else None
    return KvCache(size, source, share, share_of if share else None, block_size, blocks, usage)


def _kv_bytes(
    config: Mapping[str, str], block_size: int | None, blocks: int | None, per_token: int | None
) -> tuple[int | None, str]:
    explicit = _int(config.get("kv_cache_memory_bytes"))
    if explicit:
        return explicit, "vllm:cache_config_info kv_cache_memory_bytes"
    cpu_space = _int(config.get("cpu_kvcache_space_bytes"))
    if cpu_space:
        return cpu_space, "vllm:cache_config_info cpu_kvcache_space_bytes"
    if block_size and blocks and per_token:
        return block_size * blocks * per_token, "num_gpu_blocks x block_size x bytes per token"
    return None, "not derivable: no kv_cache_memory_bytes label and no model config"


def kv_bytes_per_token(model_dir: Path, cache_dtype: str | None = None) -> int | None:
    """2 (K and V) x layers x KV heads x head size x dtype bytes, from a local config.json."""
    try:
        config = json.loads((model_dir / "config.json").read_text())
        layers = int(config["num_hidden_layers"])
        heads = int(config.get("num_key_value_heads") or config["num_attention_heads"])
        head_dim = int(
            config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    dtype = cache_dtype if cache_dtype not in (None, "auto") else config.get("torch_dtype")
    size = _DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2)
    return 2 * layers * heads * head_dim * size


def model_dir_of(info: ProcessInfo, proc_root: Path) -> Path | None:
    """The API server's `--model` when it is a local folder, seen through the target's root."""
    args = list(info.cmdline)
    model = next((a.split("=", 1)[1] for a in args if a.startswith("--model=")), None)
    if model is None and "--model" in args and args.index("--model") + 1 < len(args):
        model = args[args.index("--model") + 1]
    if model is None and "serve" in args[:3]:  # `vllm serve MODEL`, run by its interpreter
        rest = args[args.index("serve") + 1 :]
        model = rest[0] if rest and not rest[0].startswith("-") else None
    if not model or not model.startswith("/"):
        return None
    candidate = proc_root / str(info.pid) / "root" / model.lstrip("/")
    return candidate if (candidate / "config.json").is_file() else None


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None

"""The KV cache in bytes: what vLLM allocated, what it was told to allocate, and its share.

vLLM's `vllm:cache_config_info` labels say how many blocks each worker holds
(`num_gpu_blocks`, the same on every worker) and how many tokens a block holds (`block_size`),
but not how many bytes a token takes; `kv_cache_memory_bytes` (`--kv-cache-memory`, or
VLLM_CPU_KVCACHE_SPACE on a CPU host) is the *budget* each worker was given, per GPU, and is
"None" in the usual GPU case where vLLM sizes the cache from free memory. So:

    allocated per GPU = num_gpu_blocks x block_size x bytes per token per GPU
    bytes per token per GPU (GQA/MHA) = 2 (K, V) x layers x max(1, kv_heads / TP) x head_dim
                                        x dtype bytes
    bytes per token per GPU (MLA)     = layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes
                                        (one latent vector, not doubled, on every TP rank)

with the layers divided among pipeline-parallel ranks. The layout comes from the model's
config.json (`sidecar.target.modelconfig`); the dtype from the `cache_dtype` label, else vLLM's
`--dtype`, else the config's (`auto` runs a float32 checkpoint in 16 bits). When the blocks
were overridden (`--num-gpu-blocks-override`) the budget says nothing about the allocation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.records.readings import KvCache
from sidecar.sizes import format_bytes

# Bytes per element of each `--kv-cache-dtype` / `--dtype` spelling vLLM accepts.
DTYPE_BYTES = {
    "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8_inc": 1, "int8": 1, "uint8": 1,
}  # fmt: skip
# DeepSeek's sparse-MLA fp8 layout: 512 fp8 values, 4 float32 scales, 64 bf16 RoPE values.
FP8_DS_MLA_BYTES_PER_TOKEN_LAYER = 512 + 4 * 4 + 64 * 2


@dataclass(frozen=True, slots=True)
class KvLayout:
    """The attention of a model as its KV cache sees it (from config.json).

    `kv_heads` is the model's total before tensor parallelism; for MLA it is 1 and `head_dim`
    is the latent width `kv_lora_rank + qk_rope_head_dim`.
    """

    layers: int
    kv_heads: int
    head_dim: int
    mla: bool = False
    model_dtype: str | None = None  # config.json's torch_dtype / dtype
    caveats: tuple[str, ...] = ()

    def describe(self, tp: int) -> str:
        if self.mla:
            return f"MLA: {self.layers} layers x latent {self.head_dim}, on every TP rank"
        per_rank = max(1, self.kv_heads // tp)
        split = f" ({per_rank} per GPU at TP={tp})" if tp > 1 else ""
        return f"{self.layers} layers x {self.kv_heads} KV heads{split} x head dim {self.head_dim}"


@dataclass(frozen=True, slots=True)
class KvDtype:
    name: str  # e.g. "float32", "bfloat16 or float16", "fp8_e4m3"
    bytes: int
    source: str  # which setting decided it


def kv_layout(config: Mapping[str, Any]) -> KvLayout | None:
    """The KV layout from a config.json, vLLM's way (ModelConfig.get_head_size et al.).

    A multimodal model's language model is its `text_config`. None when the config does not
    name layers and heads in any spelling vLLM reads.
    """
    text = config.get("text_config")
    cfg: Mapping[str, Any] = text if isinstance(text, Mapping) and _layers(text) else config
    layers, heads = _layers(cfg), _first_int(cfg, "num_attention_heads", "n_head", "n_heads")
    if layers is None or heads is None:
        return None
    dtype = _model_dtype(config, cfg)
    if cfg.get("kv_lora_rank") is not None:  # DeepSeek V2/V3 multi-head latent attention
        latent = int(cfg["kv_lora_rank"]) + int(cfg.get("qk_rope_head_dim") or 0)
        return KvLayout(layers, 1, latent, mla=True, model_dtype=dtype)
    kv_heads = _first_int(cfg, "num_key_value_heads", "num_kv_heads", "n_head_kv",
                          "multi_query_group_num") or heads  # fmt: skip
    if cfg.get("multi_query") and not cfg.get("new_decoder_architecture"):
        kv_heads = 1  # Falcon's multi-query attention
    head_dim = _first_int(cfg, "head_dim") or _first_int(cfg, "hidden_size", "d_model", "n_embd")
    if head_dim is None:
        return None
    if cfg.get("head_dim") is None:
        head_dim //= heads
    return KvLayout(layers, kv_heads, head_dim, model_dtype=dtype, caveats=_hybrid(cfg))


def kv_dtype(cache_dtype: str | None, serve_dtype: str, layout: KvLayout | None) -> KvDtype | None:
    """The KV cache's element type: `cache_dtype` (the label), else the model's dtype."""
    cache = (cache_dtype or "auto").lower()
    if cache not in ("auto", "none"):
        size = DTYPE_BYTES.get(cache, 1 if cache.startswith("fp8") else None)
        return KvDtype(cache, size, "cache_dtype label") if size else None
    if serve_dtype not in ("", "auto"):
        size = DTYPE_BYTES.get(serve_dtype)
        return KvDtype(serve_dtype, size, "--dtype") if size else None
    model = (layout.model_dtype if layout else None) or "float32"  # vLLM's default, then cast
    if model in ("float32", "float"):
        # vLLM's `auto` downcasts float32 checkpoints to the platform's 16-bit type.
        return KvDtype("bfloat16 or float16", 2, "auto: the float32 model runs in 16 bits")
    size = DTYPE_BYTES.get(model)
    return KvDtype(model, size, "auto: config.json's dtype") if size else None


def bytes_per_token(layout: KvLayout, dtype: KvDtype, tp: int, pp: int) -> int:
    """KV bytes one token takes on one worker (the mean over pipeline ranks)."""
    if layout.mla:
        per_layer = (
            FP8_DS_MLA_BYTES_PER_TOKEN_LAYER
            if dtype.name == "fp8_ds_mla"
            else layout.head_dim * dtype.bytes
        )
    else:
        per_layer = 2 * max(1, layout.kv_heads // tp) * layout.head_dim * dtype.bytes
    return per_layer * layout.layers // pp


@dataclass(frozen=True, slots=True)
class KvInputs:
    """What `kv_cache` needs beside vLLM's labels; each part None where it is unknown."""

    layout: KvLayout | None = None
    layout_source: str = "no model config"
    serve_dtype: str = "auto"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    gpu_totals: Mapping[str, int] | None = None  # memory of each GPU the target uses, by label
    host_total: int | None = None


def kv_cache(
    labels: Mapping[str, str] | None, usage: float | None, inputs: KvInputs
) -> KvCache | None:
    """The KV cache from vLLM's `cache_config_info` labels, in bytes; None without labels."""
    if not labels:
        return None
    tp, pp = inputs.tensor_parallel, inputs.pipeline_parallel
    workers = tp * pp
    block_size, blocks = _int(labels.get("block_size")), _int(labels.get("num_gpu_blocks"))
    tokens = block_size * blocks if block_size and blocks else None
    tokens = tokens or _int(labels.get("kv_cache_size_tokens"))
    budget, budget_source = _budget(labels)
    dtype = kv_dtype(labels.get("cache_dtype"), inputs.serve_dtype, inputs.layout)
    per_token = bytes_per_token(inputs.layout, dtype, tp, pp) if inputs.layout and dtype else None
    allocated = tokens * per_token if tokens and per_token else None
    overridden = _int(labels.get("num_gpu_blocks_override")) is not None
    why = inputs.layout_source
    if inputs.layout is not None and dtype is None:
        why = f"unknown KV cache dtype {labels.get('cache_dtype')!r} / --dtype {inputs.serve_dtype}"
    size, source = _headline(allocated, budget, budget_source, overridden, workers, why)
    share_of, devices, total = _share_base(inputs)
    return KvCache(
        bytes=size,
        source=source,
        share=size / total if size and total else None,
        share_of=share_of if size and total else None,
        block_size=block_size,
        num_blocks=blocks,
        usage=usage,
        tokens=tokens,
        bytes_per_token=per_token,
        allocated_bytes_per_gpu=allocated,
        allocated_bytes=allocated * workers if allocated else None,
        budget_bytes_per_gpu=budget,
        budget_bytes=budget * workers if budget else None,
        budget_source=budget_source,
        blocks_overridden=overridden,
        workers=workers,
        tensor_parallel=tp,
        pipeline_parallel=pp,
        dtype=f"{dtype.name} ({dtype.source})" if dtype else None,
        layout=inputs.layout.describe(tp) if inputs.layout else None,
        share_devices=devices,
        caveats=_caveats(allocated, budget, overridden, inputs.layout),
    )


def kv_cache_text(kv: KvCache) -> str:
    """`KV Cache: 3.0 MiB allocated (1,536 tokens x 2.0 KiB; budget 1.0 GiB) (0.0% of host
    memory)`, or per GPU under tensor parallelism: `2 x 30.0 GiB = 60.0 GiB ...`."""
    if kv.bytes is None:
        budget = f"; budget {_per_gpu(kv.budget_bytes_per_gpu, kv)}" if kv.budget_bytes else ""
        return f"KV Cache: not measured ({kv.source}{budget})"
    if kv.allocated_bytes_per_gpu is not None and kv.workers > 1:
        size = f"{kv.workers} x {format_bytes(kv.allocated_bytes_per_gpu)} = "
        size += f"{format_bytes(kv.allocated_bytes)} allocated"
    elif kv.allocated_bytes is not None:
        size = f"{format_bytes(kv.allocated_bytes)} allocated"
    else:
        size = f"{format_bytes(kv.bytes)} (the configured budget)"
    details = []
    if kv.tokens is not None and kv.bytes_per_token is not None:
        each = " per GPU" if kv.workers > 1 else ""
        details.append(f"{kv.tokens:,} tokens{each} x {format_bytes(kv.bytes_per_token)}")
    if kv.allocated_bytes is not None and kv.budget_differs:
        details.append(f"budget {_per_gpu(kv.budget_bytes_per_gpu, kv)}")
    line = f"KV Cache: {size}" + (f" ({'; '.join(details)})" if details else "")
    if kv.share is not None:
        line += f" ({100 * kv.share:.1f}% of {_share_name(kv)})"
    return line


# ------------------------------------------------------------------------------------- helpers


def _budget(labels: Mapping[str, str]) -> tuple[int | None, str | None]:
    for key in ("kv_cache_memory_bytes", "cpu_kvcache_space_bytes"):
        value = _int(labels.get(key))
        if value:
            return value, f"vllm:cache_config_info {key}"
    return None, None


def _headline(
    allocated: int | None,
    budget: int | None,
    budget_source: str | None,
    overridden: bool,
    workers: int,
    why: str,
) -> tuple[int | None, str]:
    """The headline figure and its source; `why` names where the bytes per token came from,
    or why they are unknown."""
    if allocated is not None:
        return allocated * workers, (f"num_gpu_blocks x block_size x bytes per token ({why})")
    if budget is not None and not overridden:
        return budget * workers, (
            f"{budget_source} (the budget, which the blocks fill; per-token size unknown: {why})"
        )
    if budget is not None:
        return None, (
            f"num_gpu_blocks_override is set, so {budget_source} is not what was allocated, "
            f"and the bytes per token are unknown: {why}"
        )
    return None, f"not derivable: no kv_cache_memory_bytes label and {why}"


def _share_base(inputs: KvInputs) -> tuple[str | None, tuple[str, ...], int | None]:
    if inputs.gpu_totals:
        return "gpu", tuple(inputs.gpu_totals), sum(inputs.gpu_totals.values()) or None
    if inputs.host_total:
        return "host", ("host",), inputs.host_total
    return None, (), None


def _caveats(
    allocated: int | None, budget: int | None, overridden: bool, layout: KvLayout | None
) -> tuple[str, ...]:
    out = list(layout.caveats) if layout else []
    if allocated is not None and budget is not None and allocated > budget and not overridden:
        out.append(
            f"the blocks come to {format_bytes(allocated)} per worker, more than the budget "
            f"of {format_bytes(budget)}: the model's layout may not be what vLLM allocated for"
        )
    return tuple(out)


def _per_gpu(n: int | None, kv: KvCache) -> str:
    return format_bytes(n) + (" per GPU" if kv.workers > 1 else "")


def _share_name(kv: KvCache) -> str:
    if kv.share_of == "host":
        return "host memory"
    gpus = len(kv.share_devices)
    return f"{gpus} GPUs" if gpus > 1 else "GPU"


def _layers(cfg: Mapping[str, Any]) -> int | None:
    return _first_int(cfg, "num_hidden_layers", "num_layers", "n_layer", "n_layers")


def _first_int(cfg: Mapping[str, Any], *keys: str) -> int | None:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _model_dtype(config: Mapping[str, Any], text: Mapping[str, Any]) -> str | None:
    for cfg in (config, text):
        for key in ("dtype", "torch_dtype"):  # transformers 5 writes `dtype`, 4 `torch_dtype`
            value = cfg.get(key)
            if isinstance(value, str) and value:
                return value.removeprefix("torch.")
    return None


def _hybrid(cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """Layouts whose layers differ (sliding window beside full attention): not modelled."""
    kinds = cfg.get("layer_types")
    mixed = isinstance(kinds, list) and len(set(map(str, kinds))) > 1
    if mixed or cfg.get("sliding_window_pattern"):
        return (
            "the model mixes attention kinds across layers (sliding window, linear); vLLM's "
            "hybrid allocator may size its blocks otherwise than counted here",
        )
    return ()


def _int(value: str | None) -> int | None:
    try:
        return int(float(value)) if value not in (None, "", "None") else None
    except ValueError:
        return None

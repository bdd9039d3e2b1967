"""The serving flags and deployment name read from vLLM's command line (sidecar/target/serveflags.py).

Command lines as vLLM's own parser takes them (FlexibleArgumentParser, vLLM 0.32): `--x y`,
`--x=y`, underscores, short forms, BooleanOptionalAction's `--x` / `--no-x`.
"""

from __future__ import annotations

import pytest

from sidecar.target.serveflags import api_port, config_file, deployment_name, serving_flags

API = ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--max-num-seqs", "16"], {"max-num-seqs": "16"}),
        (["--max-num-seqs=16"], {"max-num-seqs": "16"}),
        (["--max_num_batched_tokens=1024"], {"max-num-batched-tokens": "1024"}),
        (["--max_model_len", "4096"], {"max-model-len": "4096"}),
        (["-tp", "2", "-pp=2"], {"tensor-parallel-size": "2", "pipeline-parallel-size": "2"}),
        (["-q", "fp8", "-asc", "4"], {"quantization": "fp8", "api-server-count": "4"}),
        (["--gpu-memory-utilization", "0.85", "--block-size", "16"],
         {"block-size": "16", "gpu-memory-utilization": "0.85"}),
        (["--enable-chunked-prefill"], {"enable-chunked-prefill": "true"}),
        (["--no-enable-prefix-caching"], {"enable-prefix-caching": "false"}),
        (["--no_enable_prefix_caching"], {"enable-prefix-caching": "false"}),
        (["--async-scheduling", "--enforce-eager"],
         {"async-scheduling": "true", "enforce-eager": "true"}),
        (["--dtype", "bfloat16", "--kv-cache-dtype", "fp8_e5m2"],
         {"dtype": "bfloat16", "kv-cache-dtype": "fp8_e5m2"}),
        # argparse: the last of a repeated flag wins; the value is kept as given
        (["--max-num-seqs", "8", "--max-num-seqs", "0016"], {"max-num-seqs": "0016"}),
        (["--enable-prefix-caching", "--no-enable-prefix-caching"],
         {"enable-prefix-caching": "false"}),
        # not performance-shaping, or no value to read: nothing
        (["--port", "8001", "--served-model-name", "x", "--max-num-seqs"], {}),
        (["--max-num-seqs", "--enforce-eager"], {"enforce-eager": "true"}),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)  # fmt: skip
def test_serving_flags_are_the_ones_given_as_given(
    args: list[str], expected: dict[str, str]
) -> None:
    assert serving_flags([*API, "--model", "m", *args]) == expected


def test_defaults_are_not_filled_in() -> None:
    assert serving_flags([*API, "--model", "/models/llama"]) == {}


def test_flags_come_in_a_fixed_order_whatever_the_command_lines() -> None:
    a = serving_flags([*API, "--enforce-eager", "--dtype", "half", "-tp", "2"])
    b = serving_flags([*API, "-tp", "2", "--dtype", "half", "--enforce-eager"])
    assert list(a.items()) == list(b.items())
    assert list(a) == ["tensor-parallel-size", "dtype", "enforce-eager"]


def test_a_config_file_is_named_so_the_fingerprint_can_say_it_is_not_read() -> None:
    assert config_file([*API, "--config", "/etc/vllm.yaml"]) == "/etc/vllm.yaml"
    assert config_file([*API, "--config=c.yaml"]) == "c.yaml"
    assert config_file(API) is None


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        ([*API, "--model", "/models/Llama-3.1-8B/", "--port", "8001"], "Llama-3.1-8B@8001"),
        ([*API, "--model", "meta-llama/Llama-3.1-8B"], "Llama-3.1-8B@8000"),
        (["/venv/bin/vllm", "serve", "Qwen/Qwen3-8B", "--port=9000"], "Qwen3-8B@9000"),
        ([*API, "--model", "/m", "--served-model-name", "chat", "alias", "--port", "80"],
         "chat@80"),
        ([*API, "--model", "/m", "--served_model_name=chat"], "chat@8000"),
        ([*API, "--model", "/m", "--uds", "/run/vllm.sock"], "m@/run/vllm.sock"),
        (["VLLM::EngineCore"], None),
    ],
)  # fmt: skip
def test_deployment_is_the_served_name_at_the_port(
    cmdline: list[str], expected: str | None
) -> None:
    assert deployment_name(cmdline) == expected


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        ([*API, "--model", "/m"], 8000),
        ([*API, "--model", "/m", "--port", "8001"], 8001),
        ([*API, "--port=9000", "--model", "/m", "--port", "9001"], 9001),
        ([*API, "--model", "/m", "--uds", "/run/vllm.sock"], None),
        ([*API, "--model", "/m", "--port", "http"], None),
    ],
)  # fmt: skip
def test_the_api_port_is_the_last_given_or_vllms_default(
    cmdline: list[str], expected: int | None
) -> None:
    assert api_port(cmdline) == expected

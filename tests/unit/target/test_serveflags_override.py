"""A flag that shapes the KV cache is part of the fingerprint (seen recording the KV-starved
sample: the report's Flags line left `--num-gpu-blocks-override 6` out)."""

from __future__ import annotations

from sidecar.target.serveflags import serving_flags


def test_num_gpu_blocks_override_is_kept_as_given() -> None:
    argv = ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m",
            "--num-gpu-blocks-override", "6", "--max-num-seqs=4"]  # fmt: skip
    flags = serving_flags(argv)
    assert flags["num-gpu-blocks-override"] == "6" and flags["max-num-seqs"] == "4"

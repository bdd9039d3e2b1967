"""The KV cache's size on a real server whose blocks were overridden: what vLLM allocated, not
its configured budget (0.1 printed "KV Cache: 1.1 GB" for a cache of 1,536 tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.server import VllmServer
from sidecar.cli import main
from sidecar.store.summary_io import read_summary

pytestmark = pytest.mark.integration

BLOCKS = 12  # x block size 128 = 1,536 tokens; the tiny Llama keeps 2 KiB per token (float32)


@pytest.fixture(scope="module")
def overridden(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmServer]:
    server = VllmServer(
        log_path=Path(tmp_path_factory.mktemp("vllm-kv")) / "server.log",
        extra_args=("--num-gpu-blocks-override", str(BLOCKS)),
    )
    server.start()  # stops what it started if it fails
    try:
        yield server
    finally:
        server.stop()


def test_the_report_counts_the_blocks_allocated_beside_the_budget(
    overridden: VllmServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["snapshot", "--pid", str(overridden.pid), "--duration", "2", "--out", str(tmp_path)]
    assert main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    kv = read_summary(folder).kv_cache
    assert kv is not None and (kv.num_blocks, kv.block_size, kv.tokens) == (BLOCKS, 128, 1536)
    assert kv.bytes == kv.allocated_bytes == 1536 * 2048  # 3 MiB: what vLLM allocated
    assert kv.budget_bytes == 1 << 30  # VLLM_CPU_KVCACHE_SPACE=1, reported as the budget
    capsys.readouterr()
    assert main(["report", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "- KV Cache: 3.0 MiB allocated (1,536 tokens x 2.0 KiB; budget 1.0 GiB)" in text

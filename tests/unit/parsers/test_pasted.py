"""Text as people paste it (issue: "Parsers that take text as it is pasted"), read from the real
public dumps of tests/fixtures/public/corpus: every form gives stacks, and a warning that names
what was read past or left out; never an empty result without one."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.listing import list_stacks
from sidecar.classify.rules import load_rules
from sidecar.errors import InputError
from sidecar.parsers import parse_file, parse_text
from sidecar.records import Role

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "public" / "corpus"

# (file, the form it holds, a phrase its warnings must contain)
FORMS = [
    ("vllm_8299_quoted_ci_ts_async_engine_timeout.txt",
     "`> ` quote, Buildkite's `  | ` column, `[2024-09-10T16:55:45Z] ` on every line",
     "read past a timestamp"),
    ("vllm-fork_484_rank0_offline_hpu_executor_load_model.txt", "`[rank0]:` on every line",
     "read past a rank tag"),
    ("vllm_13957_ts_prefix_two_chains_async_engine.txt",
     "an application logger's `2025-02-27 16:44:16.329 - runners.py[line:118] - ERROR: `",
     "read past a log header"),
    ("vllm_12625_worker_nccl_chain.txt",
     "`(VllmWorkerProcess pid=350) ERROR 01-29 20:00:47 multiproc_worker_utils.py:240] `",
     "chained traceback read as one sample"),
    ("reason_over_search_spheron_offline_gdn_prefill.txt", "`Thread X` and `...` elisions",
     "frames elided in the paste"),
    ("vllm_41834_worker_tp0_ep0_idle.txt", "`Thread (idle) \"MainThread\"`: no id",
     "thread header without an id"),
    ("lmcache_4419_rocm_enginecore_from_ipc_handle_redacted.txt",
     "`Process <PID>`, `Thread <PID>`, a note after a frame", "is not a number (redacted?)"),
    ("vllm_4650_rayworker_oneline_profile_run.txt", "a paste that lost its newlines",
     "split before each `(Name pid=N)` tag"),
    ("intel_llm_scaler_235_worker_tp2_to_list_device_lost.txt",
     "two workers interleaved, paths wrapped mid-word", "a wrapped paste"),
    ("vllm_49475_interleaved_workers_warmup_decode_step.txt", "five workers' lines interleaved",
     "read as one stream each"),
    ("vllm-gaudi_192_worker_tp6_warmup_graphs_ansi_caret_m.txt",
     "`^[[1;36m` colours and `^M` in caret notation", "read past a log header"),
    ("vllm_41834_compose_prefix_worker_tp1_ep1_input_prep_sync.txt",
     "docker compose's `vllm-sm120  | `", "read past a log header"),
    ("vllm_21022_pystack_rayworker_cgraph_quoted.txt", "a pystack dump, quoted", None),
    ("vllm_53960_uniproc_warmup_replay_ple.txt", "`MainThread (active, 100% CPU):` layout",
     "text after the frame skipped"),
    ("vllm_50887_xpu_perf_worker_urEventWait.txt", "`perf report --hierarchy`",
     "a perf report (hierarchy) is a profile"),
    ("vllm_52312_rocm_worker_tp5_ep5_mla_attention_nested_prefix.txt",
     "logging.basicConfig's `INFO:name: ` before the process tag", "read past a log header"),
    ("vllm_19904_rocm_vllmworker_unified_attention_ansi_caret.txt",
     "a traceback ending in torch's dispatcher", "torch.ops.vllm.unified_attention_with_output"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "form", "phrase"), FORMS, ids=[f[0] for f in FORMS])
def test_each_pasted_form_gives_stacks_and_says_what_it_skipped(
    name: str, form: str, phrase: str | None
) -> None:
    result = parse_file(CORPUS / name)
    assert result.stacks, f"{form}: no stack ({result.warnings})"
    assert any(s.frames for s in result.stacks), form
    if phrase is not None:
        assert any(phrase in w for w in result.warnings), (form, result.warnings)


def test_a_chain_is_one_sample_first_traceback_innermost() -> None:
    # PHASES.md rule 11: the original exception (the first traceback) holds the call that
    # failed, so its frames come first; the last one's outermost frames give the role.
    result = parse_file(CORPUS / "vllm_14994_async_engine_chain.txt")
    assert len(result.stacks) == 1
    functions = [f.function for f in result.stacks[0].frames]
    assert functions.index("_wait") < functions.index("run_engine_loop")


def test_threads_of_one_pasted_dump_share_its_role() -> None:
    # No `Process PID:` line: the dump is still one process, and the EngineCore marker of
    # its input thread names it for the monitor and helper threads too.
    listing = list_stacks(
        Classifier(load_rules()), [CORPUS / "lmcache_4759_enginecore_threads.txt"]
    )
    roles = {s.thread_id: s.role for s in listing.stacks if s.thread_id}
    assert roles == dict.fromkeys(["765", "894", "895", "896", "901"], Role.ENGINE_CORE.value)


def test_the_logging_module_names_the_process_only_where_nothing_else_does() -> None:
    listing = list_stacks(Classifier(load_rules()), [CORPUS / "vllm_19703_cgraph_get_timeout.txt"])
    assert [(s.role, s.phase) for s in listing.stacks] == [("engine_core", "model_wait")]
    stack = parse_file(CORPUS / "vllm_19703_cgraph_get_timeout.txt").stacks[0]
    assert stack.logger == "core.py"


def test_nothing_readable_is_never_silent() -> None:
    result = parse_text("> [2025-05-20T10:47:04Z] nothing here that is a stack\n")
    assert not result.stacks and result.warnings
    assert "no stack found" in result.warnings[0]


# One long line of each shape that made a pattern backtrack quadratically (issue 26, item 15):
# 20,000 spaces after an ISO time took 10.7 s, any line of spaces 0.7-0.9 s (Ray's fold mark),
# `a;a;...; 1x` 0.4 s (format detection). Not a timing benchmark: a bound 50x above what a
# linear pattern needs here, so that a blow-up fails instead of stalling the suite.
LONG_LINES = {
    "iso time, spaces": "2025-01-01 00:00:00" + " " * 20000 + "x",
    "level, spaces": "INFO" + " " * 20000 + "x",
    "spaces, bar": " " * 20000 + "|x",
    "raw-like": "a;" * 10000 + " 1x",
    "frame, spaces": "a" + " " * 20000 + "(b:1)",
    "tags": "(a pid=1) " * 4000,
    "an open tag, spaces": "(" + " " * 20000 + "x",  # the pid tag's lazy name: 0.6 s
}


@pytest.mark.parametrize("text", LONG_LINES.values(), ids=LONG_LINES.keys())
def test_a_long_line_is_read_in_linear_time(text: str) -> None:
    started = time.process_time()
    parse_text(text)
    assert time.process_time() - started < 2.0


def test_only_a_regular_file_of_sane_size_is_read(tmp_path: Path) -> None:
    # Issue 26, item 19: `classify /dev/zero` grew to 3 GB before it failed; a FIFO blocks.
    with pytest.raises(InputError, match="not a regular file"):
        parse_file("/dev/zero")
    fifo = tmp_path / "dump.fifo"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match="not a regular file"):
        parse_file(fifo)


def test_a_line_past_the_cap_is_read_up_to_it_and_said() -> None:
    # Issue 26, item 15: a cap on line length, with a warning.
    text = 'Thread 1 (idle): "MainThread"\n    f (x.py:1)\n' + "a" * 100_000 + "\n    g (y.py:2)\n"
    result = parse_text(text)
    assert [f.function for f in result.stacks[0].frames] == ["f", "g"]
    assert any("over 65,536 characters" in w for w in result.warnings)

"""Pasted, cut and headerless stack text, and the rules that generalise (plugins, native frames,
library threads), on real text only: tests/fixtures/fragments (public issues, cited in its
README), the public dumps and this project's recordings. No processes."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.classify.classifier import Classifier
from sidecar.classify.explain import explain
from sidecar.classify.rules import load_rules
from sidecar.parsers import InputFormat, parse_file, parse_text
from sidecar.records import Frame, Phase, Role, StackSample

ROOT = Path(__file__).resolve().parents[3]
FRAGMENTS = ROOT / "tests" / "fixtures" / "fragments"
PUBLIC = ROOT / "tests" / "fixtures" / "public"
RULES = load_rules()


def only(path: Path) -> tuple[StackSample, tuple[str, ...]]:
    parsed = parse_file(path)
    assert len(parsed.stacks) == 1, parsed
    return parsed.stacks[0], parsed.warnings


@pytest.mark.parametrize(
    ("name", "role", "phase", "rule", "frame"),
    [
        ("ascend_6784_traceback.txt", Role.WORKER, Phase.STARTUP, "startup-model-init",
         "determine_available_memory"),
        ("ascend_3717_traceback_cut.txt", Role.ENGINE_CORE, Phase.MODEL_WAIT,
         "model-wait-collective-rpc", "get_response"),
        ("vllm_42897_native_cut.txt", Role.OTHER, Phase.GPU_WAIT, "gpu-wait-sync",
         "cuEventSynchronize"),
    ],
)  # fmt: skip
def test_real_fragments_classify(
    name: str, role: Role, phase: Phase, rule: str, frame: str
) -> None:
    stack, _ = only(FRAGMENTS / name)
    (e,) = explain(Classifier(RULES), [stack])
    assert (e.role, e.phase, e.rule) == (role, phase, rule)
    assert e.frame is not None and e.frame.function == frame


def test_a_native_frame_cut_in_its_library_keeps_the_library() -> None:
    stack, warnings = only(FRAGMENTS / "vllm_42897_native_cut.txt")
    assert stack.thread_id == "<pid>" and stack.thread_name == "MainThread"  # redacted id
    assert stack.frames == (Frame("cuEventSynchronize", "libcuda.so.5", None, True),)
    assert any("cut off, kept its function and library libcuda.so.5" in w for w in warnings)


def test_faulthandler_without_its_header() -> None:
    """public_006 (vllm#18466) with its first `Thread 0x... (most recent call first):` line cut
    off: still faulthandler, a warning names the missing header, the tqdm monitor stays idle."""
    text = (PUBLIC / "public_006.txt").read_text()
    header_end = text.index("\n", text.index("(most recent call first):")) + 1
    parsed = parse_text(text[header_end:])
    assert parsed.format == InputFormat.FAULTHANDLER
    assert any("no `Thread 0x... (most recent call first):` header" in w for w in parsed.warnings)
    first = parsed.stacks[0]
    assert first.thread_id is None
    assert Classifier(RULES).classify(first).phase is Phase.IDLE


def test_traceback_without_its_header() -> None:
    text = (FRAGMENTS / "ascend_6784_traceback.txt").read_text()
    fragment = "\n".join(text.splitlines()[1:])  # the `Traceback (most recent call last):` gone
    parsed = parse_text(fragment)
    assert parsed.format == InputFormat.TRACEBACK
    assert any("no `Traceback (most recent call last):` line" in w for w in parsed.warnings)
    (stack,) = parsed.stacks
    assert Classifier(RULES).classify(stack).phase is Phase.STARTUP


# Frames as real dumps and tracebacks name them, innermost first; each row says where from.
PLUGIN_AND_NATIVE = [
    # vllm-ascend tracebacks: worker_v1.py:290 execute_model -> model_runner_v1.py:2291
    # execute_model (vllm-ascend CI, 2025-11; found with the code search of public issues).
    ((Frame("execute_model", "/__w/vllm-ascend/vllm-ascend/vllm_ascend/worker/model_runner_v1.py", 2291),
      Frame("execute_model", "/__w/vllm-ascend/vllm-ascend/vllm_ascend/worker/worker_v1.py", 290)),
     Phase.FORWARD),
    # https://github.com/vllm-project/vllm-ascend/issues/6784: worker.py:262 determine_available_memory
    ((Frame("determine_available_memory", "/vllm-workspace/vllm-ascend/vllm_ascend/worker/worker.py", 262),),
     Phase.STARTUP),
    # https://github.com/pytorch/pytorch/issues/95944 (gdb): a read-back over cudaMemcpyAsync
    ((Frame("cudaMemcpyAsync", "libcudart.so.11.0", None, True),
      Frame("at::native::_local_scalar_dense_cuda(at::Tensor const&)", "libtorch_cuda.so", None, True)),
     Phase.GPU_WAIT),
    # https://github.com/NVIDIA/TensorRT-LLM/issues/2560 (gdb): NCCL's InfiniBand event thread
    # waits in read(): a library thread that only waits
    ((Frame("read", "libpthread.so.0", None, True),
      Frame("ibv_get_async_event", "libibverbs.so.1", None, True),
      Frame("wrap_ibv_get_async_event(ibv_context*, ibv_async_event*)", "libnccl.so.2", None, True),
      Frame("ncclIbAsyncThreadMain(void*)", "libnccl.so.2", None, True)),
     Phase.IDLE),
    # NCCL's public API (src/nccl.h.in: ncclGroupEnd), matched by family where no Python frame
    # decides
    ((Frame("ncclGroupEnd", "libnccl.so.2", None, True),), Phase.COMMUNICATION),
    # kernel launchers by name, from their sources: vLLM's csrc/attention/paged_attention_v1.cu
    # (paged_attention_v1_launcher) and FlashInfer's include/flashinfer/sampling.cuh
    # (a call site: `flashinfer::sampling::TopKTopPSamplingFromProb<float, int>(`); names only,
    # as no public dump of either was found
    ((Frame("paged_attention_v1_launcher", "_C.abi3.so", None, True),),
     Phase.ATTENTION),
    ((Frame("flashinfer::sampling::TopKTopPSamplingFromProb<float, int>", "", None, True),),
     Phase.SAMPLING),
    # this project's recordings (cpu-0.32): anyio's worker thread waiting for work
    ((Frame("Condition.wait", "threading.py", 327),
      Frame("WorkerThread.run", "anyio/_backends/_asyncio.py", 1113),
      Frame("Thread._bootstrap_inner", "threading.py", 1045)),
     Phase.IDLE),
]  # fmt: skip


@pytest.mark.parametrize(("frames", "phase"), PLUGIN_AND_NATIVE)
def test_rules_that_generalise(frames: tuple[Frame, ...], phase: Phase) -> None:
    label = Classifier(RULES).classify(StackSample(frames))
    assert label.phase is phase, label
    assert label.rule != "wait-without-context"


def test_every_rule_names_its_versions() -> None:
    for rule in RULES.rules:
        if rule.kind.value != "skip":
            assert rule.versions, rule.name

"""The classifier against docs/PHASES.md, as tables whose rows name the vLLM version they come from.

Rows are stacks leaf first, written as py-spy prints frames (`function (file:line)`); the frames
of GPU-only paths (FlashInfer, MLA, CUDA graphs, NCCL) were read from vLLM's source at the commit
each version tag names (docs/vllm-internals.md, section 0). The real dumps in tests/fixtures/public
and the recordings in tests/fixtures/recorded are tested in test_dev_stacks.py.
"""

from __future__ import annotations

import re

import pytest

from sidecar.classify.classifier import Classifier, classify_frames, own_frames
from sidecar.classify.rules import load_rules
from sidecar.records import Frame, Phase, Role, StackSample, Stage

RULES = load_rules()
_FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^():]+)(?::(?P<line>\d+))?\)$")


def frames(*lines: str) -> tuple[Frame, ...]:
    out = []
    for text in lines:
        m = _FRAME.match(text)
        assert m, text
        native = not m["file"].endswith(".py")
        out.append(Frame(m["fn"], m["file"], int(m["line"]) if m["line"] else None, native))
    return tuple(out)


V1_WORKER_ROOT = (
    "execute_model (vllm/v1/worker/worker_base.py:366)",
    "worker_busy_loop (vllm/v1/executor/multiproc_executor.py:963)",
    "worker_main (vllm/v1/executor/multiproc_executor.py:900)",
)
V1_ENGINE_ROOT = (
    "EngineCore.step (vllm/v1/engine/core.py:676)",
    "EngineCoreProc._process_engine_step (vllm/v1/engine/core.py:1500)",
    "EngineCoreProc.run_busy_loop (vllm/v1/engine/core.py:1458)",
    "EngineCoreProc.run_engine_core (vllm/v1/engine/core.py:1400)",
)

CASES = [
    # (id, vLLM version, frames leaf first, title, phase, stage, role)
    ("v1-worker-dequeue-idle", "V1-0.11",
     ("poll (zmq/sugar/poll.py:106)",
      "wait (vllm/distributed/device_communicators/shm_broadcast.py:186)",
      "acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:674)",
      "dequeue (vllm/distributed/device_communicators/shm_broadcast.py:755)",
      "worker_busy_loop (vllm/v1/executor/multiproc_executor.py:963)"),
     None, Phase.IDLE, None, Role.WORKER),
    ("v1-engine-collective-rpc-model-wait", "U",
     ("sched_yield (vllm/distributed/utils.py:50)",
      "acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:674)",
      "dequeue (vllm/distributed/device_communicators/shm_broadcast.py:755)",
      "MultiprocExecutor.collective_rpc.<locals>.get_response (vllm/v1/executor/multiproc_executor.py:300)",
      "MultiprocExecutor.collective_rpc (vllm/v1/executor/multiproc_executor.py:320)",
      "MultiprocExecutor.execute_model (vllm/v1/executor/multiproc_executor.py:250)",
      *V1_ENGINE_ROOT),
     "VLLM::EngineCore", Phase.MODEL_WAIT, None, Role.ENGINE_CORE),
    ("v1-engine-schedule", "U",
     ("Scheduler.schedule (vllm/v1/core/sched/scheduler.py:400)", *V1_ENGINE_ROOT),
     "VLLM::EngineCore", Phase.SCHEDULING, None, Role.ENGINE_CORE),
    ("v1-engine-allocate-slots", "U",
     ("BlockPool.get_new_blocks (vllm/v1/core/block_pool.py:300)",
      "KVCacheManager.allocate_slots (vllm/v1/core/kv_cache_manager.py:250)",
      "Scheduler.schedule (vllm/v1/core/sched/scheduler.py:400)", *V1_ENGINE_ROOT),
     "VLLM::EngineCore", Phase.KV_CACHE, None, Role.ENGINE_CORE),
    ("v1-engine-input-queue-idle", "V1-0.11",
     ("wait (threading.py:355)", "get (queue.py:171)",
      "_process_input_queue (vllm/v1/engine/core.py:1480)",
      "run_busy_loop (vllm/v1/engine/core.py:1458)"),
     None, Phase.IDLE, None, Role.ENGINE_CORE),
    ("v1-worker-flashinfer-decode", "U",
     ("BatchDecodeWithPagedKVCacheWrapper.run (flashinfer/decode.py:1200)",
      "FlashInferImpl.forward (vllm/v1/attention/backends/flashinfer.py:900)",
      "unified_attention_with_output (vllm/model_executor/layers/attention/attention.py:700)",
      "LlamaAttention.forward (vllm/model_executor/models/llama.py:200)",
      "GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:2000)",
      "GPUModelRunner.execute_model (vllm/v1/worker/gpu_model_runner.py:2100)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.DECODE, Role.WORKER),
    ("v1-worker-flashinfer-prefill", "U",
     ("BatchPrefillWithPagedKVCacheWrapper.run (flashinfer/prefill.py:2000)",
      "FlashInferImpl.forward (vllm/v1/attention/backends/flashinfer.py:900)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.PREFILL, Role.WORKER),
    ("v1-worker-flash-attn-mixed", "U",
     ("flash_attn_varlen_func (vllm/vllm_flash_attn/flash_attn_interface.py:200)",
      "FlashAttentionImpl.forward (vllm/v1/attention/backends/flash_attn.py:500)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.UNKNOWN, Role.WORKER),
    ("v1-worker-mla-forward-mqa", "U",
     ("FlashMLAImpl.forward_mqa (vllm/v1/attention/backends/mla/flashmla.py:150)",
      "MLAAttention.forward_impl (vllm/model_executor/layers/attention/mla_attention.py:400)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.DECODE, Role.WORKER),
    ("v1-worker-mla-forward-mha", "U",
     ("MLAAttention.forward_mha (vllm/model_executor/layers/attention/mla_attention.py:500)",
      "MLAAttention.forward_impl (vllm/model_executor/layers/attention/mla_attention.py:400)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.PREFILL, Role.WORKER),
    ("v1-worker-triton-unified", "V1-0.11",
     ("unified_attention (vllm/attention/ops/triton_unified_attention.py:600)",
      "TritonAttentionImpl.forward (vllm/v1/attention/backends/triton_attn.py:300)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.UNKNOWN, Role.WORKER),
    ("v1-worker-xformers-decode", "V1-0.10",
     ("memory_efficient_attention_forward (xformers/ops/fmha/__init__.py:300)",
      "XFormersAttentionImpl.forward (vllm/v1/attention/backends/xformers.py:350)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.ATTENTION, Stage.DECODE, Role.WORKER),
    ("v1-cpu-attention-mixed", "U",
     ("CPUAttentionBackendImpl.forward (vllm/v1/attention/backends/cpu_attn.py:500)",
      "unified_attention_with_output (vllm/model_executor/layers/attention/attention.py:700)",
      *V1_WORKER_ROOT),
     "VLLM::Worker", Phase.ATTENTION, Stage.UNKNOWN, Role.WORKER),
    ("v1-cpu-reshape-and-cache", "U",
     ("cpu_attn_reshape_and_cache (vllm/_custom_ops.py:3000)",
      "CPUAttentionBackendImpl.forward (vllm/v1/attention/backends/cpu_attn.py:500)",
      *V1_WORKER_ROOT),
     "VLLM::Worker", Phase.KV_CACHE, None, Role.WORKER),
    ("v1-worker-linear-forward", "U",
     ("UnquantizedLinearMethod.apply (vllm/model_executor/layers/linear.py:200)",
      "LlamaMLP.forward (vllm/model_executor/models/llama.py:100)",
      "_call_impl (torch/nn/modules/module.py:1762)",
      "GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:2000)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.FORWARD, Stage.UNKNOWN, Role.WORKER),
    ("cpu-ir-op-forward", "cpu-0.32",
     ("fused_add_rms_norm (vllm/ir/ops/layernorm.py:62)",
      "IrOp.__call__ (vllm/ir/op.py:363)",
      "LlamaDecoderLayer.forward (vllm/model_executor/models/llama.py:329)",
      *V1_WORKER_ROOT),
     "VLLM::Worker", Phase.FORWARD, Stage.UNKNOWN, Role.WORKER),
    ("v1-full-cudagraph-decode", "U",
     ("CUDAGraph.replay (torch/cuda/graphs.py:88)",
      "CUDAGraphWrapper.__call__ (vllm/compilation/cuda_graph.py:200)",
      "GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:2000)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.DECODE, Stage.DECODE, Role.WORKER),
    ("v1-piecewise-cudagraph-unknown", "U",
     ("CUDAGraph.replay (torch/cuda/graphs.py:88)",
      "PiecewiseBackend.__call__ (vllm/compilation/piecewise_backend.py:100)",
      "LlamaModel.forward (vllm/model_executor/models/llama.py:300)",
      "GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:2000)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.FORWARD, Stage.UNKNOWN, Role.WORKER),
    ("v1-sampler", "U",
     ("TopKTopPSampler.forward_native (vllm/v1/sample/ops/topk_topp_sampler.py:100)",
      "Sampler.forward (vllm/v1/sample/sampler.py:80)",
      "GPUModelRunner.sample_tokens (vllm/v1/worker/gpu_model_runner.py:2500)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.SAMPLING, Stage.UNKNOWN, Role.WORKER),
    ("v1-gpu-wait-async-output", "U",
     ("Event.synchronize (torch/cuda/streams.py:230)",
      "AsyncGPUModelRunnerOutput.get_output (vllm/v1/worker/gpu_model_runner.py:200)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.GPU_WAIT, None, Role.WORKER),
    ("native-cuda-sync", "U",
     ("cudaStreamSynchronize (libcudart.so.12)",
      "GPUModelRunner._to_list (vllm/v1/worker/gpu_model_runner.py:3000)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.GPU_WAIT, None, Role.WORKER),
    ("v1-tp-all-reduce", "U",
     ("GroupCoordinator.all_reduce (vllm/distributed/parallel_state.py:400)",
      "tensor_model_parallel_all_reduce (vllm/distributed/communication_op.py:14)",
      "RowParallelLinear.forward (vllm/model_executor/layers/linear.py:1300)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP1", Phase.COMMUNICATION, None, Role.WORKER),
    ("v1-api-detokenize", "U",
     ("IncrementalDetokenizer.update (vllm/v1/engine/detokenizer.py:100)",
      "OutputProcessor.process_outputs (vllm/v1/engine/output_processor.py:400)",
      "AsyncLLM._run_output_handler.<locals>.output_handler (vllm/v1/engine/async_llm.py:600)"),
     "python -m vllm.entrypoints.openai.api_server --model x", Phase.OUTPUT_PROCESSING, None,
     Role.API_SERVER),
    ("v1-api-tokenize", "U",
     ("PreTrainedTokenizerFast._batch_encode_plus (transformers/tokenization_utils_fast.py:500)",
      "AsyncMicrobatchTokenizer._batch_encode_loop (vllm/utils/async_utils.py:100)"),
     "VLLM::APIServer_0", Phase.INPUT_PROCESSING, None, Role.API_SERVER),
    ("v1-api-idle-uvloop", "cpu-0.32",
     ("run (uvloop/__init__.py:96)",),
     "python -m vllm.entrypoints.openai.api_server", Phase.IDLE, None, Role.API_SERVER),
    ("v1-engine-input-thread-decode", "U",
     ("MsgpackDecoder.decode (vllm/v1/serial_utils.py:300)",
      "EngineCoreProc.process_input_sockets (vllm/v1/engine/core.py:1600)",
      "Thread.run (threading.py:982)"),
     "VLLM::EngineCore", Phase.INPUT_PROCESSING, None, Role.ENGINE_CORE),
    ("v1-engine-output-thread-encode", "U",
     ("MsgpackEncoder.encode_into (vllm/v1/serial_utils.py:200)",
      "EngineCoreProc.process_output_sockets (vllm/v1/engine/core.py:1700)",
      "Thread.run (threading.py:982)"),
     "VLLM::EngineCore", Phase.OUTPUT_PROCESSING, None, Role.ENGINE_CORE),
    ("startup-wins-over-sampler", "U",
     ("Sampler.forward (vllm/v1/sample/sampler.py:80)",
      "GPUModelRunner._dummy_sampler_run (vllm/v1/worker/gpu_model_runner.py:3500)",
      "Worker.compile_or_warm_up_model (vllm/v1/worker/gpu_worker.py:400)",
      *V1_WORKER_ROOT),
     "VLLM::Worker_TP0", Phase.STARTUP, None, Role.WORKER),
    ("v0-cuda-graph-decode", "V0-0.7",
     ("CUDAGraph.replay (torch/cuda/graphs.py:88)",
      "CUDAGraphRunner.forward (vllm/worker/model_runner.py:1800)",
      "ModelRunner.execute_model (vllm/worker/model_runner.py:1700)",
      "execute_model (vllm/worker/worker_base.py:400)",
      "_run_worker_process (vllm/executor/multiproc_worker_utils.py:220)"),
     None, Phase.DECODE, Stage.DECODE, Role.WORKER),
    ("v0-flash-attn-with-kvcache-decode", "V0-0.7",
     ("flash_attn_with_kvcache (vllm/vllm_flash_attn/flash_attn_interface.py:300)",
      "FlashAttentionImpl.forward (vllm/attention/backends/flash_attn.py:700)",
      "run_engine_loop (vllm/engine/multiprocessing/engine.py:226)"),
     None, Phase.ATTENTION, Stage.DECODE, Role.ENGINE_CORE),
    ("v0-sdpa-prefill", "V0-0.7",
     ("TorchSDPABackendImpl._run_sdpa_forward (vllm/attention/backends/torch_sdpa.py:500)",
      "TorchSDPABackendImpl.forward (vllm/attention/backends/torch_sdpa.py:450)",
      "CPUModelRunner.execute_model (vllm/worker/cpu_model_runner.py:600)"),
     None, Phase.ATTENTION, Stage.PREFILL, Role.OTHER),
    ("v0-paged-decode", "V0-0.7",
     ("paged_attention_v1 (vllm/_custom_ops.py:50)",
      "PagedAttention.forward_decode (vllm/attention/ops/paged_attn.py:100)",
      "XFormersImpl.forward (vllm/attention/backends/xformers.py:600)"),
     None, Phase.ATTENTION, Stage.DECODE, Role.OTHER),
    ("v0-scheduler", "V0-0.7",
     ("Scheduler._schedule_running (vllm/core/scheduler.py:600)",
      "LLMEngine.step (vllm/engine/llm_engine.py:1358)",
      "MQLLMEngine.engine_step (vllm/engine/multiprocessing/engine.py:235)"),
     None, Phase.SCHEDULING, None, Role.ENGINE_CORE),
    ("v0-block-manager", "V0-0.7",
     ("SelfAttnBlockSpaceManager.append_slots (vllm/core/block_manager.py:200)",
      "Scheduler._append_slots (vllm/core/scheduler.py:1400)",
      "LLMEngine.step (vllm/engine/llm_engine.py:1358)"),
     None, Phase.KV_CACHE, None, Role.OTHER),
    ("v0-greedy-sample-sync", "V0-0.7",
     ("_greedy_sample (vllm/model_executor/layers/sampler.py:500)",
      "_sample_with_torch (vllm/model_executor/layers/sampler.py:600)"),
     None, Phase.GPU_WAIT, None, Role.OTHER),
    ("v0-worker-waiting-for-broadcast", "V0-0.7",
     ("sched_yield (vllm/distributed/utils.py:40)",
      "acquire_read (vllm/distributed/device_communicators/shm_broadcast.py:400)",
      "dequeue (vllm/distributed/device_communicators/shm_broadcast.py:450)",
      "broadcast_object (vllm/distributed/parallel_state.py:500)",
      "broadcast_tensor_dict (vllm/distributed/parallel_state.py:600)",
      "_get_worker_input_from_broadcast (vllm/worker/worker_base.py:330)",
      "start_worker_execution_loop (vllm/worker/worker_base.py:300)"),
     None, Phase.COMMUNICATION, None, Role.WORKER),
    ("tqdm-monitor-idle", "V1-0.9",
     ("wait (threading.py:359)", "wait (threading.py:655)",
      "run (tqdm/_monitor.py:60)", "_bootstrap_inner (threading.py:1075)"),
     None, Phase.IDLE, None, Role.OTHER),
    ("unknown-code-is-other", "-",
     ("helper (mylib/util.py:10)", "Thread.run (threading.py:982)"),
     None, Phase.OTHER, None, Role.OTHER),
]  # fmt: skip


@pytest.mark.parametrize(
    ("version", "stack", "title", "phase", "stage", "role"),
    [pytest.param(*row[1:], id=f"{row[0]}[{row[1]}]") for row in CASES],
)
def test_phase_contract(
    version: str,
    stack: tuple[str, ...],
    title: str | None,
    phase: Phase,
    stage: Stage | None,
    role: Role,
) -> None:
    label = classify_frames(RULES, frames(*stack), title)
    assert (label.phase, label.role) == (phase, role), label
    if stage is not None:
        assert label.stage is stage, label


def test_fork_history_is_cut_off() -> None:
    """A forked worker keeps EngineCore.__init__ below _bootstrap: that is not startup."""
    stack = frames(
        "wait (threading.py:355)",
        "dequeue (vllm/distributed/device_communicators/shm_broadcast.py:755)",
        "WorkerProc.worker_busy_loop (vllm/v1/executor/multiproc_executor.py:963)",
        "WorkerProc.worker_main (vllm/v1/executor/multiproc_executor.py:900)",
        "BaseProcess._bootstrap (multiprocessing/process.py:314)",
        "Popen._launch (multiprocessing/popen_fork.py:71)",
        "WorkerProc.make_worker_process (vllm/v1/executor/multiproc_executor.py:386)",
        "EngineCore.__init__ (vllm/v1/engine/core.py:67)",
    )
    assert len(own_frames(RULES, stack)) == 5
    label = classify_frames(RULES, stack)
    assert (label.phase, label.role) == (Phase.IDLE, Role.WORKER)


def test_qualified_and_bare_names_match_alike() -> None:
    bare = classify_frames(RULES, frames("schedule (vllm/v1/core/sched/scheduler.py:1)"))
    qualified = classify_frames(
        RULES, frames("Scheduler.schedule (vllm/v1/core/sched/scheduler.py:1)")
    )
    full_path = classify_frames(
        RULES,
        frames("schedule (/venv/lib/python3.12/site-packages/vllm/v1/core/sched/scheduler.py:1)"),
    )
    assert bare.phase is qualified.phase is full_path.phase is Phase.SCHEDULING


def test_classifier_memoises_per_stack() -> None:
    classifier = Classifier(RULES)
    stack = StackSample(frames=frames("schedule (vllm/v1/core/sched/scheduler.py:1)"), weight=3)
    first = classifier.classify(stack)
    assert classifier.classify(StackSample(frames=stack.frames, weight=9)) is first
    assert len(classifier._cache) == 1


def test_every_phase_is_reachable_from_the_rules() -> None:
    """All fifteen phases of docs/PHASES.md appear in the rules file or the walk's defaults."""
    named = {r.phase for r in RULES.rules if r.phase} | {Phase.IDLE, Phase.OTHER, Phase.PREFILL}
    assert named == set(Phase)

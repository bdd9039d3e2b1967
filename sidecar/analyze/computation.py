"""Two prefill/decode figures that answer two different questions, side by side.

* **Per request (vLLM's clock)**: `vllm:request_prefill_time_seconds` and
  `vllm:request_decode_time_seconds`, the mean wall time a request spent from being scheduled to
  its first token, and from there to its last. A request's decode time includes every step it
  waited through while the batch served other requests, so decode dominates whenever requests
  generate more than a few tokens. It answers "how long does a user wait, and in which part?".
* **Model steps (the stacks)**: the worker's model-step samples (forward, attention, sampling)
  by stage. V1 mixes prefill and decode in one batch, so the stack rarely tells them apart; the
  unknown-stage samples are split by the window's prompt and generated token counts (an
  estimate). It answers "where did the worker's compute go?".

On a recorded `mixed` window (tests/fixtures/diff/steady-mixed) the first reads prefill 6 % /
decode 94 % and the second prefill 80 % / decode 20 %: the prompts cost most of the compute, yet
each request spends most of its life in decode, sharing steps with the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.records.summary import SnapshotSummary

PER_REQUEST_QUESTION = "how long a request waits in each (decode counts the batch's other requests)"
STEP_QUESTION = "where the worker's compute went"
SPLIT_HOW = (
    "model-step samples whose stage the stack cannot tell (V1 mixes prefill and decode in one "
    "batch), split by the window's prompt vs generated tokens: an estimate"
)


@dataclass(frozen=True, slots=True)
class StepSplit:
    """The worker's model-step samples by stage; `estimated` when unknown-stage samples were
    apportioned by token counts."""

    prefill: float
    decode: float
    samples: int  # model-step samples behind it (known and unknown stage)
    estimated: bool

    @property
    def prefill_share(self) -> float | None:
        total = self.prefill + self.decode
        return self.prefill / total if total else None

    @property
    def decode_share(self) -> float | None:
        total = self.prefill + self.decode
        return self.decode / total if total else None


def step_split(s: SnapshotSummary) -> StepSplit | None:
    """Prefill vs decode of the model-step samples, or None where they cannot be split (no
    model-step samples, or unknown-stage ones without the window's token counts)."""
    stages = s.stages
    prefill, decode = stages.get("prefill", 0), stages.get("decode", 0)
    unknown = stages.get("unknown", 0)
    samples = prefill + decode + unknown
    if not unknown:
        return StepSplit(prefill, decode, samples, False) if samples else None
    prompt, generated = s.serving.prompt_tokens, s.serving.generation_tokens
    if prompt is None or generated is None or prompt + generated <= 0:
        return None
    share = prompt / (prompt + generated)
    return StepSplit(prefill + unknown * share, decode + unknown * (1 - share), samples, True)

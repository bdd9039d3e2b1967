"""The role a process title, command line or log tag names (docs/PHASES.md, "Roles").

One table for two readers: discovery reads /proc titles with it, the classifier reads the process
a stack came with (py-spy's `Process PID: CMDLINE`, or the tag of a pasted log line), so both
agree on every title. Pure: no /proc here (sidecar/target/discovery.py reads it).
"""

from __future__ import annotations

import re

from sidecar.records import Role

# The part before `::` is VLLM_PROCESS_NAME_PREFIX (default "VLLM"), which operators may change,
# so the rows naming a vLLM process accept any prefix without spaces or colons. The names after
# `::` must then match vLLM's own grammar exactly (anchored at both ends), and Ray's titles
# (`ray::Worker`, `ray::IDLE`), which share the `name::` form, are excluded by name.
_PREFIX = r"^(?!ray::)[^\s:]+::"
# An interpreter and its options in front of a script or module: `/venv/bin/python3.12 -X dev`.
# Anchoring it at the start keeps wrappers (`bash -c "vllm serve"`, `uv run vllm serve`) and
# programs that merely mention vLLM in their arguments (`pytest -k "vllm serve"`) out.
_INTERPRETER = r"(?:\S*/)?python[\d.]*\s+(?:-[XW]\s+\S+\s+|-\S+\s+)*"
_PY = "^" + _INTERPRETER

# Title (or joined cmdline) patterns in priority order; the first match decides the role. A
# forked child keeps its parent's identity until it retitles itself, so the most specific role
# comes first: worker before engine before API server (docs/PHASES.md, "Roles").
ROLE_PATTERNS: tuple[tuple[re.Pattern[str], Role], ...] = tuple(
    (re.compile(pattern), role)
    for pattern, role in (
        # VLLM::Worker, VLLM::Worker_TP0, VLLM::Worker_PP1_TP3, VLLM::Worker_DP1_EP3.
        (_PREFIX + r"Worker(?:_\w+)?$", Role.WORKER),
        # vLLM 0.10 (2025-07-29 to 2025-09-08) appended `_TP<r>` to the inherited engine title.
        (_PREFIX + r"(?:DP)?EngineCore\w*_TP\d+$", Role.WORKER),
        # VLLM::EngineCore, VLLM::EngineCore_DP1, vLLM 0.10's VLLM::DPEngineCore_1.
        (_PREFIX + r"(?:DP)?EngineCore(?:_\w+)?$", Role.ENGINE_CORE),
        (_PREFIX + r"APIServer(?:_\d+)?$", Role.API_SERVER),
        (_PY + r"-m\s+vllm\.entrypoints\.(?:openai\.)?api_server(?:\s|$)", Role.API_SERVER),
        (_PY + r"\S*vllm/entrypoints/(?:openai/)?api_server\.py(?:\s|$)", Role.API_SERVER),
        (_PY + r"-m\s+vllm\.entrypoints\.cli\.main\s+serve(?:\s|$)", Role.API_SERVER),
        # The `vllm` console script, run directly or by its interpreter (a shebang line).
        ("^(?:" + _INTERPRETER + r")?(?:\S*/)?vllm\s+serve(?:\s|$)", Role.API_SERVER),
        # Ray executors: vLLM's workers are Ray actors titled `ray::CLASS.METHOD` while they run
        # a method (`ray::RayWorkerWrapper.execute_method`; RayWorkerWrapper in
        # vllm/executor/ray_utils.py, RayWorkerProc of the V1 RayExecutorV2 in
        # https://github.com/vllm-project/vllm/issues/50835).
        (r"^ray::(?:RayWorkerWrapper|RayWorkerProc)(?:\.\S+)?$", Role.WORKER),
        (_PREFIX + r"DPCoordinator$", Role.OTHER),
        # Titles vLLM may add later; only under the default prefix, as `name::` is common.
        (r"^VLLM::\S", Role.OTHER),
    )
)

# The names vLLM puts in front of its log lines, `(NAME pid=N) ` (`decorate_logs` in
# vllm/utils/system_utils.py: the multiprocessing name or the title without `VLLM::`). The stack
# parsers keep NAME as a pasted stack's process, so the classifier sees these too; they never
# appear in /proc, so discovery does not accept them as vLLM processes.
LOG_TAG_PATTERNS: tuple[tuple[re.Pattern[str], Role], ...] = tuple(
    (re.compile(f"^(?:{pattern})$"), role)
    for pattern, role in (
        # V0 `VllmWorkerProcess`, V1-0.8 `VllmWorker-0`, V1-0.10 `VllmWorker TP0`; then the title:
        # `Worker_TP0`, `Worker_PP1_TP3`, or `Worker (TP1)` as some releases print it; and the
        # worker's title of vLLM 0.10 without its prefix, as in ROLE_PATTERNS.
        (r"VllmWorker(?:Process|[- ]\S+)?|Worker(?:_\w+| \(\w+\))?", Role.WORKER),
        # Ray prefixes an actor's output with its class: `(RayWorkerWrapper pid=336) `.
        (r"RayWorkerWrapper|RayWorkerProc", Role.WORKER),
        (r"(?:DP)?EngineCore\w*_TP\d+", Role.WORKER),
        # V1-0.8 `EngineCore_0`; then `EngineCore`, `EngineCore_DP1`, V1-0.10 `DPEngineCore_1`.
        (r"(?:DP)?EngineCore(?:_\w+)?", Role.ENGINE_CORE),
        (r"A(?:PI|pi)Server(?:_\d+)?", Role.API_SERVER),  # `APIServer`; mp name `ApiServer_1`
    )
)


# The module named in vLLM's log header of a pasted traceback (`ERROR ... [core.py:517]`), where
# only one process logs from it: the EngineCore's fatal-error handler (vllm/v1/engine/core.py,
# "EngineCore encountered a fatal error": vllm-project/vllm#19703), the V0 MQ engine's
# (vllm/engine/multiprocessing/engine.py: #11173), the V0 AsyncLLMEngine's loop
# (vllm/engine/async_llm_engine.py: #9839), a V0 worker's method error
# (vllm/worker/worker_base.py execute_method, vllm/executor/multiproc_worker_utils.py
# _run_worker_process: #4650, #12625). Weaker than a title or a stack marker: it decides only
# where neither names a role. multiproc_executor.py logs from the EngineCore and the workers
# alike, so it names none.
LOGGER_ROLES: dict[str, Role] = {
    "core.py": Role.ENGINE_CORE,
    "engine.py": Role.ENGINE_CORE,
    "async_llm_engine.py": Role.ENGINE_CORE,
    "worker_base.py": Role.WORKER,
    "multiproc_worker_utils.py": Role.WORKER,
}


def first_role(table: tuple[tuple[re.Pattern[str], Role], ...], text: str) -> Role | None:
    return next((role for pattern, role in table if pattern.search(text)), None)


def title_role(title: str) -> Role | None:
    """The role a process title, command line or log tag names; None when it names none.

    The one place a role is read from a name. Discovery reads /proc titles with the same
    ROLE_PATTERNS (`role_of`); the classifier reads the process a stack came with (py-spy's
    `Process PID: CMDLINE`, or the tag of a pasted log line), so both agree on every title.
    """
    return first_role(ROLE_PATTERNS, title) or first_role(LOG_TAG_PATTERNS, title.strip())

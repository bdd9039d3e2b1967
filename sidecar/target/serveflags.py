"""The serving flags that shape performance, and the deployment's name, from vLLM's command line.

Read from the API server's `/proc/PID/cmdline`, as the operator typed them: only the flags
given explicitly are kept, with their value as given (`--max-num-seqs 256` -> `"256"`). A flag
that is absent is vLLM's default for that version, which this module does not guess: defaults
change between releases and hardware (`--enable-chunked-prefill` is on by default in V1,
`--block-size` depends on the attention backend), and the fingerprint's vLLM version pins them.

vLLM's parser (`FlexibleArgumentParser`, vllm/utils/argparse_utils.py) takes `--opt value` and
`--opt=value`, underscores for dashes (`--max_num_seqs`) and a few short forms (`-tp`); its
booleans are argparse's `BooleanOptionalAction` (`--enable-prefix-caching` /
`--no-enable-prefix-caching`), recorded as "true" / "false". A repeated flag's last value
wins, as in argparse. Flags in a `--config` YAML file are not read: the fingerprint says so.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePosixPath

from sidecar.target.modelconfig import serve_args

# Flags that take a value (vllm/engine/arg_utils.py, vllm/entrypoints/launchers/cli_args.py).
VALUE_FLAGS = (
    "tensor-parallel-size", "pipeline-parallel-size", "data-parallel-size",
    "max-num-seqs", "max-num-batched-tokens", "max-model-len", "block-size",
    "gpu-memory-utilization", "dtype", "kv-cache-dtype", "quantization",
    "api-server-count", "attention-backend", "speculative-config", "num-gpu-blocks-override",
)  # fmt: skip
# BooleanOptionalAction flags: `--name` is "true", `--no-name` is "false".
BOOL_FLAGS = (
    "enable-chunked-prefill", "enable-prefix-caching", "async-scheduling", "enforce-eager",
)  # fmt: skip
SHORT_FLAGS = {
    "-tp": "tensor-parallel-size",
    "-pp": "pipeline-parallel-size",
    "-dp": "data-parallel-size",
    "-q": "quantization",
    "-asc": "api-server-count",
}
DEFAULT_PORT = 8000  # vLLM's OpenAI server (vllm/entrypoints/launchers/cli_args.py)

_VALUED = frozenset(VALUE_FLAGS)
_BOOLS = frozenset(BOOL_FLAGS)


def serving_flags(cmdline: Sequence[str]) -> dict[str, str]:
    """The performance-shaping flags given on `cmdline`: name (no dashes) -> value as given."""
    found: dict[str, str] = {}
    args = list(cmdline)
    for i, arg in enumerate(args):
        name, eq, inline = _canonical(arg)
        if name in _VALUED:
            value = inline if eq else _next_value(args, i)
            if value is not None:
                found[name] = value
        elif name in _BOOLS:
            found[name] = inline if eq else "true"
        elif name.startswith("no-") and name[3:] in _BOOLS and not eq:
            found[name[3:]] = "false"
    return {flag: found[flag] for flag in (*VALUE_FLAGS, *BOOL_FLAGS) if flag in found}


def config_file(cmdline: Sequence[str]) -> str | None:
    """The `--config FILE` vLLM reads more flags from, when one is given."""
    args = list(cmdline)
    for i, arg in enumerate(args):
        name, eq, inline = _canonical(arg)
        if name == "config":
            return inline if eq else _next_value(args, i)
    return None


def deployment_name(cmdline: Sequence[str]) -> str | None:
    """`<served model name or model basename>@<API port>`: which vLLM a snapshot is of.

    The first `--served-model-name` is the name vLLM's metrics and API use; without one, the
    model's last path component (`/models/Llama-3.1-8B` and `meta-llama/Llama-3.1-8B` are both
    `Llama-3.1-8B`). A server on a Unix socket (`--uds`) is named by the socket's path. None
    when the command line names no model (not an API server).
    """
    args = list(cmdline)
    served = port = uds = None
    for i, arg in enumerate(args):
        name, eq, inline = _canonical(arg)
        value = inline if eq else _next_value(args, i)
        if name == "served-model-name" and served is None:
            served = value
        elif name == "port":
            port = value
        elif name == "uds":
            uds = value
    model = served or _basename(serve_args(args).model)
    if model is None:
        return None
    return f"{model}@{uds or port or DEFAULT_PORT}"


def api_port(cmdline: Sequence[str]) -> int | None:
    """The TCP port an API server's command line listens on: the last `--port`, else vLLM's
    default; None on a Unix socket (`--uds`) or for a port that is not a number."""
    args = list(cmdline)
    port: str | None = str(DEFAULT_PORT)
    for i, arg in enumerate(args):
        name, eq, inline = _canonical(arg)
        if name == "uds":
            return None
        if name == "port":
            port = inline if eq else _next_value(args, i)
    return int(port) if port is not None and port.isdigit() else None


def _canonical(arg: str) -> tuple[str, bool, str]:
    """`--max_num_seqs=8` -> ("max-num-seqs", True, "8"); `-tp` -> ("tensor-parallel-size", ...);
    anything else -> ("", False, "")."""
    name, eq, inline = arg.partition("=")
    if name in SHORT_FLAGS:
        return SHORT_FLAGS[name], bool(eq), inline
    if not name.startswith("--") or len(name) == 2:
        return "", False, ""
    return name[2:].replace("_", "-"), bool(eq), inline


def _next_value(args: list[str], i: int) -> str | None:
    if i + 1 < len(args) and not args[i + 1].startswith("--"):
        return args[i + 1]
    return None


def _basename(model: str | None) -> str | None:
    if not model:
        return None
    return PurePosixPath(model.rstrip("/")).name or model

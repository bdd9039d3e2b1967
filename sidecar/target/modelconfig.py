"""The served model's `config.json`, found the way vLLM found it, from outside the target.

vLLM reads `--model` (or `--hf-config-path`) either as a local folder or as a Hugging Face
model id, which `huggingface_hub` resolves in its cache:

    $HF_HUB_CACHE                      (default $HF_HOME/hub, default ~/.cache/huggingface/hub)
      models--{org}--{name}/refs/main  a commit hash (or refs/<branch> for --revision <branch>)
      models--{org}--{name}/snapshots/<hash>/config.json

Every path here is the *target's*: its environment (`/proc/PID/environ`: HF_HOME, HOME, ...)
and its files, read through `/proc/PID/root/` so that a container's model folder is seen from
a sidecar outside it (the same file, under another mount namespace). Nothing is downloaded:
a model the target has not got on disk is reported as not found, with the path we tried.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from sidecar.records import ProcessInfo
from sidecar.target.kvcache import KvInputs, kv_layout
from sidecar.target.procfs import ProcFs

_HEX40 = re.compile(r"[0-9a-f]{40}")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")

# vLLM's argument names (vllm/engine/arg_utils.py), with the short forms it accepts.
_ALIASES = {"-tp": "--tensor-parallel-size", "-pp": "--pipeline-parallel-size"}
_VALUED = frozenset(
    {
        "--model", "--hf-config-path", "--revision", "--dtype", "--download-dir",
        "--tensor-parallel-size", "--pipeline-parallel-size",
    }
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class ServeArgs:
    """What the API server's command line says about the model and how it is split.

    `tensor_parallel` / `pipeline_parallel` are None when the command line does not say
    (vLLM's default is 1; a `--config` YAML file may say otherwise, and is not read).
    """

    model: str | None = None
    hf_config_path: str | None = None
    revision: str | None = None
    dtype: str = "auto"
    download_dir: str | None = None
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None

    @property
    def world_size(self) -> int | None:
        """GPUs one engine uses: tensor x pipeline parallel; None when neither is given."""
        if self.tensor_parallel is None and self.pipeline_parallel is None:
            return None
        return (self.tensor_parallel or 1) * (self.pipeline_parallel or 1)


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """A model's parsed `config.json` and where it came from; `config` None says why not."""

    config: Mapping[str, Any] | None
    source: str  # the file and how it was found, or why none was


def serve_args(cmdline: Sequence[str]) -> ServeArgs:
    """Parse `vllm serve MODEL ...` or `python -m vllm.entrypoints.openai.api_server --model ...`.

    Both `--opt value` and `--opt=value` are read; vLLM also accepts underscores
    (`--tensor_parallel_size`), and `-tp` / `-pp`.
    """
    values: dict[str, str] = {}
    args = list(cmdline)
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        name = _ALIASES.get(name, name.replace("_", "-") if name.startswith("--") else name)
        if name not in _VALUED:
            continue  # argparse semantics: a repeated option's last value wins
        if eq:
            values[name] = inline
        elif i + 1 < len(args):
            values[name] = args[i + 1]
    model = values.get("--model") or _positional_model(args)
    return ServeArgs(
        model=model,
        hf_config_path=values.get("--hf-config-path"),
        revision=values.get("--revision"),
        dtype=values.get("--dtype", "auto").lower(),
        download_dir=values.get("--download-dir"),
        tensor_parallel=_positive(values.get("--tensor-parallel-size")),
        pipeline_parallel=_positive(values.get("--pipeline-parallel-size")),
    )


def find_model_config(
    procfs: ProcFs, pid: int, args: ServeArgs, environ: Mapping[str, str] | None
) -> ModelConfig:
    """Read the config.json that target `pid` serves, through `<proc root>/<pid>/root/`."""
    name = args.hf_config_path or args.model
    if not name:
        return ModelConfig(None, "no --model on the API server's command line")
    root = procfs.root / str(pid) / "root"
    env = environ or {}
    local = _local_folder(name, procfs.cwd(pid), env)
    if local is not None:
        found = _inside(root, local) / "config.json"
        if found.is_file() or not _HUB_ID.fullmatch(name):
            return _load(found, f"local folder {local}")
    if not _HUB_ID.fullmatch(name):
        return ModelConfig(None, f"--model {name!r} is neither a folder nor a Hugging Face id")
    tried = []
    for cache, why in _hub_caches(env, args.download_dir):
        repo = cache / f"models--{name.replace('/', '--')}"
        snapshot, how = _snapshot(root, repo, args.revision or "main")
        if snapshot is not None:
            return _load(_inside(root, snapshot) / "config.json", f"{why} {cache}, {how}")
        tried.append(f"{repo} ({how})")
    hint = "" if environ is not None else " (the target's environment could not be read)"
    return ModelConfig(None, f"{name} is not in the target's Hugging Face cache: "
                             f"tried {'; '.join(tried) or 'no cache folder'}{hint}")  # fmt: skip


def kv_inputs(
    procfs: ProcFs,
    api_server: ProcessInfo | None,
    gpu_totals: Mapping[str, int] | None = None,
    host_total: int | None = None,
) -> KvInputs:
    """What the KV arithmetic needs from the target: its model's layout, `--dtype` and
    parallelism (from the API server's command line), and the memory the share is of."""
    if api_server is None:
        return KvInputs(layout_source="no API server process to read the model from",
                        gpu_totals=gpu_totals, host_total=host_total)  # fmt: skip
    args = serve_args(api_server.cmdline)
    found = find_model_config(procfs, api_server.pid, args, procfs.environ(api_server.pid))
    layout = kv_layout(found.config) if found.config is not None else None
    source = found.source
    if found.config is not None and layout is None:
        source = f"{found.source} names no layers and attention heads vLLM would read"
    return KvInputs(
        layout=layout,
        layout_source=source,
        serve_dtype=args.dtype,
        tensor_parallel=args.tensor_parallel or 1,
        pipeline_parallel=args.pipeline_parallel or 1,
        gpu_totals=gpu_totals,
        host_total=host_total,
    )


# ------------------------------------------------------------------------------------- helpers


def _positional_model(args: list[str]) -> str | None:
    """`vllm serve MODEL`: the argument after `serve`, when it is not an option."""
    if "serve" not in args[:4]:
        return None
    rest = args[args.index("serve") + 1 :]
    return rest[0] if rest and not rest[0].startswith("-") else None


def _positive(value: str | None) -> int | None:
    try:
        number = int(value) if value is not None else None
    except ValueError:
        return None
    return number if number is not None and number > 0 else None


def _expand(path: str, env: Mapping[str, str]) -> PurePosixPath | None:
    """`~` is the target's HOME; a relative path cannot be placed without its cwd."""
    if path.startswith("~"):
        if "HOME" not in env:
            return None
        path = env["HOME"] + path[1:]
    return PurePosixPath(path) if path.startswith("/") else None


def _local_folder(name: str, cwd: str | None, env: Mapping[str, str]) -> PurePosixPath | None:
    """The folder `name` names in the target's filesystem, if it names one by its form."""
    if name.startswith(("/", "~")):
        return _expand(name, env)
    if cwd is not None and cwd.startswith("/"):
        return PurePosixPath(cwd) / name  # relative: vLLM resolves it from its working folder
    return None


def _hub_caches(
    env: Mapping[str, str], download_dir: str | None
) -> list[tuple[PurePosixPath, str]]:
    """huggingface_hub's cache folders in its order of precedence, then vLLM's --download-dir."""
    found: list[tuple[PurePosixPath, str]] = []
    candidates = [
        (env.get("HF_HUB_CACHE"), "", "HF_HUB_CACHE"),
        (env.get("HUGGINGFACE_HUB_CACHE"), "", "HUGGINGFACE_HUB_CACHE"),
        (env.get("HF_HOME"), "hub", "HF_HOME"),
        (env.get("XDG_CACHE_HOME"), "huggingface/hub", "XDG_CACHE_HOME"),
        ("~/.cache", "huggingface/hub", "the default cache of HOME"),
        (download_dir, "", "--download-dir"),
    ]
    for base, below, why in candidates:
        path = _expand(base, env) if base else None
        if path is not None and all(path / below != seen for seen, _ in found):
            found.append((path / below, why))
    return found


def _snapshot(root: Path, repo: PurePosixPath, revision: str) -> tuple[PurePosixPath | None, str]:
    """The snapshot folder of `revision` (a commit hash, or a ref such as `main`)."""
    snapshots = repo / "snapshots"
    if _HEX40.fullmatch(revision):
        if _inside(root, snapshots / revision).is_dir():
            return snapshots / revision, f"revision {revision[:12]}"
        return None, f"no snapshot {revision[:12]}"
    try:
        commit = (_inside(root, repo / "refs" / revision)).read_text().strip()
    except OSError:
        return None, f"no refs/{revision}"
    if not _HEX40.fullmatch(commit):
        return None, f"refs/{revision} holds {commit[:50]!r}, not a commit hash"
    return snapshots / commit, f"refs/{revision} -> {commit[:12]}"


def _inside(root: Path, path: PurePosixPath) -> Path:
    """`path` in the target's filesystem, seen from here through its `/proc/PID/root`."""
    return root / str(path).lstrip("/")


def _load(path: Path, how: str) -> ModelConfig:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return ModelConfig(None, f"no config.json in the {how}")
    except (OSError, ValueError) as error:
        return ModelConfig(None, f"cannot read config.json of the {how}: {error}")
    if not isinstance(data, dict):
        return ModelConfig(None, f"config.json of the {how} is not a JSON object")
    return ModelConfig(data, f"config.json of the {how}")

"""`targets:` in the config: the vLLM servers one daemon follows together
(sidecar/daemon/multi_target.py).
A list in the file only, like `custom_metrics`; validated once on load into frozen specs, each
error naming the entry, the key and the fix. Without it, `target:` names one server, as always;
`run --discover` on a host of several servers runs as `- discover: true` (daemon/choice.py).

    targets:
      - discover: true                      # every vLLM server found under target.proc_root
      - pid_file: /run/vllm/llama.pid       # one server, re-read on every rediscovery
        metrics_url: http://127.0.0.1:8001/metrics   # optional; default: from its --port
      - pid: 4242                           # one server by any of its PIDs
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.config import units
from sidecar.config.entries import mapping_entry
from sidecar.errors import ConfigError

KEYS = ("pid", "pid_file", "discover", "metrics_url")
EXAMPLE = "e.g. - {discover: true} or - {pid_file: /run/vllm.pid}"


@dataclass(frozen=True, slots=True)
class TargetSpec:
    """One entry: a PID, a pid file, or discovery (every server found)."""

    pid: int | None = None
    pid_file: Path | None = None
    discover: bool = False
    metrics_url: str | None = None  # None: the URL the server's flags imply

    def describe(self) -> str:
        if self.pid is not None:
            return f"pid {self.pid}"
        return f"pid file {self.pid_file}" if self.pid_file is not None else "discovery"


def parse_targets(raw: Any, where: str) -> tuple[TargetSpec, ...]:
    """The `targets` list as specs; ConfigError naming the entry and the fix."""
    if raw is None or raw == []:
        return ()  # the single `target:`, as before
    if not isinstance(raw, list):
        raise ConfigError(
            f"targets: is {units.kind_of(raw)} ({where}); give a list of entries, {EXAMPLE}"
        )
    specs = tuple(_spec(entry, i, where) for i, entry in enumerate(raw))
    if sum(s.discover for s in specs) > 1:
        raise ConfigError(f"targets: `discover: true` is given twice ({where}); once finds all")
    return specs


def _spec(entry: Any, i: int, where: str) -> TargetSpec:
    at = f"targets[{i}]"
    entry = mapping_entry(entry, at, where, KEYS, EXAMPLE)
    values: dict[str, Any] = {}
    for key, unit in (("pid", units.PID), ("pid_file", units.PATH), ("discover", units.BOOL),
                      ("metrics_url", units.URL)):  # fmt: skip
        if entry.get(key) is None:
            continue
        try:
            values[key] = unit.parse(entry[key])
        except units.Unfit as exc:
            raise ConfigError(f"{at}.{key}: {entry[key]!r} {exc}; {unit.hint} ({where})") from None
    spec = TargetSpec(**values)
    named = sum((spec.pid is not None, spec.pid_file is not None, spec.discover))
    if named != 1:
        raise ConfigError(
            f"{at}: give exactly one of pid, pid_file or discover: true ({where}), {EXAMPLE}"
        )
    if spec.discover and spec.metrics_url is not None:
        raise ConfigError(
            f"{at}: metrics_url names one server, discovery finds many ({where}); give it on a "
            "pid or pid_file entry, or leave it out (each server's URL comes from its --port)"
        )
    return spec

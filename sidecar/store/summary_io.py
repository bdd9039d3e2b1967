"""`summary.json` <-> `SnapshotSummary`: the one reader of every schema version written so far,
and the writer's JSON form.

pydantic validates the JSON against the typed records (and generates the published JSON Schema
from the same records), so a hand-edited or truncated summary is an `InputError` that names the
field, never a `KeyError` deep inside a report. It is imported by readers only: the daemon
writes summaries with `dataclasses.asdict` and never loads pydantic.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from sidecar.errors import InputError
from sidecar.records.summary import SCHEMA_VERSION, SnapshotSummary
from sidecar.store.layout import SUMMARY_NAME as SUMMARY_NAME  # its readers import it from here


def read_summary(path: Path) -> SnapshotSummary:
    """A snapshot folder's (or a summary.json file's) summary, of any schema version."""
    file = path / SUMMARY_NAME if path.is_dir() else path
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise InputError(
            f"no {SUMMARY_NAME} in {path}: point at a snapshot folder written by "
            "`vllm-sidecar snapshot` or `run`"
        ) from None
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read {file}: {exc}") from exc
    except RecursionError:  # JSON nested thousands deep (issue 26, item 16)
        raise InputError(f"cannot read {file}: nested too deep to be a summary") from None
    return parse_summary(data, str(file))


def parse_summary(data: Any, source: str = "summary") -> SnapshotSummary:
    """Upgrade `data` from the schema it was written with, then validate it into records."""
    if not isinstance(data, dict) or "phases" not in data:
        raise InputError(f"{source} is not a vllm-sidecar summary (no `phases`)")
    version = data.get("schema", 1)
    if not isinstance(version, int) or version < 1:
        raise InputError(f"{source}: `schema` is {version!r}, not a schema version")
    if version > SCHEMA_VERSION:
        raise InputError(
            f"{source} was written by a newer vllm-sidecar (schema {version}; this one reads "
            f"up to {SCHEMA_VERSION}): upgrade vllm-sidecar to read it"
        )
    for upgrade in UPGRADES[version - 1 :]:
        data = upgrade(data)
    try:
        return _adapter().validate_python(data)
    except ValidationError as exc:
        raise InputError(f"{source} does not hold a valid summary: {_first_error(exc)}") from None


def summary_json_schema() -> dict[str, Any]:
    """The published JSON Schema of the current version (configs/summary.schema.json)."""
    schema = _adapter().json_schema(mode="serialization")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": f"https://vllm-sidecar/summary.schema.v{SCHEMA_VERSION}.json",
        "title": f"vllm-sidecar snapshot summary, schema {SCHEMA_VERSION}",
        **schema,
    }


# ---------------------------------------------------------------------------------- versions


def _from_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 -> 2. Everything 1 wrote keeps its name and meaning except the KV cache's
    `bytes`: 1 took vLLM's configured budget when vLLM reported one (`kv_cache_memory_bytes`,
    `cpu_kvcache_space_bytes`), even where fewer blocks were allocated; 2 counts the blocks."""
    out = dict(data, schema=2)
    kv = data.get("kv_cache")
    if isinstance(kv, dict):
        out["kv_cache"] = _kv_from_v1(kv)
    return out


def _kv_from_v1(kv: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(kv)
    size, source = kv.get("bytes"), str(kv.get("source") or "")
    if "kv_cache_memory_bytes" in source or "cpu_kvcache_space_bytes" in source:
        out.update(budget_bytes=size, budget_bytes_per_gpu=size, budget_source=source,
                   caveats=["schema 1: the configured budget; the blocks vLLM allocated "
                            "were not counted"])  # fmt: skip
    elif size is not None:
        out.update(allocated_bytes=size, allocated_bytes_per_gpu=size)
    return out


def _from_v2(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 2 -> 3: nothing changes meaning; 2 kept no fingerprint, no deployment and no
    per-segment counts, and they stay absent (None, empty) rather than guessed."""
    return dict(data, schema=3)


def _from_v3(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 3 -> 4: 4 adds `custom` (the operator's own Prometheus series); 3 recorded none."""
    return dict(data, schema=4, custom=[])


def _from_v4(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 4 -> 5: 5 adds `threads` (each thread's samples against its /proc CPU time);
    4 measured none, and none is guessed."""
    return dict(data, schema=5, threads=[])


def _from_v5(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 5 -> 6: 6 adds the sampling mode, the sidecar's own CPU, each process's requested
    and achieved rates, and a triggered snapshot's `cause`. 5 was always the windows mode and
    measured none of the rest: left None and empty, not guessed."""
    return dict(data, schema=6)


def _from_v6(data: dict[str, Any]) -> dict[str, Any]:
    """Schema 6 -> 7: 7 adds each segment's counts per time slice (`parts`, `unit_s`); 6 kept
    the segments alone, and they stay the units."""
    return dict(data, schema=7)


# UPGRADES[n - 1] turns schema n into schema n + 1.
UPGRADES: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = (
    _from_v1,
    _from_v2,
    _from_v3,
    _from_v4,
    _from_v5,
    _from_v6,
)
assert len(UPGRADES) == SCHEMA_VERSION - 1, "every older schema needs its upgrade"


@cache
def _adapter() -> TypeAdapter[SnapshotSummary]:
    return TypeAdapter(SnapshotSummary)


def _first_error(exc: ValidationError) -> str:
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(p) for p in first["loc"]) or "(top level)"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"`{where}`: {first['msg']}{more}"

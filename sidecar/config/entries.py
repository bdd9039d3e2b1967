"""One entry of a list in the config file (`custom_metrics:`, `targets:`): a mapping with known
keys only. Each list checks its entries through `mapping_entry`, so the same mistake reads the
same in every list: the entry, what was found, and the fix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sidecar.config import units
from sidecar.errors import ConfigError


def mapping_entry(
    entry: Any, at: str, where: str, keys: Sequence[str], example: str
) -> Mapping[Any, Any]:
    """ENTRY, checked to be a mapping whose keys are all in KEYS; else a ConfigError naming the
    entry AT (e.g. `targets[2]`), the file or source WHERE, the unknown keys (all of them, so
    one edit fixes them) and the known ones, or EXAMPLE when it is no mapping at all."""
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{at}: is {units.kind_of(entry)} ({where}); give a mapping, {example}")
    unknown = sorted(str(k) for k in entry if k not in keys)
    if unknown:
        raise ConfigError(f"{at}: unknown keys {unknown} ({where}); known: {', '.join(keys)}")
    return entry

"""Where the tests find Prometheus and promtool: Debian's `prometheus` package (`make prometheus`
installs it without starting it), or the binaries scripts/validate-deploy.sh unpacked from the
same .deb into the validators' cache. None when neither is there: the tests skip with the fix."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

UNPACKED = (
    Path(os.environ.get("VLLM_SIDECAR_CACHE", Path.home() / ".cache" / "vllm-sidecar"))
    / "validators" / "debian" / "usr" / "bin"
)  # fmt: skip
MISSING = "{name} not found: run `make prometheus` (Debian's prometheus package, not started)"


def find(name: str) -> Path | None:
    """The `prometheus` or `promtool` binary, or None."""
    found = shutil.which(name)
    if found:
        return Path(found)
    unpacked = UNPACKED / name
    return unpacked if os.access(unpacked, os.X_OK) else None

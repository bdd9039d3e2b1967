"""vllm-sidecar: a profiling sidecar for vLLM servers.

The Python interface (`sidecar.api`) is loaded on first use, so `import sidecar` stays light:

    from sidecar import Profiler, load, snapshots
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from sidecar.version import CHECKOUT_VERSION

if TYPE_CHECKING:
    from sidecar.api import Profiler, Snapshot, load, snapshots

__version__ = CHECKOUT_VERSION
__all__ = ["Profiler", "Snapshot", "__version__", "load", "snapshots"]
_API = ("Profiler", "Snapshot", "load", "snapshots")


def __getattr__(name: str) -> Any:
    if name in _API:
        from sidecar import api

        return getattr(api, name)
    raise AttributeError(f"module 'sidecar' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The module's names and the lazily loaded API's, so `dir(sidecar)` and completion list
    `Profiler` before its first use."""
    return sorted({*globals(), *__all__})

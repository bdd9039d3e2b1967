"""What the daemon carries on through: a kind for each failure a window or a rediscovery can
meet, each counted, exported and logged once until it clears (STYLE.md 7).

Decided in one place: `classify` says which exceptions out of a window are data (a kind) and
which are bugs (None: the daemon ends, `cli.main` prints the traceback and exits 70);
`reading_failures` reads the failures a snapshot already holds as data.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from sidecar.errors import AttachError, SamplerError, SidecarError
from sidecar.gpu.nvml import NvmlError
from sidecar.records.gpu import GpuMode
from sidecar.target.discovery import AmbiguousTarget
from sidecar.vllm_metrics import ScrapeError
from sidecar.vllm_metrics.endpoint import MetricsUrlError
from sidecar.window.snapshot import Snapshot

log = logging.getLogger("vllm_sidecar")


class WindowFailure(StrEnum):
    DISCOVERY_AMBIGUOUS = "discovery_ambiguous"  # more than one vLLM server found
    METRICS_URL = "metrics_url"  # vLLM's flags name no reachable /metrics (--uds, bad --port)
    METRICS_SCRAPE = "metrics_scrape"  # /metrics refused, garbage, or not vLLM's
    NVML = "nvml"  # NVML failed to start or to answer this window
    SAMPLER = "sampler"  # py-spy failed, sampled nothing, or ignored SIGINT and was killed
    WRITE = "write"  # the snapshot was not written (disk low, permissions)
    READER = "reader"  # another reader of the window (/proc, psutil) raised an OS error


# Checked by every window that produced a snapshot: a kind not seen in one has cleared.
WINDOW_KINDS = frozenset(WindowFailure) - {WindowFailure.DISCOVERY_AMBIGUOUS}
# Kinds whose own module logs each change already (the store, once per change of disk state).
_LOGGED_ELSEWHERE = frozenset({WindowFailure.WRITE})

# Exceptions out of a window that are data, most specific first.
_RAISED: tuple[tuple[type[BaseException], WindowFailure], ...] = (
    (NvmlError, WindowFailure.NVML),
    (MetricsUrlError, WindowFailure.METRICS_URL),
    (ScrapeError, WindowFailure.METRICS_SCRAPE),
    (AmbiguousTarget, WindowFailure.DISCOVERY_AMBIGUOUS),
    (AttachError, WindowFailure.SAMPLER),
    (SamplerError, WindowFailure.SAMPLER),
    (OSError, WindowFailure.READER),
    (SidecarError, WindowFailure.READER),
)


@dataclass(frozen=True, slots=True)
class Failure:
    kind: WindowFailure
    reason: str


def classify(error: BaseException) -> WindowFailure | None:
    """The kind of an exception out of a window; None for a bug, which ends the daemon."""
    return next((kind for cls, kind in _RAISED if isinstance(error, cls)), None)


def reading_failures(snapshot: Snapshot) -> list[Failure]:
    """The failures a snapshot records as data: py-spy's own, and NVML's (no GPU at all, CPU
    mode, is none)."""
    found = []
    if snapshot.window.sampler_failure is not None:
        found.append(Failure(WindowFailure.SAMPLER, snapshot.window.sampler_failure))
    gpu = snapshot.readings.gpu
    if gpu is not None and gpu.mode is GpuMode.UNAVAILABLE:
        found.append(Failure(WindowFailure.NVML, gpu.reason or "NVML unavailable"))
    elif gpu is not None and gpu.errors:
        found.append(Failure(WindowFailure.NVML, "; ".join(gpu.errors[:3])))
    return found


class FailureTally:
    """Counts failures by kind; logs a kind when it starts failing and when it clears, not on
    every window in between. `on_change` hears the counts (the exporter's state)."""

    def __init__(self, on_change: Callable[[Mapping[str, int]], None] = lambda counts: None):
        self._counts = {kind.value: 0 for kind in WindowFailure}
        self._failing: set[WindowFailure] = set()
        self._on_change = on_change
        on_change(dict(self._counts))  # every kind from 0: a counter born late hides its start

    @property
    def counts(self) -> Mapping[str, int]:
        return dict(self._counts)

    @property
    def failing(self) -> frozenset[WindowFailure]:
        return frozenset(self._failing)

    def failed(self, failure: Failure) -> None:
        self._counts[failure.kind.value] += 1
        if failure.kind not in self._failing and failure.kind not in _LOGGED_ELSEWHERE:
            log.warning("%s failure: %s; carrying on (logged again once it has cleared)",
                        failure.kind.value, failure.reason)  # fmt: skip
        self._failing.add(failure.kind)
        self._on_change(dict(self._counts))

    def cleared(self, kind: WindowFailure) -> None:
        if kind in self._failing:
            self._failing.discard(kind)
            if kind not in _LOGGED_ELSEWHERE:
                log.info("%s: working again", kind.value)

    def settle(self, failures: Iterable[Failure], checked: Iterable[WindowFailure]) -> None:
        """One window's failures; the `checked` kinds it did not fail have cleared."""
        seen: set[WindowFailure] = set()
        for failure in failures:
            if failure.kind not in seen:  # a kind counts once a window, whoever noticed it
                self.failed(failure)
                seen.add(failure.kind)
        for kind in set(checked) - seen:
            self.cleared(kind)

"""GPU utilisation through the window, not only at its two ends.

NVML's utilisation is the share of the driver's last sample period (1/6 s to 1 s, by card)
with a kernel running: a reading at each end of a 10-minute window says little about the
minutes between. `UtilizationPoller` asks for it at a low rate (1 Hz by default) on a thread,
through `NvmlReader.read_utilization` (so through the reader's one NVML wrapper and its error
policy), on absolute deadlines of an injected monotonic clock, and sums it up per GPU when the
window ends. The clock and the wait are injected so tests run the loop without a thread or a
real second passing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

from sidecar.gpu.reader import NvmlReader
from sidecar.records.gpu import DEFAULT_INTERVAL_S, GpuUtilization

log = logging.getLogger("vllm_sidecar.gpu")

Poll = tuple[float, Mapping[str, int | None]]  # (monotonic time, utilisation by GPU label)


class UtilizationPoller:
    """Polls every GPU's utilisation every `interval_s` between `start()` and `stop()`."""

    def __init__(
        self,
        reader: NvmlReader,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
        wait: Callable[[float], bool] | None = None,
    ) -> None:
        self._reader = reader
        self._interval = interval_s
        self._clock = clock
        self._stop = threading.Event()
        # wait(seconds) sleeps up to `seconds` and answers True when polling should end.
        self._wait = wait if wait is not None else self._stop.wait
        self._thread: threading.Thread | None = None
        self._polls: list[Poll] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="gpu-utilization", daemon=True)
        self._thread.start()

    def stop(self) -> tuple[GpuUtilization, ...]:
        """End polling (waiting for the poll in flight) and sum up the window."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10 * self._interval + 5)
            if self._thread.is_alive():
                log.warning("the GPU utilisation poller did not stop; its figures may be short")
        return self.summary()

    def run(self) -> None:
        """The loop: poll, then wait to the next absolute deadline; late polls are skipped,
        not bunched (STYLE.md 8). It polls once even when stopped before it began, so a
        window shorter than the interval still has a sample from inside it."""
        deadline = self._clock()
        while True:
            self.poll_once()
            deadline += self._interval
            now = self._clock()
            if now > deadline:  # a slow poll: skip the deadlines already past
                deadline += self._interval * ((now - deadline) // self._interval + 1)
            if self._stop.is_set() or self._wait(deadline - now):
                return

    def poll_once(self) -> None:
        try:
            values = self._reader.read_utilization()
        except Exception:  # a thread must not die silently: say it, and poll again
            log.exception("GPU utilisation poll failed")
            return
        self._polls.append((self._clock(), values))

    def summary(self) -> tuple[GpuUtilization, ...]:
        polls = list(self._polls)
        labels = sorted({label for _, values in polls for label in values}, key=_gpu_order)
        return tuple(self._one(label, polls) for label in labels)

    def _one(
        self, label: str, polls: list[tuple[float, Mapping[str, int | None]]]
    ) -> GpuUtilization:
        seen = [(at, values[label]) for at, values in polls if label in values]
        answered = [(at, pct) for at, pct in seen if pct is not None]
        pcts = [pct for _, pct in answered]
        return GpuUtilization(
            label=label,
            samples=len(pcts),
            mean_pct=sum(pcts) / len(pcts) if pcts else None,
            min_pct=min(pcts) if pcts else None,
            max_pct=max(pcts) if pcts else None,
            missed=len(seen) - len(pcts),
            interval_s=self._interval,
            first_at=answered[0][0] if answered else None,
            last_at=answered[-1][0] if answered else None,
        )


def _gpu_order(label: str) -> tuple[int, str]:
    digits = label.removeprefix("gpu")
    return (int(digits), label) if digits.isdigit() else (1 << 30, label)

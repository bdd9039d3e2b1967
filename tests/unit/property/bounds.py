"""Per-case bounds for the property tests of issue 26: a hang or a blow-up in one example is a
failing test that names the example, never a stuck suite.

Each example runs inside `bounded()`:
- time: CPU_LIMIT_S seconds of CPU (an ITIMER_PROF alarm), the bound that means something: CPU
  time, so two shared cores busy with other work do not trip it, and cases take milliseconds.
  The alarm raises inside the call, even inside a regular expression (CPython's `re` checks for
  signals while it matches), so a case that would never end fails there, naming its input,
  rather than stalling the suite. WALL_LIMIT_S of wall clock (ITIMER_REAL) does the same for a
  case that blocks without using CPU. Hypothesis's `deadline` (wall clock, checked after each
  example returns) reports a slow case, shrinks it and replays it; it is generous, for cores
  shared with other work;
- memory: the peak tracemalloc sees during the call, above what was allocated when it started.

Profiles: `sidecar-bounds` (the default; CI) is derandomized and keeps no example database, so a
run is reproducible and a failure seen once is seen again; `SIDECAR_HYPOTHESIS_PROFILE=
sidecar-bounds-explore` searches at random, ten times as many examples, and keeps what it finds in
`.hypothesis/` (git-ignored) to replay next time.
"""

from __future__ import annotations

import os
import signal
import threading
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from types import FrameType

import pytest
from hypothesis import HealthCheck, settings

DEADLINE = timedelta(seconds=5)  # per example, wall clock; cases take milliseconds of CPU
CPU_LIMIT_S = 2.0  # per example, CPU time (user + system): raised inside the call
WALL_LIMIT_S = 20.0  # per example, wall clock: raised inside the call
PEAK_LIMIT = 64 * 2**20  # per example, bytes allocated at the peak (tracemalloc)
_ALARMS = ((signal.ITIMER_PROF, signal.SIGPROF), (signal.ITIMER_REAL, signal.SIGALRM))

settings.register_profile(
    "sidecar-bounds",
    deadline=DEADLINE,
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile(
    "sidecar-bounds-explore",
    settings.get_profile("sidecar-bounds"),
    derandomize=False,
    database=settings.get_profile("default").database,
)
PROFILE = os.environ.get("SIDECAR_HYPOTHESIS_PROFILE", "sidecar-bounds")
_SCALE = 10 if PROFILE.endswith("-explore") else 1


def cases(max_examples: int) -> settings:
    """The settings of one property: the chosen profile with MAX_EXAMPLES examples (times ten
    when exploring)."""
    return settings(settings.get_profile(PROFILE), max_examples=max_examples * _SCALE)


class _Expired(BaseException):
    """Raised by an alarm inside the call: a BaseException, so that no `except Exception` in
    the code under test can swallow it; `bounded` turns it into a test failure."""


@contextmanager
def bounded(
    what: str,
    *,
    cpu_s: float = CPU_LIMIT_S,
    wall_s: float = WALL_LIMIT_S,
    peak_bytes: int = PEAK_LIMIT,
) -> Iterator[None]:
    """Fails the test (pytest.fail, which hypothesis shrinks and reports like an assertion) when
    the body uses more than CPU_S seconds of CPU or WALL_S seconds, or allocates more than
    PEAK_BYTES at its peak. WHAT names the case in the failure."""
    guarded = threading.current_thread() is threading.main_thread()  # signals: main thread only
    expired: list[str] = []
    running = [True]

    def expire(signum: int, frame: FrameType | None) -> None:
        if running[0]:  # an alarm that fires once the body is over is dropped
            expired.append("CPU time" if signum == signal.SIGPROF else "wall-clock time")
            raise _Expired

    previous = [signal.signal(number, expire) for _, number in _ALARMS] if guarded else []
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    try:
        if guarded:
            signal.setitimer(signal.ITIMER_PROF, cpu_s)
            signal.setitimer(signal.ITIMER_REAL, wall_s)
        try:
            yield
        finally:
            running[0] = False
    except _Expired:
        pass  # `expired` says which alarm
    finally:
        if guarded:
            for (timer, number), handler in zip(_ALARMS, previous, strict=True):
                signal.setitimer(timer, 0)
                signal.signal(number, handler)
        peak = tracemalloc.get_traced_memory()[1] - base
        if not tracing:
            tracemalloc.stop()
    if expired:
        limit = cpu_s if expired[0] == "CPU time" else wall_s
        pytest.fail(f"{what}: over {limit:g} s of {expired[0]}: a hang", pytrace=False)
    if peak > peak_bytes:
        pytest.fail(
            f"{what}: {peak / 2**20:.0f} MiB allocated at the peak, over the "
            f"{peak_bytes / 2**20:.0f} MiB bound",
            pytrace=False,
        )

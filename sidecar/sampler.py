"""py-spy against a process tree, in windows, with its own sample/error counts and CPU cost kept.

The py-spy process is the OS boundary: `PySpyRunner` is injected, so the sampling loop is tested
on recorded py-spy output, and the real runner is tested against real processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from sidecar.errors import AttachError, SamplerError
from sidecar.parsers import parse_raw
from sidecar.records import StackSample

PTRACE_HELP = (
    "py-spy was refused ptrace access to process {pid}. Run the sidecar as root or give it "
    "CAP_SYS_PTRACE (systemd: AmbientCapabilities=CAP_SYS_PTRACE; Docker: cap_add: [SYS_PTRACE] "
    'and share vLLM\'s PID namespace with pid: "service:vllm"), and check '
    "/proc/sys/kernel/yama/ptrace_scope: 0 or 1 lets a privileged tracer attach, 2 needs "
    "CAP_SYS_PTRACE, 3 forbids attaching until reboot (sysctl kernel.yama.ptrace_scope=1)."
)
# What py-spy says, all of it: `record` without --capture prints its status lines ("py-spy>
# Sampling process 5 times a second", "... Samples: 1200 Errors: 0", "1.04s behind in
# sampling", "Stopped sampling because process exited") on *stdout*, its errors on stderr.
_SAMPLING = "Sampling process"
_COUNTS = re.compile(r"Samples:\s*(\d+)\s+Errors:\s*(\d+)")
# The lateness when py-spy cannot keep up (CPU starved); it then takes the missed samples in a
# burst as soon as it runs again, so a late window over-weights what came after the stall.
_BEHIND = re.compile(r"([\d.]+)s behind in sampling")
_PR_SET_PDEATHSIG = 1  # prctl(2)
LATE_S = 1.0  # py-spy reports lateness from 1 s on
# How long py-spy may take to attach before the window is given up on (it then ends partial).
ATTACH_GRACE_S = 30.0


@dataclass(frozen=True, slots=True)
class RecordRequest:
    pid: int
    rate_hz: float
    duration_s: float
    subprocesses: bool = True
    blocking: bool = False  # py-spy --nonblocking by default: never pause vLLM
    native: bool = False
    idle: bool = True  # idle threads are a phase of their own, not noise


@dataclass(frozen=True, slots=True)
class RecordOutcome:
    """One py-spy run: its raw output, its own counts, its CPU cost and how it ended."""

    raw: str
    returncode: int
    output: str  # py-spy's stdout and stderr, interleaved as written
    samples: int | None
    errors: int | None
    cpu_s: float
    wall_s: float
    target_exited: bool
    behind_s: float = 0.0  # the most py-spy fell behind its schedule
    attach_s: float = 0.0  # from launch until py-spy said it was sampling


class PySpyRunner(Protocol):
    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome: ...


@dataclass(frozen=True, slots=True)
class SubprocessPySpy:
    """Runs the real py-spy binary. Stops it with SIGINT at the deadline, so py-spy writes out
    what it has: the same path a SIGTERM of the sidecar takes to cut a window short."""

    binary: str
    poll_s: float = 0.2  # deadline precision; each wake-up costs the sidecar CPU
    # Called (from a reader thread) when py-spy says it is sampling, with the seconds its
    # attach took: the CLI tells the operator, since on a busy host that can take a while.
    on_sampling: Callable[[RecordRequest, float], None] | None = None

    @classmethod
    def find(cls, explicit: str | None = None) -> SubprocessPySpy:
        candidates = (
            [explicit]
            if explicit
            else [
                shutil.which("py-spy"),
                str(Path(sys.executable).with_name("py-spy")),
            ]
        )
        for c in candidates:
            if c and os.access(c, os.X_OK):
                return cls(binary=c)
        raise SamplerError(
            "py-spy not found"
            + (f" at {explicit}" if explicit else " on PATH or beside this Python")
            + ": install it with `pip install py-spy` (a dependency of vllm-sidecar) "
            "or pass --py-spy /path/to/py-spy"
        )

    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        with tempfile.TemporaryDirectory(prefix="vllm-sidecar-") as tmp:
            out = Path(tmp) / "raw.txt"
            started = time.monotonic()
            proc = subprocess.Popen(
                self._argv(request, out),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
                # Its own session: a terminal's Ctrl-C reaches the sidecar alone, which stops
                # py-spy itself; and where the kernel groups sessions for scheduling
                # (autogroup, outside systemd and containers) py-spy is not starved with them.
                start_new_session=True,
            )
            notify = self.on_sampling
            watch = _OutputWatch(
                proc, None if notify is None else lambda at: notify(request, at - started)
            )
            status, usage = self._wait(proc, watch, started, request.duration_s, stop)
            output = watch.text()
            raw = out.read_text(errors="replace") if out.exists() else ""
        counts = _COUNTS.search(output)
        return RecordOutcome(
            raw=raw,
            returncode=os.waitstatus_to_exitcode(status),
            output=output,
            samples=int(counts[1]) if counts else None,
            errors=int(counts[2]) if counts else None,
            cpu_s=usage.ru_utime + usage.ru_stime,
            wall_s=time.monotonic() - (watch.sampling_since or started),
            attach_s=(watch.sampling_since or time.monotonic()) - started,
            target_exited="process exited" in output,
            behind_s=max((float(m) for m in _BEHIND.findall(output)), default=0.0),
        )

    def _argv(self, r: RecordRequest, out: Path) -> list[str]:
        # py-spy takes whole samples per second only (`--rate 2.5` is refused).
        argv = [self.binary, "record", "--pid", str(r.pid), "--rate", str(whole_rate(r.rate_hz))]
        # A safety net: py-spy ends by itself shortly after the deadline even if the sidecar
        # is killed before it can send SIGINT (it would stay attached to vLLM otherwise).
        argv += ["--duration", str(math.ceil(r.duration_s) + 5)]
        argv += ["--format", "raw", "--output", str(out), "--threads"]
        argv += ["--subprocesses"] * r.subprocesses + ["--idle"] * r.idle
        argv += ["--native"] * r.native + ([] if r.blocking else ["--nonblocking"])
        return argv

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        watch: _OutputWatch,
        started: float,
        duration_s: float,
        stop: Callable[[], bool],
    ) -> tuple[int, resource.struct_rusage]:
        """Wait for py-spy and SIGINT it once it has *sampled* for `duration_s`: attaching to
        a tree of busy processes can take seconds on a loaded host, and that time is not part
        of the window. os.wait4 gives py-spy's own CPU usage."""
        interrupted = False
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid == proc.pid:
                proc.returncode = os.waitstatus_to_exitcode(status)
                watch.join()
                return status, usage
            since = watch.sampling_since
            deadline = since + duration_s if since else started + duration_s + ATTACH_GRACE_S
            if not interrupted and (time.monotonic() >= deadline or stop()):
                proc.send_signal(signal.SIGINT)
                interrupted = True
            time.sleep(self.poll_s)


class _OutputWatch:
    """Reads py-spy's output as it comes: notes when sampling starts, keeps the text."""

    def __init__(
        self, proc: subprocess.Popen[bytes], on_start: Callable[[float], None] | None = None
    ) -> None:
        self.sampling_since: float | None = None
        self._on_start = on_start
        self._lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.stdout is None:
            return
        with proc.stdout:
            for raw in proc.stdout:
                line = raw.decode(errors="replace")
                if self.sampling_since is None and _SAMPLING in line:
                    self.sampling_since = time.monotonic()
                    if self._on_start is not None:
                        self._on_start(self.sampling_since)
                self._lines.append(line)

    def join(self) -> None:
        self._thread.join(timeout=5)

    def text(self) -> str:
        return "".join(self._lines)


def whole_rate(rate_hz: float) -> int:
    """The rate py-spy is given: whole samples per second, at least 1."""
    return max(1, round(rate_hz))


def _die_with_parent() -> None:
    """In the py-spy child, before exec: SIGTERM it when the sidecar dies (kill -9 included)."""
    with contextlib.suppress(OSError, AttributeError):  # not Linux: --duration still ends it
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


# ---------------------------------------------------------------------------------- windows


@dataclass(frozen=True, slots=True)
class Window:
    """The stacks of one sampling window, aggregated (stack -> count)."""

    started_at: float  # wall clock (Unix seconds), for the snapshot's name and humans
    duration_s: float
    rate_hz: float
    stacks: tuple[StackSample, ...]
    samples: int
    errors: int
    sampler_cpu_s: float
    segments: int
    partial: bool = False
    partial_reason: str | None = None
    warnings: tuple[str, ...] = ()
    behind_s: float = 0.0  # the most py-spy fell behind its sampling schedule


@dataclass
class RateController:
    """Adapts the sampling rate so py-spy stays within `budget` of one core.

    py-spy's cost grows with rate x processes x stack depth (about 1 ms of CPU per
    process-sample measured on vLLM here), so it is measured, not assumed: after each segment
    the CPU per tick is known and the next rate is budget / (CPU per tick).
    """

    rate_hz: float
    budget: float | None = None  # share of one core, e.g. 0.02
    min_hz: float = 1.0  # py-spy's lowest rate: it takes whole samples per second
    max_hz: float = 100.0

    def update(self, cpu_s: float, wall_s: float, behind_s: float = 0.0) -> float:
        if self.budget is None or wall_s <= 0 or cpu_s <= 0:
            return self.rate_hz
        cpu_per_tick = cpu_s / (self.rate_hz * wall_s)
        wanted = self.budget / cpu_per_tick
        if behind_s >= LATE_S:  # starved of CPU: within budget or not, ask for less
            wanted = min(wanted, self.rate_hz / 2)
        # Move at most 2x per segment: one noisy segment must not swing the rate wildly.
        wanted = min(max(wanted, self.rate_hz / 2), self.rate_hz * 2)
        self.rate_hz = float(whole_rate(min(max(wanted, self.min_hz), self.max_hz)))
        return self.rate_hz


@dataclass
class Sampler:
    """Samples one process tree for a window, in segments so the rate can adapt between them."""

    runner: PySpyRunner
    pid: int
    controller: RateController
    segment_s: float = 10.0
    alive: Callable[[], bool] = field(default=lambda: True)
    clock: Callable[[], float] = time.monotonic
    wall_clock: Callable[[], float] = time.time
    fail_fast: bool = True  # the daemon clears it after its first good window

    def window(self, duration_s: float, stop: Callable[[], bool] = lambda: False) -> Window:
        started_at, start = self.wall_clock(), self.clock()
        counts: Counter[StackSample] = Counter()
        totals = {"samples": 0, "errors": 0, "cpu": 0.0, "segments": 0, "behind": 0.0}
        rates: list[float] = []
        warnings: list[str] = []
        reason: str | None = None
        sampled = 0.0  # seconds py-spy actually sampled: its attach time is not the window's
        give_up = start + duration_s + ATTACH_GRACE_S
        while (left := duration_s - sampled) > 0.05 and self.clock() < give_up and not stop():
            outcome = self._segment(min(left, self.segment_s), stop, first=not totals["segments"])
            sampled += outcome.wall_s
            rates.append(self.controller.rate_hz)
            _add(counts, outcome, totals, warnings)
            self.controller.update(outcome.cpu_s, outcome.wall_s, outcome.behind_s)
            reason = _partial_reason(outcome, self.alive)
            if reason:
                break
        if stop() and reason is None and sampled < duration_s - 0.05:
            reason = "stopped before the window ended (signal)"
        if totals["behind"] >= LATE_S:
            warnings.append(
                f"py-spy fell {totals['behind']:.1f} s behind (starved of CPU) and took the missed "
                "samples in a burst when it ran again: shares lean towards what followed the "
                "stall. Lower the rate, or raise the sidecar's CPU weight (systemd: CPUWeight=)"
            )
        if reason is None and totals["samples"] == 0:
            reason = "no samples: py-spy did not attach within the window (a loaded host?)"
        return Window(
            started_at=started_at,
            duration_s=sampled,
            rate_hz=sum(rates) / len(rates) if rates else self.controller.rate_hz,
            stacks=tuple(replace(s, weight=n) for s, n in counts.items()),
            samples=int(totals["samples"]),
            errors=int(totals["errors"]),
            sampler_cpu_s=float(totals["cpu"]),
            segments=int(totals["segments"]),
            partial=reason is not None,
            partial_reason=reason,
            warnings=tuple(warnings),
            behind_s=float(totals["behind"]),
        )

    def _segment(self, seconds: float, stop: Callable[[], bool], first: bool) -> RecordOutcome:
        request = RecordRequest(pid=self.pid, rate_hz=self.controller.rate_hz, duration_s=seconds)
        outcome = self.runner.record(request, stop)
        if first and self.fail_fast and outcome.returncode != 0 and not outcome.raw:
            # Nothing sampled at all in the first window: a failed start is fatal (STYLE.md 7).
            # Later failures are data: the window is kept, partial, with py-spy's reason.
            raise explain_failure(self.pid, outcome.output)
        return outcome


def _add(
    counts: Counter[StackSample],
    outcome: RecordOutcome,
    totals: dict[str, float],
    warnings: list[str],
) -> None:
    parsed = parse_raw(outcome.raw, source="py-spy record")
    for stack in parsed.stacks:
        counts[replace(stack, weight=1, source=None)] += stack.weight
    if outcome.samples is None:
        totals["samples"] += sum(s.weight for s in parsed.stacks)
    else:
        totals["samples"] += outcome.samples
    totals["errors"] += outcome.errors or 0
    totals["cpu"] += outcome.cpu_s
    totals["segments"] += 1
    totals["behind"] = max(totals["behind"], outcome.behind_s)
    warnings.extend(parsed.warnings[:5])


def _partial_reason(outcome: RecordOutcome, alive: Callable[[], bool]) -> str | None:
    if (
        outcome.target_exited
        or not alive()
        or "no python processes found" in outcome.output.lower()
    ):
        return "the target exited during the window; the samples taken before are kept"
    if outcome.returncode != 0:
        why = _last_line(outcome.output) or "stopped before it had attached (a loaded host?)"
        return f"py-spy stopped early (exit {outcome.returncode}): {why}"
    return None


def explain_failure(
    pid: int, output: str, ptrace_refused: Callable[[int], bool] | None = None
) -> AttachError | SamplerError:
    """Turn py-spy's error text into an error that names the fix."""
    text = output.lower()
    refused = ptrace_refused or _ptrace_refused
    # With --subprocesses py-spy reports a process it may not trace as "No python processes
    # found" (or says nothing if stopped while it retries): ask the kernel ourselves.
    if "permission denied" in text or "operation not permitted" in text or refused(pid):
        return AttachError(PTRACE_HELP.format(pid=pid))
    if "failed to get process executable name" in text or "no such process" in text:
        return AttachError(
            f"process {pid} is gone (py-spy could not open it): check the PID, or use --discover"
        )
    if "python" in text and ("failed to find" in text or "version" in text or "no python" in text):
        return AttachError(
            f"process {pid} does not look like a Python process to py-spy ({_last_line(output)}): "
            "point --pid at the vLLM API server, EngineCore or worker"
        )
    return SamplerError(f"py-spy failed on process {pid}: {_last_line(output) or 'no message'}")


def _ptrace_refused(pid: int) -> bool:
    """py-spy reads /proc of its own PID namespace, so this asks the same /proc it does."""
    try:
        os.readlink(f"/proc/{pid}/exe")  # needs ptrace read access, as attaching does
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "py-spy>" not in ln]
    errors = [ln for ln in lines if ln.startswith("Error")]
    return (errors or lines or [""])[0]

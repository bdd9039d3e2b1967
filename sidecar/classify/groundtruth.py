"""Each sampled thread's samples against its own CPU time from /proc: the window's ground truth.

Sampling can be biased: py-spy's non-blocking reads fail more often while a thread runs (a
running thread changes its frames under the reader), a sampler starved of CPU misses the same
moments as its target, and an event loop that runs its work in C (uvloop: socket I/O, HTTP
parsing, response writes) leaves only the loop's own `Runner.run` as the Python leaf, which the
rules call `idle`. The kernel's count of the thread's CPU time has none of these biases, so for
every sampled thread the snapshot keeps both:

    busy share   samples outside `idle` / samples, with its Wilson score interval (z = 2.576)
    CPU share    (utime + stime) over the window / the window's seconds, from
                 /proc/PID/task/TID/stat (one clock tick of resolution at each end)

and flags a thread whose CPU share lies outside the interval (widened by the two ticks).
Consecutive samples of a thread are correlated, so the binomial interval is narrower than the
truth; z = 2.576 (a two-sided 99 % interval) rather than 1.96 keeps false flags rare.
A thread that waits by spinning (vLLM's shared-memory queue yields in a loop) uses CPU while it
waits: its CPU time cannot tell work from waiting, so it is kept but not compared.
Pure functions over records; the /proc reads are `ProcFs.thread_times` (injected).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from sidecar.classify.aggregate import LabelledStack
from sidecar.classify.rules import WaitFrames
from sidecar.records import Phase, Role, StackSample
from sidecar.records.readings import ThreadCpu, ThreadTime
from sidecar.records.summary import Agreement, ThreadCheck

Z = 2.576  # two-sided 99 % (see the module's docstring)
TICKS_OF_SLACK = 2  # one clock tick of resolution at each end of the window
WAITING_PHASES = frozenset({Phase.MODEL_WAIT, Phase.GPU_WAIT, Phase.COMMUNICATION})
LOOP_MAJORITY = 0.5  # of a thread's samples, for the event loop to be the reason
FAILED_READS_NOTABLE = 0.1  # of a thread's reads, for failed reads to be the reason


def wilson(k: int, n: int, z: float = Z) -> tuple[float, float]:
    """The Wilson score interval of the proportion k / n (n > 0)."""
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return max(centre - half, 0.0), min(centre + half, 1.0)


def cpu_over_window(
    start: Iterable[ThreadTime], end: Iterable[ThreadTime], span_s: float
) -> tuple[ThreadCpu, ...]:
    """Each thread's CPU seconds between two reads, for the threads both reads saw. A thread
    born between them is left out as one that ended before the second read: its CPU time
    covers only part of the window while its samples cover only that part too, so the two
    shares would not be of the same span (it is kept, not compared)."""
    before = {(t.pid, t.tid): t for t in start}
    out = []
    for t in end:
        first = before.get((t.pid, t.tid))
        if first is None:
            continue
        used = t.cpu_s - first.cpu_s
        out.append(ThreadCpu(t.pid, t.tid, t.comm, max(used, 0.0), span_s, t.resolution_s))
    return tuple(out)


@dataclass
class _Thread:
    """What the window's stacks say of one thread."""

    role: Role = Role.OTHER
    name: str | None = None
    samples: int = 0
    frameless: int = 0
    busy: int = 0
    spinning: int = 0
    loop_leaf: int = 0
    waiting: Counter[str] | None = None
    busy_leaves: Counter[str] | None = None  # non-idle samples by their innermost frame


def thread_checks(
    labelled: Iterable[LabelledStack],
    stacks: Iterable[StackSample],
    cpu: Iterable[ThreadCpu],
    frames: WaitFrames,
) -> tuple[ThreadCheck, ...]:
    """One check per sampled thread (pid, tid), in pid and tid order; () when /proc was not
    read at all (a window replayed from recorded stacks measures no CPU). FRAMES: the rules
    file's spinning waits and event-loop leaves (`ground_truth:` in configs/phases.yaml)."""
    measured = {(c.pid, c.tid): c for c in cpu}
    if not measured:
        return ()
    threads = _threads(labelled, stacks, frames)
    reads = _expected_reads(threads)
    return tuple(
        _check(key, t, measured.get(key), reads.get(key[0], 0))
        for key, t in sorted(threads.items())
    )


def _threads(
    labelled: Iterable[LabelledStack], stacks: Iterable[StackSample], frames: WaitFrames
) -> dict[tuple[int, int], _Thread]:
    out: dict[tuple[int, int], _Thread] = defaultdict(_Thread)
    for ls in labelled:
        key = _key(ls.stack)
        if key is None:
            continue
        t, n, label = out[key], ls.stack.weight, ls.label
        t.role, t.name = label.role, ls.stack.thread_name or t.name
        t.samples += n
        if label.phase is not Phase.IDLE:
            t.busy += n
            leaf = ls.stack.frames[0].label()
            t.busy_leaves = (t.busy_leaves or Counter()) + Counter({leaf: n})
        if label.phase in WAITING_PHASES:
            t.waiting = (t.waiting or Counter()) + Counter({label.phase.value: n})
        if frames.spins(ls.stack.frames):
            t.spinning += n
        python_leaf = next((f for f in ls.stack.frames if not f.native), None)
        if label.phase is Phase.IDLE and python_leaf and frames.loop_leaf(python_leaf):
            t.loop_leaf += n  # the loop runner as the Python leaf (a --native stack has C below)
    for stack in stacks:
        key = _key(stack)
        if key is not None and not stack.frames:
            out[key].frameless += stack.weight
    return dict(out)


def _key(stack: StackSample) -> tuple[int, int] | None:
    if stack.pid is None or stack.thread_id is None or not stack.thread_id.isdigit():
        return None  # py-spy names native thread ids in decimal with --threads
    return stack.pid, int(stack.thread_id)


def _expected_reads(threads: Mapping[tuple[int, int], _Thread]) -> dict[int, int]:
    """Per process, the reads of its best-read thread: what every thread of it was due (py-spy
    reads all of a process's threads at each tick; a read that failed outright leaves no stack)."""
    out: dict[int, int] = {}
    for (pid, _tid), t in threads.items():
        out[pid] = max(out.get(pid, 0), t.samples + t.frameless)
    return out


def _check(key: tuple[int, int], t: _Thread, cpu: ThreadCpu | None, due: int) -> ThreadCheck:
    # a thread alive over the whole window was due every read of its process: the reads that
    # left it frameless or with no stack failed; of one born or ended inside it, only its
    # frameless reads are known to have failed
    failed = max(due - t.samples, 0) if cpu is not None else t.frameless
    busy_share = t.busy / t.samples if t.samples else None
    low, high = wilson(t.busy, t.samples) if t.samples else (None, None)
    base = ThreadCheck(
        pid=key[0], tid=key[1], role=t.role, name=t.name or (cpu.comm if cpu else None),
        samples=t.samples, failed_reads=failed, busy_samples=t.busy,
        busy_share=_r(busy_share), busy_low=_r(low), busy_high=_r(high),
        cpu_s=round(cpu.cpu_s, 3) if cpu else None, cpu_share=_r(cpu.share if cpu else None),
    )  # fmt: skip
    share = cpu.share if cpu else None
    if cpu is None or share is None:
        return _with(base, Agreement.UNMEASURED, "not read from /proc at both ends of the "
                     "window (started or ended inside it, or not readable)")  # fmt: skip
    if busy_share is None or low is None or high is None:
        return _with(base, Agreement.UNMEASURED, f"no read of it had a frame ({failed} "
                     "failed): nothing to compare its CPU time with")  # fmt: skip
    if t.spinning:
        return _with(base, Agreement.SPINS, f"waits by spinning (sched_yield) in {t.spinning} "
                     "of its samples: its CPU time counts the waiting too")  # fmt: skip
    slack = TICKS_OF_SLACK * cpu.resolution_s / cpu.span_s
    if share > high + slack:
        unseen = _r(share - busy_share)
        return _with(base, Agreement.CPU_ABOVE, _why_above(t, failed, due), unseen)
    if share < low - slack:
        return _with(base, Agreement.CPU_BELOW, _why_below(t, cpu.cpu_s))
    return _with(base, Agreement.AGREE, None)


def _why_above(t: _Thread, failed: int, due: int) -> str:
    if t.loop_leaf >= LOOP_MAJORITY * t.samples:
        return (f"event loop: {t.loop_leaf} of its {t.samples} samples are the bare loop "
                "runner (Runner.run) as the Python leaf, called idle; its work in C (socket "
                "I/O, HTTP parsing, response writes) shows no Python frame")  # fmt: skip
    if due and failed >= FAILED_READS_NOTABLE * due:
        return (f"{failed} of its {due} reads failed (non-blocking reads fail more often "
                "while a thread runs, so its busy moments are under-sampled)")  # fmt: skip
    return "the samples show less work than /proc measured; the stacks do not tell why"


def _why_below(t: _Thread, cpu_s: float) -> str:
    waits = sum((t.waiting or Counter()).values())
    if waits >= LOOP_MAJORITY * t.busy:
        which = ", ".join(p for p, _ in (t.waiting or Counter()).most_common())
        return (f"{waits} of its {t.busy} non-idle samples wait ({which}) off the CPU: "
                "waiting for work in flight, not using a core")  # fmt: skip
    leaf, stuck = (t.busy_leaves or Counter({"": 0})).most_common(1)[0]
    if stuck >= LOOP_MAJORITY * t.busy:
        return (
            f"stalled: {stuck} of its {t.busy} non-idle samples stop at one frame, {leaf}, "
            f"while /proc counted {cpu_s:.2f} s of CPU: the thread sat there off the CPU "
            "(waiting for the GIL or for a core), which its Python stack cannot show"
        )
    return "the samples show more work than /proc measured; the stacks do not tell why"


def _with(
    base: ThreadCheck, agreement: Agreement, reason: str | None, unseen: float | None = None
) -> ThreadCheck:
    return replace(base, agreement=agreement, reason=reason, unseen_cpu_share=unseen)


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

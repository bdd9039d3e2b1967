"""The py-spy process: started per segment, stopped with SIGINT so it writes out what it has,
killed when it ignores that, and its output read for its own counts, lateness and errors.

The process is the OS boundary behind `PySpyRunner`: the sampling loop (`sampler.py`) is tested
on recorded outcomes, the wait loop here on injected `ProcessCalls`, and the real binary against
real processes in tests/integration.
"""

from __future__ import annotations

import contextlib
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path, PurePosixPath
from typing import Protocol

from sidecar.errors import AttachError, SamplerError
from sidecar.parsers.speedscope import SpeedscopeError, read_speedscope
from sidecar.records.redact import redact_text
from sidecar.records.window import ProcessOutcome

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
LATE_S = 1.0  # py-spy reports lateness from 1 s on
# How long py-spy may take to attach before the window is given up on (it then ends partial).
ATTACH_GRACE_S = 30.0
# How long py-spy has to write its output after SIGINT before it is killed. It needs well under
# a second; one stuck in a ptrace call of a frozen target would otherwise hold the daemon.
KILL_GRACE_S = 5.0


@dataclass(frozen=True, slots=True)
class ProcessRate:
    """One process of a continuous segment: its own py-spy at its own whole rate. A role whose
    rate is below 1 Hz (py-spy's least) samples at 1 Hz for `share` of the segment."""

    pid: int
    rate_hz: int
    share: float = 1.0
    title: str = ""  # its command line, for the `process PID:"..."` frame py-spy puts first


@dataclass(frozen=True, slots=True)
class RecordRequest:
    pid: int
    rate_hz: float
    duration_s: float
    subprocesses: bool = True
    blocking: bool = False  # py-spy --nonblocking by default: never pause vLLM
    native: bool = False
    idle: bool = True  # idle threads are a phase of their own, not noise
    # How long py-spy may take to say it is sampling before it is stopped: the sampler gives a
    # segment what is left of its window's own grace, so slow attaches cannot add up.
    attach_grace_s: float = ATTACH_GRACE_S
    # Continuous mode: one py-spy per process, each at its own rate and without
    # --subprocesses (no rescan of the process tree at every sample); `pid` is then the root.
    processes: tuple[ProcessRate, ...] = ()
    # Continuous mode: `duration_s` counts from py-spy's launch, its attach inside it, so that
    # a period's segments end on the wall clock's grid.
    from_launch: bool = False
    # Cut the run into slices of this many seconds (py-spy's speedscope output keeps each
    # thread's samples in order); None: `--format raw`, the run is one unit.
    unit_s: float | None = None


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
    killed_after_s: float | None = None  # ignored SIGINT for this long, then SIGKILLed
    per_process: tuple[ProcessOutcome, ...] = ()  # continuous mode: each process's own
    # With `unit_s`: `raw`'s samples per time slice, in order (stack line -> samples).
    parts: tuple[Mapping[str, int], ...] = ()


class PySpyRunner(Protocol):
    """py-spy behind the seam: `record` for the windows, `dump` for the hang watch's incidents
    (exit code and output; `SubprocessPySpy.dump`)."""

    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome: ...

    def dump(self, pid: int, timeout_s: float = 60.0, native: bool = False) -> tuple[int, str]: ...


@dataclass(frozen=True, slots=True)
class ProcessCalls:
    """The OS calls the wait loop makes, injected so its decisions are tested without processes.

    `kill` is `os.kill` on the PID, not `Popen.send_signal`: that one polls first, and a poll
    that reaps py-spy makes the next `os.wait4` raise ChildProcessError. The PID cannot be
    reused meanwhile: only our own `wait4` reaps it, so until then it is at worst a zombie.
    """

    wait4: Callable[[int, int], tuple[int, int, resource.struct_rusage]] = os.wait4
    kill: Callable[[int, int], None] = os.kill
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


@dataclass(frozen=True, slots=True)
class Exit:
    """How a py-spy process ended, as the wait loop saw it."""

    returncode: int
    cpu_s: float  # its own user + system time; 0 when another waiter reaped it
    killed_after_s: float | None = None


@dataclass(slots=True)
class ShortNames:
    """py-spy's short file names (sidecar/parsers/speedscope.py says which), looked up where
    the target sees its files: /proc/PID/root, its mount namespace (a container's). Remembered:
    a process's files do not move while it runs."""

    stat: Callable[[str], object] = os.stat
    known: dict[tuple[int, str], str] = field(default_factory=dict)
    most: int = 50_000  # entries kept before the memory starts over

    def of(self, pid: int) -> Callable[[str], str]:
        return lambda file: self.short(pid, file)

    def short(self, pid: int, file: str) -> str:
        key = (pid, file)
        if (found := self.known.get(key)) is not None:
            return found
        if len(self.known) >= self.most:
            self.known.clear()
        self.known[key] = shortened = self._shorten(pid, file)
        return shortened

    def _shorten(self, pid: int, file: str) -> str:
        if not file.startswith("/"):
            return file
        root = f"/proc/{pid}/root"
        if not self._exists(root, file):
            if self._exists("", file):  # /proc/PID/root refused us: the same namespace, then
                root = ""
            else:
                return file  # py-spy prints the full name of a file it cannot find
        path = PurePosixPath(file)
        top = path.parent
        while top != top.parent and self._exists(root, str(top / "__init__.py")):
            top = top.parent
        return str(path.relative_to(top))

    def _exists(self, root: str, path: str) -> bool:
        try:
            self.stat(root + path)
        except OSError:
            return False
        return True


@dataclass(frozen=True, slots=True)
class SubprocessPySpy:
    """Runs the real py-spy binary. Stops it with SIGINT at the deadline, so py-spy writes out
    what it has: the same path a SIGTERM of the sidecar takes to cut a window short."""

    binary: str
    poll_s: float = 0.2  # deadline precision; each wake-up costs the sidecar CPU
    kill_grace_s: float = KILL_GRACE_S
    # Called (from a reader thread) when py-spy says it is sampling, with the seconds its
    # attach took: the CLI tells the operator, since on a busy host that can take a while.
    on_sampling: Callable[[RecordRequest, float], None] | None = None
    calls: ProcessCalls = field(default_factory=ProcessCalls)
    short_names: ShortNames = field(default_factory=ShortNames)

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

    def version(self) -> str | None:
        """What `py-spy --version` says, or None when it says nothing."""
        result = subprocess.run([self.binary, "--version"], capture_output=True, text=True,
                                timeout=10, check=False)  # fmt: skip
        return result.stdout.strip() or None

    def dump(self, pid: int, timeout_s: float = 60.0, native: bool = False) -> tuple[int, str]:
        """One `py-spy dump` of `pid`: exit code and output. `--nonblocking` (never pauses it),
        or with `native` the native frames too, which py-spy reads only with the process paused
        for the moment of the dump. A dump that outlasts `timeout_s` is killed: exit 124."""
        mode = ["--native"] if native else ["--nonblocking"]
        try:
            result = subprocess.run([self.binary, "dump", *mode, "--pid", str(pid)],
                                    capture_output=True, text=True, timeout=timeout_s,
                                    check=False)  # fmt: skip
        except subprocess.TimeoutExpired:
            return 124, f"py-spy dump {' '.join(mode)} took over {timeout_s:g} s and was killed"
        except OSError as exc:
            return 127, f"cannot start py-spy ({self.binary}): {exc}"
        # py-spy prints the target's command line first (`Process PID: CMDLINE`): no secrets.
        return result.returncode, redact_text(result.stderr + result.stdout)

    def record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        if request.processes:
            return self._record_each(request, stop)
        return self._record(request, stop)

    def _record_each(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        """One py-spy per process, side by side, each for its share of the segment; their
        outputs merged as one `--subprocesses` run would have written them."""
        results: dict[int, RecordOutcome] = {}

        def one(p: ProcessRate) -> None:
            single = replace(request, pid=p.pid, rate_hz=p.rate_hz, processes=(),
                             subprocesses=False,
                             duration_s=max(request.duration_s * p.share, 1.0))  # fmt: skip
            results[p.pid] = self._record(single, stop)

        launched = time.monotonic()
        threads = [threading.Thread(target=one, args=(p,), daemon=True) for p in request.processes]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # A process sampled for part of the segment (below 1 Hz) has its pause here: the
        # segment lasts its whole length, so that the next one starts on time, not at once.
        end = launched + request.duration_s
        while (left := end - time.monotonic()) > 0 and not stop():
            time.sleep(min(left, self.poll_s))
        merged = merge_outcomes(request.processes, results)
        return replace(merged, wall_s=max(merged.wall_s, time.monotonic() - launched))

    def _record(self, request: RecordRequest, stop: Callable[[], bool]) -> RecordOutcome:
        with tempfile.TemporaryDirectory(prefix="vllm-sidecar-") as tmp:
            out = Path(tmp) / "raw.txt"
            started = time.monotonic()
            proc = self._start(request, out)
            notify = self.on_sampling
            watch = _OutputWatch(
                proc, None if notify is None else lambda at: notify(request, at - started)
            )
            ended = self._wait(proc, watch, started, request, stop)
            watch.join()
            output = redact_text(watch.text())
            # --subprocesses roots each stack in `process PID:"CMDLINE"`: no secrets either.
            text = out.read_text(errors="replace") if out.exists() else ""
        raw, parts, output = self._read_output(request, text, output)
        counts = _COUNTS.search(output)
        return RecordOutcome(
            raw=raw,
            parts=parts,
            returncode=ended.returncode,
            output=output,
            samples=int(counts[1]) if counts else None,
            errors=int(counts[2]) if counts else None,
            cpu_s=ended.cpu_s,
            wall_s=time.monotonic() - (watch.sampling_since or started),
            attach_s=(watch.sampling_since or time.monotonic()) - started,
            target_exited="process exited" in output,
            behind_s=max((float(m) for m in _BEHIND.findall(output)), default=0.0),
            killed_after_s=ended.killed_after_s,
        )

    def _read_output(
        self, request: RecordRequest, text: str, output: str
    ) -> tuple[str, tuple[Mapping[str, int], ...], str]:
        """The run's collapsed stacks and, with `unit_s`, its slices; a speedscope file that
        cannot be read loses its samples with py-spy's output saying why (the window warns)."""
        if request.unit_s is None or not text:
            return redact_text(text), (), output
        try:
            ordered = read_speedscope(text, whole_rate(request.rate_hz), request.unit_s,
                                      self.short_names.of(request.pid))  # fmt: skip
        except SpeedscopeError as exc:
            return "", (), output + f"\nError: cannot read py-spy's speedscope output: {exc}\n"
        parts = tuple({redact_text(k): n for k, n in p.items()} for p in ordered.parts)
        return redact_text(ordered.raw), parts, output

    def _start(self, request: RecordRequest, out: Path) -> subprocess.Popen[bytes]:
        try:
            return subprocess.Popen(
                self._argv(request, out),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                # No preexec_fn (a prctl(PR_SET_PDEATHSIG) used to run there): Python code
                # between fork and exec can deadlock in a process with threads (the daemon has
                # its exporter's and NVML poller's), and Popen then waits on the child forever.
                # A py-spy whose sidecar was killed ends by itself: `--duration` (see _argv).
                # Its own session: a terminal's Ctrl-C reaches the sidecar alone, which stops
                # py-spy itself; and where the kernel groups sessions for scheduling
                # (autogroup, outside systemd and containers) py-spy is not starved with them.
                start_new_session=True,
            )
        except OSError as exc:  # removed since start, out of processes or memory
            raise SamplerError(
                f"cannot start py-spy ({self.binary}): {exc}; reinstall it (`pip install "
                "py-spy`) or point --py-spy at it"
            ) from exc

    def _argv(self, r: RecordRequest, out: Path) -> list[str]:
        # py-spy takes whole samples per second only (`--rate 2.5` is refused).
        argv = [self.binary, "record", "--pid", str(r.pid), "--rate", str(whole_rate(r.rate_hz))]
        # A safety net: py-spy ends by itself shortly after the deadline even if the sidecar
        # is killed before it can send SIGINT (it would stay attached to vLLM otherwise).
        argv += ["--duration", str(math.ceil(r.duration_s) + 5)]
        fmt = "raw" if r.unit_s is None else "speedscope"
        argv += ["--format", fmt, "--output", str(out), "--threads"]
        argv += ["--subprocesses"] * r.subprocesses + ["--idle"] * r.idle
        argv += ["--native"] * r.native + ([] if r.blocking else ["--nonblocking"])
        return argv

    def _wait(
        self,
        proc: subprocess.Popen[bytes],
        watch: _OutputWatch,
        started: float,
        request: RecordRequest,
        stop: Callable[[], bool],
    ) -> Exit:
        """Wait for py-spy and SIGINT it once it has *sampled* for `duration_s`: attaching to
        a tree of busy processes can take seconds on a loaded host, and that time is not part
        of the window."""

        def deadline() -> float:
            since = watch.sampling_since
            if request.from_launch:
                return started + request.duration_s
            if since:
                return since + request.duration_s
            return started + request.duration_s + request.attach_grace_s

        # py-spy ends on SIGINT after its next sample: at 1 Hz on a loaded host that took
        # 3.5 s here, so a slow rate gets longer before it is killed.
        grace = max(self.kill_grace_s, 10.0 / whole_rate(request.rate_hz))
        exit_ = wait_for_exit(proc.pid, deadline, stop, self.poll_s, grace,
                              self.calls, reaped_code=lambda: proc.returncode)  # fmt: skip
        proc.returncode = exit_.returncode  # Popen must not wait for it again
        return exit_


def wait_for_exit(
    pid: int,
    deadline: Callable[[], float],
    stop: Callable[[], bool],
    poll_s: float,
    kill_grace_s: float,
    calls: ProcessCalls,
    reaped_code: Callable[[], int | None] = lambda: None,
) -> Exit:
    """Poll `pid` until it exits: SIGINT at `deadline()` or when `stop()`, SIGKILL when it has
    not exited `kill_grace_s` later. os.wait4 gives its own CPU usage."""
    interrupted_at: float | None = None
    killed_after: float | None = None
    while True:
        try:
            reaped, status, usage = calls.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            # Reaped by someone else (a Popen.poll): its status is theirs, its usage is lost.
            # On ECHILD Popen itself assumes 0, and so do we when it kept nothing.
            code = reaped_code()
            return Exit(0 if code is None else code, 0.0, killed_after)
        if reaped == pid:
            cpu = usage.ru_utime + usage.ru_stime
            return Exit(os.waitstatus_to_exitcode(status), cpu, killed_after)
        now = calls.clock()
        if interrupted_at is None and (now >= deadline() or stop()):
            _signal(calls, pid, signal.SIGINT)
            interrupted_at = now
        elif (
            interrupted_at is not None
            and killed_after is None
            and (now - interrupted_at >= kill_grace_s)
        ):
            _signal(calls, pid, signal.SIGKILL)
            killed_after = now - interrupted_at
        calls.sleep(poll_s)


def _signal(calls: ProcessCalls, pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # exited and reaped meanwhile: wait4 says so
        calls.kill(pid, signum)


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


def merge_outcomes(
    processes: tuple[ProcessRate, ...], results: dict[int, RecordOutcome]
) -> RecordOutcome:
    """The outcomes of one segment's per-process py-spy runs as one: stacks prefixed with the
    process frame (what --subprocesses writes), counts and CPU added, the worst exit kept. A
    process that exited meanwhile ends the segment only when every process is gone."""
    outs = [(p, results[p.pid]) for p in processes if p.pid in results]
    raw = "".join(_with_process(p, o.raw) for p, o in outs)
    parts: list[dict[str, int]] = []
    for p, o in outs:
        for i, part in enumerate(o.parts):
            while len(parts) <= i:
                parts.append({})
            for key, n in part.items():
                mine = _process_head(p) + key if not key.startswith("process ") else key
                parts[i][mine] = parts[i].get(mine, 0) + n
    failed = [o for _, o in outs if o.returncode != 0]
    worst = failed[0] if failed and len(failed) == len(outs) else None
    killed = [o.killed_after_s for _, o in outs if o.killed_after_s is not None]
    wall = max((o.wall_s for _, o in outs), default=0.0)
    return RecordOutcome(
        raw=raw,
        returncode=worst.returncode if worst else 0,
        output="".join(o.output for _, o in outs),
        samples=sum(o.samples or 0 for _, o in outs),
        errors=sum(o.errors or 0 for _, o in outs),
        cpu_s=sum(o.cpu_s for _, o in outs),
        wall_s=wall,
        target_exited=bool(outs) and all(o.target_exited for _, o in outs),
        behind_s=max((o.behind_s for _, o in outs), default=0.0),
        attach_s=max((o.attach_s for _, o in outs), default=0.0),
        killed_after_s=max(killed, default=None),
        per_process=tuple(_process_outcome(p, o, wall) for p, o in outs),
        parts=tuple(parts) if all(o.parts or not o.raw for _, o in outs) else (),
    )


def _process_outcome(p: ProcessRate, o: RecordOutcome, segment_s: float) -> ProcessOutcome:
    """`wall_s` is the segment's, not this py-spy's own (shorter below 1 Hz): the rates asked
    and achieved are both per second of the segment."""
    return ProcessOutcome(pid=p.pid, requested_hz=p.rate_hz * p.share, samples=o.samples or 0,
                          errors=o.errors or 0, cpu_s=o.cpu_s, wall_s=segment_s,
                          behind_s=o.behind_s)  # fmt: skip


def _with_process(p: ProcessRate, raw: str) -> str:
    """py-spy without --subprocesses leaves out the `process PID:"CMDLINE"` root frame that
    tells whose stack a line is: put it back, as --subprocesses writes it."""
    head = _process_head(p)
    lines = (ln for ln in raw.splitlines() if ln.strip())
    return "".join(ln + "\n" if ln.startswith("process ") else head + ln + "\n" for ln in lines)


def _process_head(p: ProcessRate) -> str:
    return f'process {p.pid}:"{p.title.replace(chr(34), chr(39))}";'


def whole_rate(rate_hz: float) -> int:
    """The rate py-spy is given: whole samples per second, at least 1."""
    return max(1, round(rate_hz))


# ---------------------------------------------------------------------------------- errors


def explain_failure(
    pid: int,
    output: str,
    ptrace_refused: Callable[[int], bool] | None = None,
    closed_folder: Callable[[int], str | None] | None = None,
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
    closed = (closed_folder or _closed_folder)(pid) if "no python" in text else None
    if closed is not None:
        # Seen under systemd: vLLM's Python under a 0700 (or 0750) home that this user cannot
        # enter; py-spy then finds no Python, though ptrace was granted.
        return AttachError(
            f"py-spy cannot read process {pid}'s Python: {closed} is not searchable by this "
            "user, so py-spy finds no Python in it. Give the sidecar group access to that "
            "folder (chmod g+x, and SupplementaryGroups=<its group> in systemd), or add "
            "CAP_DAC_READ_SEARCH (docs/deploy.md, Adjustments)"
        )
    if "python" in text and ("failed to find" in text or "version" in text or "no python" in text):
        return AttachError(
            f"process {pid} does not look like a Python process to py-spy ({last_line(output)}): "
            "point --pid at the vLLM API server, EngineCore or worker"
        )
    return SamplerError(f"py-spy failed on process {pid}: {last_line(output) or 'no message'}")


def _closed_folder(
    pid: int, proc: str = "/proc", access: Callable[[str, int], bool] = os.access
) -> str | None:
    """The first folder on the way to process PID's Python (its executable and a libpython it
    maps, as it sees them: /proc/PID/root) that this process may not search; None: none."""
    root = f"{proc}/{pid}/root"
    paths: list[str] = []
    with contextlib.suppress(OSError):
        paths.append(os.readlink(f"{proc}/{pid}/exe"))
    with contextlib.suppress(OSError), open(f"{proc}/{pid}/maps") as maps:
        paths += [ln.split()[-1] for ln in maps if "libpython" in ln]
    for path in dict.fromkeys(p for p in paths if p.startswith("/")):
        parts = PurePosixPath(path).parents
        for folder in reversed(parts):
            if str(folder) != "/" and not access(root + str(folder), os.X_OK):
                return str(folder)
    return None


def _ptrace_refused(pid: int) -> bool:
    """py-spy reads /proc of its own PID namespace, so this asks the same /proc it does."""
    try:
        os.readlink(f"/proc/{pid}/exe")  # needs ptrace read access, as attaching does
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def last_line(text: str) -> str:
    """py-spy's first error line, else its first line that is not a status line."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and "py-spy>" not in ln]
    errors = [ln for ln in lines if ln.startswith("Error")]
    return (errors or lines or [""])[0]

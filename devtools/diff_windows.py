"""Windows of the dev vLLM server under a steady load, for `vllm-sidecar diff`: what `make
record-diff` records into tests/fixtures/diff for the unit tests (tests/unit/diff/) and the
measured false-alarm rate.

The load runs in a process of its own for the whole series (a real client), started before the
first window and warmed up, so every window sees the same steady traffic; each window is
`vllm-sidecar snapshot` as an operator runs it, in segments (the units a diff compares).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from devtools import sidecar_proc
from devtools.server import VllmServer
from devtools.sidecar_proc import REPO, env
from sidecar.sampling.pyspy import SubprocessPySpy

WINDOW_S = 30.0
SEGMENT_S = 5.0
RATE_HZ = 20.0
CONCURRENCY = 8
WARMUP_S = 8.0
# What a window may take beyond its length before the harness dumps and kills it: py-spy's
# attaches (their shared grace is the window plus 30 s), the reads, classifying and writing, on
# two cores that vLLM and eight clients keep busy. Locally a 24 s window takes 37-39 s in all.
SLACK_S = 300.0


class SnapshotTimeout(RuntimeError):
    """A CLI run outlived its time; the message has where it was (py-spy's dump of it)."""


def cli(*args: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess[str]:
    """`vllm-sidecar ARGS` from this checkout, in a session of its own (devtools/sidecar_proc.py
    says why). One that outlives TIMEOUT_S is dumped with py-spy before its group is killed, so
    a stuck run says where it was stuck."""
    command = sidecar_proc.argv(*args)
    proc = sidecar_proc.start(list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        where = _dump(proc.pid)
        sidecar_proc.kill(proc)
        out, err = proc.communicate()
        # CI shows the tail of a failed run: what it was doing and what else was busy go last.
        raise SnapshotTimeout(
            f"`vllm-sidecar {' '.join(args)}` ran over {timeout_s:.0f} s. Its stderr:\n"
            f"{err[-2000:]}\n{where}"
        ) from None
    finally:
        if proc.poll() is None:
            sidecar_proc.kill(proc)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def _dump(pid: int) -> str:
    """Where PID was (py-spy's dump, the sidecar's own `dump`, never pausing it; its main
    thread's innermost frames), its children (py-spy, when one runs), and the busiest
    processes of the machine with their scheduling group (autogroup and its nice): a starved
    run and a stuck one read differently."""
    code, dumped = SubprocessPySpy.find().dump(pid)
    ps = ["ps", "-o", "pid,ppid,stat,ni,pcpu,etimes,rss,args"]
    children = subprocess.run([*ps, "--ppid", str(pid)], capture_output=True, text=True,
                              check=False)  # fmt: skip
    busiest = subprocess.run(["ps", "-e", *ps[1:], "--sort=-pcpu"], capture_output=True,
                             text=True, check=False)  # fmt: skip
    top = "\n".join(_with_group(line[:140]) for line in busiest.stdout.splitlines()[:12])
    return (
        f"py-spy dump (exit {code}):\n{dumped[-3000:]}\n"
        f"its children:\n{children.stdout}\nbusiest processes:\n{top}\n"
        f"innermost frames of its main thread:\n{_innermost(dumped)}"
    )


def _with_group(ps_line: str) -> str:
    """PS_LINE with its process's autogroup (`/proc/PID/autogroup`: its name and nice) after it,
    where there is one to read."""
    pid = ps_line.split(maxsplit=1)[0] if ps_line.strip() else ""
    try:
        group = Path(f"/proc/{int(pid)}/autogroup").read_text().strip()
    except (ValueError, OSError):
        return ps_line
    return f"{ps_line}  [{group.lstrip('/')}]"


def _innermost(dumped: str, count: int = 6) -> str:
    """The first COUNT frames under py-spy's `Thread ... "MainThread"` line (the first thread
    when none is named: py-spy names threads only once `threading` is imported)."""
    lines = dumped.splitlines()
    heads = [i for i, line in enumerate(lines) if line.startswith("Thread ")]
    named = [i for i in heads if '"MainThread"' in lines[i]]
    found = named or heads
    if not found:
        return "(no thread in the dump)"
    start = found[0]
    frames = []
    for line in lines[start + 1 :]:
        if not line.startswith((" ", "\t")):
            break
        frames.append(line.strip())
    return "\n".join(frames[:count])


@contextlib.contextmanager
def steady_load(server: VllmServer, workload: str, seconds: float, seed: int = 0) -> Iterator[None]:
    """The load generator as a process of its own, in its own session, for up to SECONDS;
    killed (its whole group) when the block ends, whatever happens in it."""
    argv = [sys.executable, "-m", "devtools.loadgen", "--url", server.base_url,
            "--workload", workload, "--duration", str(seconds),
            "--concurrency", str(CONCURRENCY), "--seed", str(seed)]  # fmt: skip
    proc = subprocess.Popen(argv, env=env(), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        time.sleep(WARMUP_S)
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def take_windows(
    server: VllmServer,
    workload: str,
    count: int,
    out: Path,
    window_s: float = WINDOW_S,
    segment_s: float | None = SEGMENT_S,
    seed: int = 0,
    rate_hz: float | None = RATE_HZ,
    rates: tuple[float, ...] = (),
) -> list[Path]:
    """COUNT consecutive snapshot windows under one steady WORKLOAD; their folders. A
    `segment_s` or `rate_hz` of None leaves `snapshot`'s default (what an operator gets);
    `rates` given, window i samples at rates[i % len(rates)] (rates side by side in one run)."""
    folders: list[Path] = []
    # The load outlasts any series (a slow server stretches windows: --max-num-seqs 1 took
    # 100 s for a 30 s window here); the block kills it when the last window is written.
    with steady_load(server, workload, 3600.0, seed):
        for i in range(count):
            dest = out / f"{workload}-{i:02d}"
            rate = rates[i % len(rates)] if rates else rate_hz
            sampling = [*(["--segment", f"{segment_s:g}"] if segment_s is not None else []),
                        *(["--rate", f"{rate:g}"] if rate is not None else [])]  # fmt: skip
            done = cli("snapshot", "--pid", str(server.pid), "--duration", f"{window_s:g}",
                       *sampling, "--out", str(dest), timeout_s=window_s + SLACK_S)  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"snapshot exited {done.returncode}:\n{done.stderr[-3000:]}")
            (folder,) = [p for p in dest.iterdir() if not p.name.startswith(".")]
            folders.append(folder)
    return folders

"""`make bench`: what attaching the sidecar costs a real vLLM server, measured, not assumed.

One tiny real vLLM (CPU, dummy weights) serves the same load again and again, alternately WITH
the sidecar attached (`vllm-sidecar snapshot --pid ...` as a subprocess, started just before the
load and sampling for as long as it lasts) and WITHOUT it, in A/B pairs whose order flips every
pair (AB BA AB ...), so slow drift of the machine cancels out of the pair ratios. Both runs of a
pair send the same request sequence (same seed). The sidecar runs in its own session, as a
deployed sidecar would, not in the load generator's (see `run_with`). `--align` starts the load
only once py-spy is attached, to separate the cost of sampling from the sidecar's start-up.

Reported, from one run: per pair the throughput without and with and their ratio (with/without);
the mean ratio with a 95% t confidence interval over pairs; the sidecar's own CPU including
py-spy (`os.wait4` on the sidecar: its rusage holds its reaped children) as % of one core, its
peak RSS, the samples per snapshot; and what the rate buys: the binomial standard error of a 10%
phase share at the number of samples a process gets per snapshot. A JSON line ends the output.

    .venv/bin/python benchmarks/overhead.py [--rate 5] [--pairs 6] [--duration 15]
    .venv/bin/python benchmarks/overhead.py --rates 2,5,20 --pairs 4 --json-out bench.json
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script (`python benchmarks/overhead.py`): devtools/ is a checkout folder, not installed.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from devtools.loadgen import WORKLOADS, LoadResult, run_load
from devtools.server import VllmServer, descendants
from sidecar.records.summary import SnapshotSummary
from sidecar.store.summary_io import read_summary

SHARE_P = 0.10  # the phase share whose standard error shows what a rate buys
WARMUP_S = 5.0
ATTACH_TIMEOUT_S = 60.0
REAP_GRACE_S = 90.0  # after the window: the sidecar classifies and writes its snapshot
# Two-sided 95% Student t quantiles (0.975) for df = 1..30; above 30 the df-30 value is used,
# which is slightly conservative (the normal limit is 1.960).
# fmt: off
T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)
# fmt: on


class BenchError(RuntimeError):
    """The sidecar failed or hung: its numbers would be meaningless."""


# ---------------------------------------------------------------------------------- options


@dataclass(frozen=True, slots=True)
class Options:
    rates: tuple[float, ...]
    cpu_budget: str | None
    workload: str
    duration_s: float
    pairs: int
    concurrency: int
    warmup_s: float
    json_out: Path | None
    align: bool


def cli_default_rate() -> float:
    """The `snapshot --rate` default, read from the CLI itself so the two cannot drift apart."""
    try:
        from sidecar.cli import cli

        command = cli.commands["snapshot"]
        return next(float(p.default) for p in command.params if p.name == "rate")  # type: ignore[arg-type]
    except (ImportError, KeyError, StopIteration, TypeError, ValueError):
        return 5.0


def parse_args(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="benchmarks/overhead.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rate", type=float, default=cli_default_rate(), help="samples/s")
    parser.add_argument("--rates", help="comma-separated sweep, e.g. 2,5,20 (overrides --rate)")
    parser.add_argument("--cpu-budget", help="passed to the sidecar, e.g. 2%%")
    parser.add_argument("--workload", default="mixed", choices=sorted(WORKLOADS))
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of load per run")
    parser.add_argument("--pairs", type=int, default=6, help="A/B pairs per rate")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmup", type=float, default=WARMUP_S, help="seconds of load first")
    parser.add_argument(
        "--align",
        action="store_true",
        help="start the load only once py-spy is attached (steady-state sampling cost, without "
        "the sidecar's start-up); default: load starts right after the sidecar is launched",
    )
    parser.add_argument("--json-out", type=Path, help="also write the JSON result here")
    args = parser.parse_args(argv)
    rates = tuple(float(r) for r in args.rates.split(",")) if args.rates else (args.rate,)
    if args.pairs < 1 or args.duration <= 0 or any(r <= 0 for r in rates):
        parser.error("--pairs must be >= 1, --duration and rates > 0")
    return Options(
        rates=rates,
        cpu_budget=args.cpu_budget,
        workload=args.workload,
        duration_s=args.duration,
        pairs=args.pairs,
        concurrency=args.concurrency,
        warmup_s=args.warmup,
        json_out=args.json_out,
        align=args.align,
    )


# ---------------------------------------------------------------------------------- statistics


def t_975(df: int) -> float:
    return T_975[min(df, len(T_975)) - 1]


def mean_ci(values: Sequence[float]) -> tuple[float, float | None, float | None]:
    """Mean and 95% t interval; no interval from a single value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, None, None
    half = t_975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def binomial_se(p: float, n: float) -> float | None:
    return math.sqrt(p * (1 - p) / n) if n > 0 else None


# ---------------------------------------------------------------------------------- one run


@dataclass(frozen=True, slots=True)
class SidecarCost:
    """What one sidecar snapshot cost (process + reaped py-spy) and what it sampled."""

    cpu_s: float
    wall_s: float
    max_rss_mib: float
    samples: int
    errors: int
    rate_hz: float
    duration_s: float
    behind_s: float
    pyspy_cpu_share: float | None
    role_samples: dict[str, int]
    warnings: tuple[str, ...]
    attach_s: float | None  # launch -> py-spy running (start-up of the sidecar)

    @property
    def cpu_share(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Run:
    load: LoadResult
    sidecar: SidecarCost | None  # None for a run without the sidecar


def sidecar_command(pid: int, rate: float, opts: Options, out: Path) -> list[str]:
    exe = Path(sys.executable).with_name("vllm-sidecar")
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "sidecar.cli"]
    argv += ["snapshot", "--pid", str(pid), "--duration", f"{opts.duration_s:g}"]
    argv += ["--out", str(out), "--rate", f"{rate:g}"]
    return argv + (["--cpu-budget", opts.cpu_budget] if opts.cpu_budget else [])


def reap(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[int, resource.struct_rusage]:
    """`os.wait4` the sidecar: its rusage includes its reaped children (py-spy), and ru_maxrss is
    the largest of it and them. SIGKILL it if it overstays."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid == proc.pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return proc.returncode, usage
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    _, status, _ = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    raise BenchError(f"the sidecar was still running {timeout_s:.0f} s after its window")


def latest_summary(out: Path) -> SnapshotSummary:
    found = sorted(out.glob("*/summary.json"))
    if not found:
        raise BenchError(f"no summary.json under {out}")
    return read_summary(found[-1])


def sidecar_cost(
    summary: SnapshotSummary,
    usage: resource.struct_rusage,
    wall_s: float,
    attach_s: float | None,
) -> SidecarCost:
    s = summary.sampling
    return SidecarCost(
        cpu_s=usage.ru_utime + usage.ru_stime,
        wall_s=wall_s,
        max_rss_mib=usage.ru_maxrss / 1024,  # KiB on Linux
        samples=s.samples,
        errors=s.errors,
        rate_hz=s.rate_hz,
        duration_s=s.duration_s,
        behind_s=s.behind_s,
        pyspy_cpu_share=s.sampler_cpu_share,
        role_samples=dict(summary.role_samples),
        warnings=s.warnings + ((s.partial_reason or "partial",) if s.partial else ()),
        attach_s=attach_s,
    )


def run_without(server: VllmServer, opts: Options, seed: int) -> Run:
    return Run(_load(server, opts, seed), None)


def run_with(server: VllmServer, opts: Options, rate: float, seed: int, tmp: Path) -> Run:
    out = Path(tempfile.mkdtemp(prefix="snap-", dir=tmp))
    log = out.parent / f"{out.name}.stderr"
    started = time.monotonic()
    with log.open("wb") as err:
        proc = subprocess.Popen(
            sidecar_command(server.pid, rate, opts, out),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            # Its own session, as a deployed sidecar (its own service or container) would be: with
            # sched autogroup on, a child left in this session competes with the load generator
            # for this session's CPU share and starts seconds late on a loaded machine.
            start_new_session=True,
        )
    watch = AttachWatch(proc.pid)
    watch.start()
    try:
        if opts.align:
            watch.seen.wait(ATTACH_TIMEOUT_S)
        load = _load(server, opts, seed)
        code, usage = reap(proc, opts.duration_s + REAP_GRACE_S)
    finally:
        watch.cancel.set()
        if proc.returncode is None:
            proc.kill()
            proc.wait()
    wall = time.monotonic() - started
    if code != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise BenchError(f"vllm-sidecar exited {code}:\n{tail}")
    return Run(load, sidecar_cost(latest_summary(out), usage, wall, watch.attach_s))


class AttachWatch(threading.Thread):
    """Finds the sidecar's py-spy child, reading only /proc/PID/task/PID/children (no /proc
    scan) ten times a second until it appears. The attach time comes from the two processes'
    kernel start times, so it is exact however late this thread gets to look."""

    def __init__(self, pid: int) -> None:
        super().__init__(name="attach-watch", daemon=True)
        self.pid = pid
        self.attach_s: float | None = None  # sidecar launched -> py-spy started
        self.seen, self.cancel = threading.Event(), threading.Event()

    def run(self) -> None:
        while not self.cancel.is_set():
            found = [c for c in _children(self.pid) if _comm(c) == "py-spy"]
            if found:
                self.attach_s = _started_after(self.pid, found[0])
                self.seen.set()
                return
            self.cancel.wait(0.1)
        self.seen.set()


def _started_after(parent: int, child: int) -> float | None:
    """Seconds between two processes' start times (/proc/PID/stat field 22, clock ticks)."""
    first, second = _starttime(parent), _starttime(child)
    if first is None or second is None:
        return None
    return (second - first) / os.sysconf("SC_CLK_TCK")


def _starttime(pid: int) -> int | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _load(server: VllmServer, opts: Options, seed: int) -> LoadResult:
    return run_load(server.base_url, opts.workload, opts.duration_s, opts.concurrency, seed)


# ---------------------------------------------------------------------------------- pairs


@dataclass(frozen=True, slots=True)
class Pair:
    index: int
    order: str  # "AB" = without first, "BA" = with first
    without: Run
    with_: Run
    others: int  # vLLM processes not ours seen when the pair began: noise from outside

    def ratio(self, metric: str) -> float:
        base = float(getattr(self.without.load, metric))
        return float(getattr(self.with_.load, metric)) / base if base else float("nan")


def run_pair(server: VllmServer, opts: Options, rate: float, index: int, tmp: Path) -> Pair:
    seed = 1000 + index  # both arms of a pair send the same requests
    others = len(other_vllm_servers(server.pid))
    if index % 2 == 0:
        without = run_without(server, opts, seed)
        with_ = run_with(server, opts, rate, seed, tmp)
        return Pair(index, "AB", without, with_, others)
    with_ = run_with(server, opts, rate, seed, tmp)
    without = run_without(server, opts, seed)
    return Pair(index, "BA", without, with_, others)


def run_rate(server: VllmServer, opts: Options, rate: float, tmp: Path) -> list[Pair]:
    pairs = []
    print(_pair_header(rate), flush=True)
    for i in range(opts.pairs):
        pair = run_pair(server, opts, rate, i, tmp)
        print(_pair_row(pair), flush=True)
        pairs.append(pair)
    return pairs


# ---------------------------------------------------------------------------------- report


def _pair_header(rate: float) -> str:
    return (
        f"\n== rate {rate:g} Hz ==\n"
        f"{'pair':>4} {'order':>5} | {'tok/s w/o':>9} {'tok/s with':>10} {'ratio':>6} | "
        f"{'req/s w/o':>9} {'req/s with':>10} {'ratio':>6} | "
        f"{'attach s':>8} {'CPU s':>5} {'wall s':>6} {'CPU %':>6} {'RSS MiB':>7} "
        f"{'samples':>7} {'err':>4} {'behind s':>8} | {'failed':>6} {'others':>6}"
    )


def _pair_row(p: Pair) -> str:
    w, wo, sc = p.with_.load, p.without.load, p.with_.sidecar
    assert sc is not None
    failed = wo.requests_failed + w.requests_failed
    return (
        f"{p.index + 1:>4} {p.order:>5} | {wo.tokens_per_s:>9.1f} {w.tokens_per_s:>10.1f} "
        f"{p.ratio('tokens_per_s'):>6.3f} | {wo.requests_per_s:>9.2f} {w.requests_per_s:>10.2f} "
        f"{p.ratio('requests_per_s'):>6.3f} | {_num(sc.attach_s):>8} {sc.cpu_s:>5.2f} "
        f"{sc.wall_s:>6.1f} {100 * sc.cpu_share:>6.2f} {sc.max_rss_mib:>7.1f} {sc.samples:>7} "
        f"{sc.errors:>4} {sc.behind_s:>8.2f} | {failed:>6} {p.others:>6}"
    )


def summarize_rate(rate: float, pairs: list[Pair]) -> dict[str, Any]:
    costs = [p.with_.sidecar for p in pairs if p.with_.sidecar is not None]
    cpu = [c.cpu_share for c in costs]
    pyspy = [c.pyspy_cpu_share for c in costs if c.pyspy_cpu_share is not None]
    per_process = statistics.fmean(c.rate_hz * c.duration_s for c in costs)
    return {
        "rate_hz": rate,
        "pairs": len(pairs),
        "tokens_ratio": _ci_dict([p.ratio("tokens_per_s") for p in pairs]),
        "requests_ratio": _ci_dict([p.ratio("requests_per_s") for p in pairs]),
        "tokens_per_s_without": statistics.fmean(p.without.load.tokens_per_s for p in pairs),
        "tokens_per_s_with": statistics.fmean(p.with_.load.tokens_per_s for p in pairs),
        "sidecar_cpu_pct": {
            "mean": 100 * statistics.fmean(cpu),
            "min": 100 * min(cpu),
            "max": 100 * max(cpu),
        },
        "sidecar_cpu_s_mean": statistics.fmean(c.cpu_s for c in costs),
        "sidecar_wall_s_mean": statistics.fmean(c.wall_s for c in costs),
        "attach_s_mean": _mean_known([c.attach_s for c in costs]),
        "window_s_mean": statistics.fmean(c.duration_s for c in costs),
        "pairs_with_other_vllm": sum(1 for p in pairs if p.others),
        "pyspy_cpu_pct_mean": 100 * statistics.fmean(pyspy) if pyspy else None,
        "peak_rss_mib": max(c.max_rss_mib for c in costs),
        "samples_mean": statistics.fmean(c.samples for c in costs),
        "samples_per_process": per_process,
        "se_share_10pct": binomial_se(SHARE_P, per_process),
        "achieved_rate_hz_mean": statistics.fmean(c.rate_hz for c in costs),
        "py_spy_errors": sum(c.errors for c in costs),
        "empty_snapshots": sum(1 for c in costs if c.samples == 0),
        "behind_s_max": max(c.behind_s for c in costs),
        "failed_requests": sum(
            p.with_.load.requests_failed + p.without.load.requests_failed for p in pairs
        ),
        "warnings": sorted({w for c in costs for w in c.warnings}),
        "runs": [_pair_dict(p) for p in pairs],
    }


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _mean_known(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def _ci_dict(values: list[float]) -> dict[str, float | None]:
    mean, low, high = mean_ci(values)
    median = statistics.median(values)
    return {"mean": mean, "ci95_low": low, "ci95_high": high, "median": median}


def _pair_dict(p: Pair) -> dict[str, Any]:
    cost = asdict(p.with_.sidecar) if p.with_.sidecar else None
    return {
        "pair": p.index + 1,
        "order": p.order,
        "without": p.without.load.to_dict(),
        "with": p.with_.load.to_dict(),
        "sidecar": cost,
    }


def print_summary(s: dict[str, Any]) -> None:
    cpu, n = s["sidecar_cpu_pct"], s["samples_per_process"]
    print(f"-- rate {s['rate_hz']:g} Hz, {s['pairs']} pairs (ratio = with / without) --")
    print(f"generated tok/s ratio: {_fmt_ci(s['tokens_ratio'])}")
    print(f"requests/s ratio:      {_fmt_ci(s['requests_ratio'])}")
    print(
        f"sidecar CPU incl. py-spy: mean {cpu['mean']:.2f}% of one core "
        f"(min {cpu['min']:.2f}, max {cpu['max']:.2f}); py-spy alone (summary.json) "
        + (f"{s['pyspy_cpu_pct_mean']:.2f}%" if s["pyspy_cpu_pct_mean"] is not None else "n/a")
    )
    print(
        f"sidecar process: {s['sidecar_cpu_s_mean']:.2f} CPU s over {s['sidecar_wall_s_mean']:.1f} "
        f"s alive: start-up (py-spy attached after {_num(s['attach_s_mean'])} s) + "
        f"{s['window_s_mean']:.1f} s window + classify/write"
    )
    if s["pairs_with_other_vllm"]:
        print(f"NOTE: another vLLM was running during {s['pairs_with_other_vllm']} pair(s)")
    print(f"sidecar peak RSS (process + py-spy, largest): {s['peak_rss_mib']:.1f} MiB")
    print(
        f"samples per snapshot: {s['samples_mean']:.0f} thread-samples over all processes; "
        f"nominal {n:.0f} per process ({s['achieved_rate_hz_mean']:.2f} Hz x window); "
        f"empty snapshots {s['empty_snapshots']}; "
        f"py-spy errors {s['py_spy_errors']}, max behind {s['behind_s_max']:.2f} s, "
        f"failed requests {s['failed_requests']}"
    )
    se = s["se_share_10pct"]
    print(
        f"precision: a {SHARE_P:.0%} phase share of one process is known to +/- "
        + (f"{100 * se:.1f} points (1 binomial SE at n={n:.0f}; " if se else "n/a (")
        + "a lower bound: successive samples are correlated)"
    )
    for warning in s["warnings"]:
        print(f"warning from the sidecar: {warning}")


def _fmt_ci(ci: dict[str, float | None]) -> str:
    mean, low, high = ci["mean"], ci["ci95_low"], ci["ci95_high"]
    assert mean is not None
    change = 100 * (1 - mean)
    loss = f"({change:.1f}% lower with)" if change >= 0 else f"({-change:.1f}% higher with)"
    if low is None or high is None:
        return f"{mean:.3f} {loss}, no CI from one pair"
    # The median shows when one disturbed pair drags the mean (and widens the CI).
    return f"{mean:.3f}  95% CI [{low:.3f}, {high:.3f}] {loss}; median {ci['median']:.3f}"


def print_tradeoff(summaries: list[dict[str, Any]]) -> None:
    if len(summaries) < 2:
        return
    print("\n-- rate vs precision vs cost --")
    print(
        f"{'rate Hz':>7} {'samples/proc':>12} {'SE of 10% share':>15} {'CPU % core':>10} "
        f"{'tok/s ratio':>11}"
    )
    for s in summaries:
        se = s["se_share_10pct"]
        se_text = f"{100 * se:.1f} pts" if se else "n/a"
        cpu, ratio = s["sidecar_cpu_pct"]["mean"], s["tokens_ratio"]["mean"]
        print(
            f"{s['rate_hz']:>7g} {s['samples_per_process']:>12.0f} {se_text:>15} "
            f"{cpu:>10.2f} {ratio:>11.3f}"
        )


# ---------------------------------------------------------------------------------- context


def machine() -> dict[str, Any]:
    return {
        "nproc": os.cpu_count(),
        "platform": platform.platform(),
        "loadavg": _loadavg(),
        "python": platform.python_version(),
    }


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def other_vllm_servers(ours: int) -> list[int]:
    """vLLM API servers on this machine that are not ours: they share the cores and add noise."""
    mine = {ours, *descendants(ours)}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in mine:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"vllm.entrypoints" in cmdline or cmdline.startswith(b"VLLM::"):
            found.append(int(entry.name))
    return found


def print_header(opts: Options, info: dict[str, Any]) -> None:
    runs = 2 * opts.pairs * len(opts.rates)
    print("vllm-sidecar overhead benchmark: one tiny real vLLM (CPU, dummy weights)")
    print(
        f"machine: {info['nproc']} CPUs ({info['platform']}), load average "
        f"{info['loadavg']}; vLLM, the load generator and the sidecar share these cores"
    )
    print(
        f"load: {opts.workload}, concurrency {opts.concurrency}, {opts.duration_s:g} s per run; "
        f"{opts.pairs} A/B pairs per rate, order flipped each pair (AB BA ...); rates "
        f"{', '.join(f'{r:g}' for r in opts.rates)} Hz"
        + (f", --cpu-budget {opts.cpu_budget}" if opts.cpu_budget else "")
        + ("; load starts once py-spy is attached (--align)" if opts.align else "")
        + f"; about {(60 + runs * (opts.duration_s + 6)) / 60:.0f} min"
    )
    print(
        "ratio = throughput WITH the sidecar / WITHOUT it (1.000 = no cost). Caveat: on a small "
        "shared machine run-to-run noise is several percent; read the CI, not the mean alone, "
        "and a CI that spans 1.0 means no cost was detected at this precision."
    )


# ---------------------------------------------------------------------------------- main


def bench(opts: Options, info: dict[str, Any]) -> list[dict[str, Any]]:
    with VllmServer() as server, tempfile.TemporaryDirectory(prefix="sidecar-bench-") as tmp:
        others = other_vllm_servers(server.pid)
        print(f"vLLM up in {server.startup_s:.1f} s (pid {server.pid}, {server.base_url})")
        if others:
            print(f"NOTE: other vLLM processes are running here ({others}): expect more noise")
        info["other_vllm_pids"] = others
        warm = run_load(server.base_url, opts.workload, opts.warmup_s, opts.concurrency, seed=1)
        print(f"warm-up: {opts.warmup_s:g} s, {warm.tokens_per_s:.0f} tok/s", flush=True)
        summaries = []
        for rate in opts.rates:
            summaries.append(summarize_rate(rate, run_rate(server, opts, rate, Path(tmp))))
            print_summary(summaries[-1])
        return summaries


def main(argv: Sequence[str] | None = None) -> int:
    opts = parse_args(argv)
    info = machine()
    print_header(opts, info)
    started = time.monotonic()
    try:
        summaries = bench(opts, info)
    except BenchError as error:
        print(f"benchmark failed: {error}", file=sys.stderr)
        return 1
    print_tradeoff(summaries)
    info["loadavg_end"] = _loadavg()
    elapsed = time.monotonic() - started
    print(f"\ntotal {elapsed / 60:.1f} min; load average at the end {info['loadavg_end']}")
    result = {
        "benchmark": "sidecar-overhead",
        "machine": info,
        "options": _options_dict(opts),
        "elapsed_s": round(elapsed, 1),
        "rates": summaries,
    }
    line = json.dumps(result, separators=(",", ":"))
    if opts.json_out:
        opts.json_out.write_text(line + "\n")
    print(line)
    return 0


def _options_dict(opts: Options) -> dict[str, Any]:
    out = asdict(opts)
    out["json_out"] = str(opts.json_out) if opts.json_out else None
    return out


if __name__ == "__main__":
    sys.exit(main())

"""Check NVML's per-process numbers against what PyTorch says it holds, on a real GPU.

A child process takes a CUDA context, allocates a known block (2 GiB by default) and runs
matmuls in a loop, reporting torch.cuda.memory_allocated / memory_reserved on stdout. Meanwhile
`sidecar.gpu.NvmlReader` (the real pynvml) reads that child's per-process memory and its
GPU's utilisation for ~10 s, and `UtilizationPoller` polls utilisation as the sidecar does
through a window. The check passes when NVML found the child's PID and

    reserved <= NVML used <= reserved + slack (1.5 GiB: CUDA context, cuBLAS, NCCL-free)

and the sidecar's `target_gpus` puts the child on the GPU torch says it uses (by UUID). It
also prints each GPU's memory as the sidecar reports it (GiB) beside nvidia-smi's MiB.

Exit codes: 0 pass, 1 a check failed, 2 no usable NVIDIA GPU (no NVML, no PyTorch, no CUDA).
`--record PATH` writes an NVML fixture of this machine for tests/fixtures/nvml instead.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import re
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from devtools.nvml_fixture import record_fixture  # noqa: E402
from sidecar.gpu import (  # noqa: E402
    GpuReading,
    GpuSelection,
    GpuUtilization,
    NvmlApi,
    NvmlReader,
    PynvmlApi,
    UtilizationPoller,
    gpu_figures,
    target_gpus,
)
from sidecar.sizes import format_bytes, format_mib  # noqa: E402
from sidecar.target.pidmap import PidMap  # noqa: E402
from sidecar.target.procfs import ProcFs  # noqa: E402

GIB = 1 << 30
EXIT_PASS, EXIT_FAIL, EXIT_NO_GPU = 0, 1, 2
CHILD_START_TIMEOUT_S = 300.0  # importing torch and creating a context can take a while
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=2.0, help="GiB the child allocates")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long to read NVML")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between readings")
    parser.add_argument("--slack-gib", type=float, default=1.5, help="allowed NVML - reserved")
    parser.add_argument("--proc-root", type=Path, default=Path("/proc"))
    parser.add_argument("--host-proc", type=Path, help="the host's /proc, inside a container")
    parser.add_argument("--record", type=Path, help="write an NVML fixture here and exit")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--max-seconds", type=float, default=120.0, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, api: NvmlApi | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        return child_main(args)
    api = api if api is not None else PynvmlApi()
    reader = NvmlReader(api)
    reason = reader.open()
    if reason is not None:
        if not reason.startswith("no NVIDIA GPU"):
            reason = f"no NVIDIA GPU usable: {reason}"
        print(f"gpu-check: {reason}", file=sys.stderr)
        return EXIT_NO_GPU
    try:
        if args.record is not None:
            return record(api, args.record)
        if importlib.util.find_spec("torch") is None:
            print(
                f"gpu-check: no NVIDIA GPU usable from PyTorch: torch is not installed for "
                f"{sys.executable} (pip install torch)",
                file=sys.stderr,
            )
            return EXIT_NO_GPU
        return check(args, reader)
    finally:
        reader.close()


def record(api: NvmlApi, path: Path) -> int:
    import yaml

    source = f"recorded by scripts/gpu_check.py on {os.uname().nodename}"
    text = yaml.safe_dump(record_fixture(api, source), sort_keys=False)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    print(f"gpu-check: wrote {path}")
    return EXIT_PASS


# --- the parent -----------------------------------------------------------------------------


@dataclass
class Samples:
    used: list[int] = field(default_factory=list)
    util: list[int] = field(default_factory=list)
    devices: set[str] = field(default_factory=set)
    matched: set[str] = field(default_factory=set)
    readings: int = 0
    missing_memory: int = 0
    last: GpuReading | None = None  # the last available reading, for the sidecar's figures


class Child:
    """The torch child, spoken to over stdin and read from stdout (JSON lines)."""

    def __init__(self, args: argparse.Namespace) -> None:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", "--gib", str(args.gib)]
        command += ["--max-seconds", str(args.seconds + 120)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def expect(self, event: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                raise ChildFailed(f"the child exited ({self.process.wait()}) before '{event}'")
            try:
                message: dict[str, Any] = json.loads(line)
            except json.JSONDecodeError:
                print(f"gpu-check: child: {line.rstrip()}", file=sys.stderr)
                continue
            if message["event"] == "error":
                raise NoCuda(message["message"])
            if message["event"] == event:
                return message
        raise ChildFailed(f"no '{event}' from the child within {timeout:.0f} s")

    def say(self, word: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(word + "\n")
        self.process.stdin.flush()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


class ChildFailed(Exception):
    pass


class NoCuda(Exception):
    pass


def check(args: argparse.Namespace, reader: NvmlReader) -> int:
    child = Child(args)
    try:
        context = child.expect("context", CHILD_START_TIMEOUT_S)
        pidmap = build_pidmap(args, child.process.pid)
        at_context = sample(reader, pidmap, child.process.pid, Samples())
        child.say("go")
        ready = child.expect("ready", 120)
        samples = Samples()
        poller = UtilizationPoller(reader, interval_s=args.interval)
        poller.start()
        try:
            deadline = time.monotonic()
            end = deadline + args.seconds
            while deadline < end:  # absolute deadlines: slow readings do not stretch the run
                sample(reader, pidmap, child.process.pid, samples)
                deadline += args.interval
                time.sleep(max(0.0, deadline - time.monotonic()))
        finally:
            utilization = poller.stop()
        child.say("stop")
        done = child.expect("done", 60)
    except NoCuda as error:
        print(f"gpu-check: no NVIDIA GPU visible to PyTorch: {error}", file=sys.stderr)
        return EXIT_NO_GPU
    except ChildFailed as error:
        print(f"gpu-check: FAIL: {error}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        child.stop()
    extra = sidecar_figures(args, child.process.pid, context, samples, utilization)
    return report(args, child.process.pid, context, at_context, ready, done, samples, extra)


def build_pidmap(args: argparse.Namespace, pid: int) -> PidMap:
    host = ProcFs(args.host_proc) if args.host_proc else None
    return PidMap.build(ProcFs(args.proc_root), [pid], host_procfs=host)


def sample(reader: NvmlReader, pidmap: PidMap, pid: int, into: Samples) -> Samples:
    reading = reader.read(pidmap)
    into.readings += 1
    if reading.available:
        into.last = reading
    found = reading.for_target(pid)
    if not found:
        return into
    used = [p.used_memory_bytes for p in found]
    if None in used:
        into.missing_memory += 1
    else:
        into.used.append(sum(u for u in used if u is not None))
    for process in found:
        into.matched.add(str(process.matched))
        for device in reading.devices:
            if device.index == process.device_index and device.mig_index == process.mig_index:
                into.devices.add(f"{device.label} ({device.name})")
                if device.util_gpu_pct is not None:
                    into.util.append(device.util_gpu_pct)
    return into


def report(
    args: argparse.Namespace,
    pid: int,
    context: dict[str, Any],
    at_context: Samples,
    ready: dict[str, Any],
    done: dict[str, Any],
    samples: Samples,
    extra: tuple[list[tuple[str, str]], list[str]] = ([], []),
) -> int:
    reserved = int(done["reserved"])
    slack = int(args.slack_gib * GIB)
    rows = [
        ("torch allocated (ready / done)", f"{gib(ready['allocated'])} / {gib(done['allocated'])}"),
        ("torch reserved (ready / done)", f"{gib(ready['reserved'])} / {gib(done['reserved'])}"),
        ("torch reserved, context only", gib(context["reserved"])),
    ]
    if at_context.used:
        overhead = at_context.used[0] - int(context["reserved"])
        rows.append(("NVML used, context only", gib(at_context.used[0])))
        rows.append(("CUDA context overhead (NVML - reserved)", gib(overhead)))
    failures = []
    if not samples.used and not samples.missing_memory:
        failures.append(
            f"PID {pid} is in none of NVML's {samples.readings} process lists. NVML reports "
            "host PIDs: inside a container, mount the host's /proc (-v /proc:/host_proc:ro) "
            "and pass --host-proc /host_proc, or run with --pid=host"
        )
    elif not samples.used:
        failures.append("NVML found the PID but reports no memory for it (usedGpuMemory N/A)")
    else:
        median = int(statistics.median(samples.used))
        spread = f"{gib(min(samples.used))} .. {gib(max(samples.used))}"
        rows.append(("NVML used (median; range)", f"{gib(median)}; {spread}"))
        rows.append(("NVML - torch reserved", gib(median - reserved)))
        rows.append(("allowed", f"[{gib(reserved)}, {gib(reserved + slack)}]"))
        if not reserved <= median <= reserved + slack:
            failures.append(
                f"NVML's {gib(median)} is outside [{gib(reserved)}, {gib(reserved + slack)}]"
            )
    util = "not reported"
    if samples.util:
        low, high = min(samples.util), max(samples.util)
        util = f"{statistics.mean(samples.util):.1f} % (min {low}, max {high})"
    rows.append(("GPU utilisation mean", util))
    rows.append(("matched PID as", ", ".join(sorted(samples.matched)) or "-"))
    rows.append(("matmul iterations", str(done.get("iterations", "?"))))
    rows += extra[0]
    failures += extra[1]
    print(
        f"gpu-check: child PID {pid} on {', '.join(sorted(samples.devices)) or '?'}; "
        f"torch {context['torch']}, CUDA {context['cuda']}, {context['name']}; "
        f"{args.seconds:.0f} s, {samples.readings} readings"
    )
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    for failure in failures:
        print(f"gpu-check: FAIL: {failure}", file=sys.stderr)
    print("gpu-check: PASS" if not failures else "gpu-check: FAIL")
    return EXIT_FAIL if failures else EXIT_PASS


def sidecar_figures(
    args: argparse.Namespace,
    pid: int,
    context: dict[str, Any],
    samples: Samples,
    utilization: tuple[GpuUtilization, ...],
) -> tuple[list[tuple[str, str]], list[str]]:
    """The report's GPU figures as the sidecar computes them, and what contradicts torch."""
    reading = samples.last
    if reading is None:
        return [], []
    rows = [
        (f"{d.label} memory used / total",
         f"{format_bytes(d.memory_used_bytes)} / {format_bytes(d.memory_total_bytes)} "
         f"(nvidia-smi: {format_mib(d.memory_used_bytes)} / {format_mib(d.memory_total_bytes)})")
        for d in reading.devices
    ]  # fmt: skip
    target = target_gpus(reading, [pid], ProcFs(args.proc_root).environ, world_size=1)
    figures = gpu_figures(reading, target, utilization)
    if target is None or figures is None:
        return rows, []
    rows.append(("child's GPU, as the sidecar finds it",
                 f"{', '.join(target.labels) or '-'} ({target.how}: {target.detail})"))  # fmt: skip
    for use in figures.devices:
        polled = use.utilization.text if use.utilization else "not polled"
        rows.append((f"{use.label} utilisation, polled through the run", polled))
    failures = []
    want = str(context.get("uuid") or "")
    if UUID.fullmatch(want) and target.how is GpuSelection.NVML_PROCESSES:
        uuids = [(d.uuid or "").lower() for d in reading.devices if d.label in target.labels]
        if not any(want.lower() in uuid for uuid in uuids):
            failures.append(f"the sidecar puts the child on {target.labels}; torch on {want}")
    if samples.util and not any(u.samples for u in utilization):
        failures.append("NVML answered utilisation to readings but not to the poller")
    return rows, failures


def gib(value: int | float) -> str:
    return f"{value / GIB:.3f} GiB"


# --- the child ------------------------------------------------------------------------------


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}), flush=True)


def child_main(args: argparse.Namespace) -> int:
    try:
        torch = importlib.import_module("torch")  # Any to mypy: torch is not a dependency
    except ImportError as error:
        emit("error", message=f"cannot import torch: {error}")
        return 3
    if not torch.cuda.is_available():
        emit("error", message="torch.cuda.is_available() is False")
        return 3
    device = torch.device("cuda")
    torch.zeros(1, device=device)  # the CUDA context, and one 2 MiB allocator block
    torch.cuda.synchronize()
    props = torch.cuda.get_device_properties(device)

    def memory() -> dict[str, int]:
        return {
            "allocated": torch.cuda.memory_allocated(device),
            "reserved": torch.cuda.memory_reserved(device),
        }

    emit(
        "context",
        torch=torch.__version__,
        cuda=torch.version.cuda,
        name=props.name,
        uuid=str(getattr(props, "uuid", "")),
        device=torch.cuda.current_device(),
        visible=os.environ.get("CUDA_VISIBLE_DEVICES"),
        **memory(),
    )
    if sys.stdin.readline().strip() != "go":
        return 0
    block = torch.empty(int(args.gib * GIB), dtype=torch.uint8, device=device)
    block.fill_(1)  # touch every page, so nothing is committed lazily
    a = torch.randn(4096, 4096, device=device)
    b = torch.randn(4096, 4096, device=device)
    c = torch.empty(4096, 4096, device=device)
    torch.mm(a, b, out=c)
    torch.cuda.synchronize()
    emit("ready", **memory())
    stop = threading.Event()

    def wait_for_stop() -> None:
        sys.stdin.readline()  # "stop", or EOF when the parent dies
        stop.set()

    threading.Thread(target=wait_for_stop, daemon=True).start()
    deadline = time.monotonic() + args.max_seconds
    iterations = 0
    while not stop.is_set() and time.monotonic() < deadline:
        for _ in range(16):
            torch.mm(a, b, out=c)
        torch.cuda.synchronize()
        iterations += 16
    emit("done", iterations=iterations, **memory())
    del block
    return 0


if __name__ == "__main__":
    sys.exit(main())

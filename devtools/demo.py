"""`make demo`: a tiny real vLLM, `mixed` load, the sidecar attached for one window, its report.

    python -m devtools.demo [--workload mixed] [--duration 15] [--out out/demo]

Every part is real: the vLLM CPU server from devtools.server, HTTP load from devtools.loadgen,
and the sidecar run as operators run it, through its console script.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from devtools.loadgen import LoadResult, run_load
from devtools.server import VllmServer
from sidecar.commands import SAMPLING_LINE


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workload", default="mixed")
    parser.add_argument("--duration", type=float, default=15.0, help="sampling window, seconds")
    parser.add_argument("--out", type=Path, default=Path("out/demo"))
    args = parser.parse_args(argv)
    sidecar = Path(sys.executable).with_name("vllm-sidecar")
    out = args.out / time.strftime("%Y%m%dT%H%M%S")  # one folder per demo run

    print("starting a tiny real vLLM (CPU, dummy weights) ...", flush=True)
    with VllmServer() as server:
        print(f"vLLM up in {server.startup_s:.1f} s: pid {server.pid}, {server.base_url}")
        # The load starts when the sidecar says py-spy is sampling and lasts the window (and
        # a little more): on a small busy host the sidecar's start-up and py-spy's attach can
        # take many seconds, and the window must be under load from its first sample to its
        # last, while the classify-and-write after it should not compete with the load.
        command = [str(sidecar), "snapshot", "--pid", str(server.pid),
                   "--duration", str(args.duration), "--out", str(out)]  # fmt: skip
        print("$ " + " ".join(command), flush=True)
        sidecar_proc = subprocess.Popen(
            command, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        sampling = threading.Event()
        echo = threading.Thread(target=_echo, args=(sidecar_proc, sampling), daemon=True)
        echo.start()
        result: dict[str, LoadResult] = {}
        try:
            while not sampling.wait(0.5) and sidecar_proc.poll() is None:
                pass
            if sampling.is_set():
                result["load"] = run_load(server.base_url, args.workload, args.duration + 2)
            code = sidecar_proc.wait()
        finally:
            if sidecar_proc.poll() is None:
                sidecar_proc.kill()
                sidecar_proc.wait()
            echo.join(5)
    if "load" in result:
        print("\nload generator (its own counts):", json.dumps(result["load"].to_dict()))
    if code != 0:
        return code
    (snapshot,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    print(f"\n$ {sidecar} report {snapshot}", flush=True)
    return subprocess.call([str(sidecar), "report", str(snapshot)])


def _echo(proc: subprocess.Popen[str], sampling: threading.Event) -> None:
    """Pass the sidecar's stderr through; note the line that says sampling has begun."""
    assert proc.stderr is not None
    for line in proc.stderr:
        sys.stderr.write(line)
        sys.stderr.flush()
        if line.startswith(SAMPLING_LINE):
            sampling.set()


if __name__ == "__main__":
    sys.exit(main())

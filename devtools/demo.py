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
        result: dict[str, LoadResult] = {}
        load = threading.Thread(
            target=lambda: result.setdefault(
                "load", run_load(server.base_url, args.workload, args.duration + 4)
            ),
            daemon=True,
        )
        load.start()
        time.sleep(2)  # let the load reach steady state before the window opens
        command = [str(sidecar), "snapshot", "--pid", str(server.pid),
                   "--duration", str(args.duration), "--out", str(out)]  # fmt: skip
        print("$ " + " ".join(command), flush=True)
        code = subprocess.call(command, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        load.join()
    if "load" in result:
        print("\nload generator (its own counts):", json.dumps(result["load"].to_dict()))
    if code != 0:
        return code
    (snapshot,) = [p for p in out.iterdir() if not p.name.startswith(".")]
    print(f"\n$ {sidecar} report {snapshot}", flush=True)
    return subprocess.call([str(sidecar), "report", str(snapshot)])


if __name__ == "__main__":
    sys.exit(main())

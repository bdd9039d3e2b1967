"""vllm-sidecar from Python: one snapshot of a running vLLM, its breakdowns as DataFrames, the
report, saved and read back, and the saved folder read as a store.

    python examples/notebook_quickstart.py --pid <any vLLM pid> [--seconds 10] [--out profiles]
    python examples/notebook_quickstart.py --discover

Each block is what a notebook cell would hold. CI runs this file against the real vLLM CPU
server (tests/integration/test_pyapi_live.py) and checks what it prints. Without a vLLM at hand,
examples/quickstart.ipynb walks the same interface over the recorded samples the package ships.
"""

from __future__ import annotations

import argparse
import sys

import sidecar
from sidecar import Profiler


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument("--pid", type=int, help="any process of the vLLM server")
    who.add_argument("--discover", action="store_true", help="find vLLM under /proc")
    parser.add_argument("--seconds", default="10", help="window length (10, 10s, 1m)")
    parser.add_argument("--rate", default="5", help="samples per second")
    parser.add_argument("--out", default="profiles", help="folder the snapshot is saved into")
    args = parser.parse_args()

    # 1. Name the server (the same settings as `vllm-sidecar snapshot`: rate, segment,
    #    metrics_url, gpu, rules, ...) and take one window. `progress` hears when py-spy has
    #    attached: the window starts then, not when snapshot() is called.
    profiler = Profiler(pid=args.pid, discover=args.discover or None, rate=args.rate)
    snap = profiler.snapshot(args.seconds, progress=lambda line: print(line, file=sys.stderr))
    print(snap)

    # 2. The report, exactly as `vllm-sidecar report` prints it.
    print(snap.report())

    # 3. What to change, with the evidence (configs/advice.yaml; none on a healthy server).
    for finding in snap.findings():
        print(f"finding: [{finding.severity}] {finding.title}; flags: {' '.join(finding.flags)}")

    # 4. Where each role's time went: one row per (scope, role, phase), shares of 0-1.
    computation = snap.computation_breakdown()
    every = computation[computation["scope"] == "all_threads"]
    top = every.sort_values("share_of_role", ascending=False).groupby("role").head(3)
    print("\ntop phases per role:")
    print(
        top.sort_values(["role", "share_of_role"], ascending=[True, False]).to_string(index=False)
    )

    # 5. Memory: one row per (item, device) in bytes: devices, processes, the KV cache.
    memory = snap.memory_breakdown()
    print("\nmemory:")
    print(memory.drop(columns="name").to_string(index=False))  # name: a process's command line
    per_role = memory[memory["item"] == "process"].groupby("role")["used_bytes"].sum()
    print("\nresident memory per role (GiB):")
    print((per_role / 2**30).round(2).to_string())

    # 6. The typed summary, for anything else (vLLM's own figures here).
    serving = snap.summary.serving
    if serving.requests_finished is not None and serving.generation_tokens_per_s is not None:
        print(f"\nvLLM: {serving.requests_finished:.0f} requests finished, "
              f"{serving.generation_tokens_per_s:.0f} generated tokens/s")  # fmt: skip
    else:
        print(f"\nvLLM: not read ({serving.reason})")

    # 6. Keep it: a snapshot folder like the CLI's, readable by `vllm-sidecar report`, `diff`,
    #    `flamegraph`, and by sidecar.load in a later session.
    saved = snap.save(args.out)
    again = sidecar.load(saved)
    assert again.summary == snap.summary
    print(f"\nsaved: {saved}")

    # 7. A folder of snapshots (here the one saved; a daemon's output.dir in practice) as a
    #    DataFrame, one row per snapshot: the table `vllm-sidecar trend` reads.
    table = sidecar.snapshots(args.out, since="1d")
    print(f"\nstore: {len(table)} snapshot(s) under {args.out} in the last day")
    print(table[["time", "name", "samples", "requests_per_s", "share.worker.forward"]]
          .to_string(index=False))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What uploads to object storage cost: a day's backlog drained, one window's folder, an outage.

    python -m benchmarks.upload [--folders 288] [--out /tmp/upload-bench]

Against moto's S3 API server on loopback (tests/moto_server.py), a Python process on the same
machine: its throughput, not the network's, bounds the figures, so they are a floor for a real
store. The folders are replicas of the real ones in tests/fixtures (tests/upload_store.py):
the ten summary-only folders of diff/steady-mixed and the two complete flame folders (summary,
stacks.parquet, stacks.collapsed), hard-linked under new names 5 minutes apart, each with its
trend-table row. It prints:
  * the backlog of `--folders` folders (288: a day of 5-minute snapshots) drained by one
    uploader: wall seconds, folders/s, MB/s, and the uploader's CPU seconds per folder
    (this process only: moto runs in its own);
  * one more folder after the backlog (what each window adds), and an idle step (the backlog
    check with every folder confirmed);
  * an outage: the server killed, how long one failed try takes, the backoff; then the
    server back and the new backlog drained.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from sidecar.config.settings import UploadConfig
from sidecar.store.folders import SnapshotStore
from sidecar.store.objectstore import open_object_store
from sidecar.store.summary_io import read_summary
from sidecar.store.trend_table import TrendTable, summary_row
from sidecar.store.upload import Uploader
from tests.moto_server import BUCKET, MotoServer
from tests.upload_store import HOST, KEEP_ALL, source_folders

START = datetime(2026, 12, 1, tzinfo=UTC).timestamp()


def lay_out(root: Path, n: int, offset: int = 0) -> None:
    """`n` replicas of the real folders, 5 minutes apart from `offset` on, rows included."""
    host_dir = root / HOST
    host_dir.mkdir(parents=True, exist_ok=True)
    sources = source_folders()
    table = TrendTable(host_dir)
    for i in range(offset, offset + n):
        name = datetime.fromtimestamp(START + 300 * i, UTC).strftime("%Y%m%dT%H%M%SZ")
        src = sources[i % len(sources)]
        shutil.copytree(src, host_dir / name, copy_function=os.link)
        table.append(summary_row(read_summary(src), name=name))


def timed(fn):  # type: ignore[no-untyped-def]
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folders", type=int, default=288)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_DEFAULT_REGION="us-east-1")  # fmt: skip
    work = args.out or Path(tempfile.mkdtemp(prefix="upload-bench-"))
    server = MotoServer(work / "moto.log")
    _, start_s, _ = timed(server.start)
    print(f"moto server up in {start_s:.1f} s on {server.url}")
    try:
        run(work, server, args.folders)
    finally:
        server.kill()


def run(work: Path, server: MotoServer, n: int) -> None:
    lay_out(work / "out", n)
    store = SnapshotStore(work / "out", HOST, KEEP_ALL)
    config = UploadConfig(url=f"s3://{BUCKET}/fleet", endpoint_url=server.url, timeout_s=5,
                          backoff_s=0.5, backoff_max_s=4, retries=0)  # fmt: skip
    up = Uploader(store, open_object_store(config), config.backoff_s, config.backoff_max_s)
    mb = store.total_bytes_used / 2**20
    each = []
    wall, cpu = time.perf_counter(), time.process_time()
    while up.status().backlog:
        each.append(timed(up.step)[1])
    done, wall, cpu = len(each), time.perf_counter() - wall, time.process_time() - cpu
    objects = len(server.objects())
    print(f"backlog of {done} folders ({mb:.1f} MiB, {objects} objects): {wall:.1f} s wall, "
          f"{done / wall:.1f} folders/s, {mb / wall:.2f} MiB/s; uploader CPU {cpu:.1f} s = "
          f"{1000 * cpu / done:.0f} ms per folder; median per folder "
          f"{1000 * statistics.median(each[:48]):.0f} ms over the first 48, "
          f"{1000 * statistics.median(each[-48:]):.0f} ms over the last 48")  # fmt: skip

    lay_out(work / "out", 1, offset=n)
    store = SnapshotStore(work / "out", HOST, KEEP_ALL)  # it rescans: the new folder is seen
    up.store = store
    steps = []
    for _ in range(5):
        _, wall, cpu = timed(up.step)
        steps.append((wall, cpu))
    print(f"one more folder: {1000 * steps[0][0]:.0f} ms wall, {1000 * steps[0][1]:.0f} ms CPU; "
          f"an idle step over {n + 1} confirmed folders: "
          f"{1000 * statistics.median(w for w, _ in steps[1:]):.1f} ms")  # fmt: skip

    server.kill()
    lay_out(work / "out", 12, offset=n + 1)
    store = SnapshotStore(work / "out", HOST, KEEP_ALL)
    up.store = store
    fails = []
    for _ in range(4):
        time.sleep(up.wait_s())
        _, wall, _ = timed(up.step)
        fails.append((wall, up.wait_s()))
    print("store down: each failed try took " + ", ".join(f"{1000 * w:.0f} ms" for w, _ in fails)
          + "; next tries after " + ", ".join(f"{b:.1f} s" for _, b in fails))  # fmt: skip
    _, restart_s, _ = timed(server.start)
    time.sleep(up.wait_s())
    done, wall, cpu = timed(up.drain)
    print(f"store back (restart {restart_s:.1f} s): {done} folders drained in {wall:.1f} s; "
          f"backlog {up.status().backlog}, failures {up.failures_total}, "
          f"uploaded {up.uploaded_total}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Parquet written by a forked child (sidecar/outproc.py): the daemon's process never loads
pandas or pyarrow, errors come back with their errno, and the child's CPU is counted."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar import outproc

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

WRITE = """
import json, sys
from pathlib import Path
from sidecar import outproc
from sidecar.classify.classifier import Classifier
from sidecar.parsers import parse_raw
from sidecar.records import ProcessInfo, Role
from sidecar.classify.rules import load_rules
from sidecar.records.window import Window
from sidecar.window.snapshot import build_snapshot
from sidecar.store.folders import Retention, SnapshotStore
from sidecar.store.layout import SnapshotKind

outproc.enable()
raw = Path(sys.argv[1]).read_text()
stacks = parse_raw(raw).stacks
pids = sorted({s.pid for s in stacks if s.pid})
procs = tuple(ProcessInfo(p, 1, 1, ("x",), "x", Role.OTHER) for p in pids)
w = Window(started_at=1_780_000_000.0, duration_s=8.0, rate_hz=20.0, stacks=stacks,
           samples=sum(s.weight for s in stacks), errors=0, sampler_cpu_s=0.0, segments=1)
store = SnapshotStore(Path(sys.argv[2]), "host", Retention(None, None, 1 << 30, 0))
out = store.write(build_snapshot(w, procs, Classifier(load_rules(None))), SnapshotKind.SNAPSHOT)
print(json.dumps({"path": str(out.path), "loaded": sorted(m for m in ("pandas", "pyarrow")
                  if m in sys.modules), "child_cpu_s": outproc.child_cpu_s()}))
"""


def test_a_store_write_in_the_daemon_loads_neither_pandas_nor_pyarrow(tmp_path: Path) -> None:
    raw = ROOT / "tests" / "fixtures" / "matrix" / "0.32.0" / "mixed" / "record.raw.txt"
    done = subprocess.run([sys.executable, "-c", WRITE, str(raw), str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["loaded"] == []
    assert result["child_cpu_s"] > 0
    folder = Path(result["path"])
    assert {p.name for p in folder.iterdir()} == {"summary.json", "stacks.parquet",
                                                  "stacks.collapsed"}  # fmt: skip
    import pyarrow.parquet as pq

    table = pq.read_table(folder / "stacks.parquet")
    assert table.schema.field("pid").type == "int64" and table.num_rows > 0
    assert list((tmp_path / "host" / ".table").glob("*.parquet"))  # the trend table's row


def test_a_childs_error_comes_back_with_its_errno_and_a_result_as_it_was() -> None:
    outproc.enable()
    try:
        assert outproc.call(lambda: ["a", 1]) == ["a", 1]

        def full() -> None:
            raise OSError(errno.ENOSPC, "No space left on device")

        with pytest.raises(OSError) as caught:
            outproc.call(full)
        assert caught.value.errno == errno.ENOSPC and "No space left" in str(caught.value)
    finally:
        outproc.enable(False)

"""The Python interface against the real vLLM CPU server: the README's example
(examples/notebook_quickstart.py) run as a user runs it, a process of its own, with load put on
the server from the moment it says py-spy samples; and `import sidecar` in a fresh interpreter
loading none of the heavy libraries."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from devtools.live_window import wait_idle
from devtools.loadgen import run_load_process
from devtools.server import VllmServer
from sidecar import load
from sidecar.cli import main
from sidecar.commands import SAMPLING_LINE
from sidecar.sampling.pyspy import ATTACH_GRACE_S

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "notebook_quickstart.py"
WINDOW_S = 12.0
LOAD_S = 6.0  # inside the window, with time for the last requests to finish in it
ENV = {**os.environ, "PYTHONUNBUFFERED": "1",
       "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}  # fmt: skip


def test_import_sidecar_loads_nothing_heavy() -> None:
    code = ("import sys, sidecar; from sidecar import Profiler, Snapshot, load, snapshots; "
            "print(sorted(m for m in ('pandas', 'pyarrow', 'pydantic', 'numpy', 'yaml', "
            "'psutil', 'click', 'scipy', 'matplotlib', 'prometheus_client') "
            "if m in sys.modules))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], env=ENV, cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60)  # fmt: skip
    assert out.stdout.strip() == "[]", out


class _Lines:
    """A stream read in a thread; `seen` is set at the first line starting with `prefix`."""

    def __init__(self, stream: object, prefix: str) -> None:
        self.lines: list[str] = []
        self.seen = threading.Event()
        self._prefix = prefix
        self._thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._thread.start()

    def _read(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self.lines.append(line)
            if line.startswith(self._prefix):
                self.seen.set()
        self.seen.set()  # ended: nobody waits for a line that will not come

    def text(self) -> str:
        self._thread.join(10)
        return "".join(self.lines)


def test_the_readme_example_runs_against_the_real_server(
    vllm_server: VllmServer,
    tmp_path: Path,
    started: list[subprocess.Popen[bytes]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    wait_idle(vllm_server)
    out = tmp_path / "profiles"
    argv = [sys.executable, str(EXAMPLE), "--pid", str(vllm_server.pid),
            "--seconds", str(WINDOW_S), "--rate", "20", "--out", str(out)]  # fmt: skip
    began = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                            cwd=tmp_path)  # fmt: skip
    started.append(proc)
    assert proc.stdout is not None and proc.stderr is not None
    stdout = _Lines((line.decode() for line in proc.stdout), "\0")
    stderr = _Lines((line.decode() for line in proc.stderr), SAMPLING_LINE)
    load_result = None
    try:
        if stderr.seen.wait(ATTACH_GRACE_S + 60) and proc.poll() is None:
            load_result = run_load_process(vllm_server.base_url, "mixed", LOAD_S, 8, seed=3)
        code = proc.wait(timeout=WINDOW_S + ATTACH_GRACE_S + 120)
        took = time.monotonic() - began
        text, err = stdout.text(), stderr.text()
    finally:
        proc.kill()  # a no-op once it has exited; the fixture waits for it
        proc.stderr.close()
    with capsys.disabled():
        print(f"\nthe example ran {took:.1f} s ({WINDOW_S:g} s window):\n{text}\n{err}")
    assert code == 0, err
    assert load_result is not None and load_result.requests_ok > 0

    saved = Path(re.search(r"^saved: (.+)$", text, re.M)[1])  # type: ignore[index]
    assert saved.parent == out and (saved / "summary.json").is_file()
    snap = load(saved)
    # the report it printed is the CLI's for the folder it saved
    capsys.readouterr()
    assert main(["report", str(saved)]) == 0
    assert capsys.readouterr().out in text
    # a real window under load: every serving role sampled, vLLM's figures read
    s = snap.summary
    assert {"api_server", "engine_core", "worker"} <= set(s.by_role)
    assert s.serving.requests_finished and s.serving.requests_finished > 0
    assert "[Profile] Throughput:\n- Requests: " in text
    top = text.split("top phases per role:")[1].split("memory:")[0]
    assert all(role in top for role in ("api_server", "engine_core", "worker"))
    memory = text.split("\nmemory:")[1]
    assert "kv_cache" in memory and str(vllm_server.pid) in memory
    assert "store: 1 snapshot(s)" in text and saved.name in text.split("store:")[1]

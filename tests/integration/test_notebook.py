"""examples/quickstart.ipynb run as a reader runs it: a real IPython kernel (nbclient) executes
a copy of it, every cell in order, on the samples the package ships (no vLLM); each step must
show what its text says. The notebook itself is kept without outputs
(tests/unit/project/test_examples.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def shown(cell: Any) -> str:
    """Everything a cell printed or displayed, as text and HTML together."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append(output.get("text", ""))
        data = output.get("data", {})
        parts += [data.get("text/plain", ""), data.get("text/html", "")]
    return "\n".join(parts)


def test_the_quickstart_notebook_runs_on_the_shipped_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUPYTER_PLATFORM_DIRS", "1")  # jupyter_core's own paths, no warning
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # the samples the notebook writes go here
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = NotebookClient(notebook, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})  # fmt: skip
    try:
        client.execute(env=dict(os.environ))
    finally:  # what ran, for a reader of a failure
        nbformat.write(notebook, tmp_path / "executed.ipynb")
    code = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code)
    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, errors
    text = {c.source.split("\n")[0]: shown(c) for c in code}

    def output_of(first_line: str) -> str:
        return next(out for line, out in text.items() if line.startswith(first_line))

    written = output_of("import tempfile")
    assert "vLLM 0.32.0" in written and "kv-starved" in written and "incident" in written
    assert list(tmp_path.glob("vllm-sidecar-*/samples/*/incidents/*-stall"))
    table = output_of("table = sidecar.snapshots(")
    assert "baseline" in table and "share.worker.forward" in table
    display = output_of("latest = sidecar.load(")
    assert 'class="vllm-sidecar-snapshot"' in display and "[Profile] Memory Usage:" in display
    report = output_of("print(latest.report())")
    assert report.startswith("[Snapshot] ") and "[Profile] Computation Time:" in report
    assert "The KV cache ran out" in output_of("for finding in latest.findings()")
    phases = output_of("phases = latest.computation_breakdown()")
    assert all(word in phases for word in ("forward", "attention", "idle", "worker"))
    assert "kv_cache" in output_of("latest.memory_breakdown()")
    assert "model_wait" in output_of("baseline = sidecar.load(")
    assert "preemptions" in output_of("figures = [")
    heaviest = output_of("stacks = latest.stacks()")
    assert "forward" in heaviest and "idle" not in heaviest
    assert "dump-" in output_of("incident = next(")

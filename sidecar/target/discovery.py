"""Which processes form a vLLM deployment, and what role each plays (docs/PHASES.md, "Roles").

vLLM names its processes with `setproctitle` (docs/vllm-internals.md 1): `VLLM::EngineCore`,
`VLLM::EngineCore_DP0`, `VLLM::Worker_TP0`, `VLLM::APIServer_1`, `VLLM::DPCoordinator`. The API
server keeps the command line it was launched with, and vLLM before 2025-07 (#21780) titled
nothing: its helpers are spawned (`python -c "from multiprocessing.spawn import spawn_main ..."`)
or forked copies of their parent, so they are recognised through their parent instead.

A deployment is a tree: API server → EngineCore(s) → workers, plus multiprocessing helpers (the
resource tracker). Its root is the topmost vLLM process of that tree; for an offline `LLM`
client the root is the EngineCore, since the client script is not recognisably vLLM.

A title is only a claim: any local user may run a program titled `vllm serve`. When discovery
finds several servers it prefers those with no evidence against them (`doubts`: the API server
holds no socket listening on its `--port`, or no process of the tree has vLLM's package loaded)
and says why it skipped the others (issue 26, item 19). It filters only to break a tie: a lone
candidate is taken as before, so a server still starting (not listening yet) is found.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.classify.roles import ROLE_PATTERNS, first_role
from sidecar.errors import AttachError, ConfigError
from sidecar.records import ProcessInfo, Role
from sidecar.target.procfs import ProcFs
from sidecar.target.serveflags import api_port, deployment_name

if TYPE_CHECKING:
    from sidecar.config.settings import TargetConfig
    from sidecar.config.targets import TargetSpec

log = logging.getLogger("vllm_sidecar")

# A file of vLLM's own package mapped into a process: its extension modules (`vllm/_C.abi3.so`,
# `_moe_C.abi3.so`, `cumem_allocator.abi3.so`), installed (site-packages, dist-packages) or from
# a source checkout (`.../vllm/vllm/`). Python source files are read and closed, never mapped,
# so these are what /proc shows of `import vllm` (recorded: the CPU build's API server and
# Worker map `vllm/_C.abi3.so`, its EngineCore none; tests/fixtures/proc_listen).
_VLLM_FILE = re.compile(r"/(?:site-packages|dist-packages|vllm)/vllm/")

# Helpers that Python's multiprocessing starts: part of a deployment when their parent is.
MP_CHILD_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        r"\bfrom multiprocessing\.spawn import spawn_main\b",
        r"(?:^|\s)--multiprocessing-fork(?:\s|$)",
        r"\bfrom multiprocessing\.resource_tracker import main\b",
        r"\bfrom multiprocessing\.forkserver import main\b",
    )
)

_ROLE_ORDER = (Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER, Role.OTHER)
SERVING_ROLES = frozenset({Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER})


def _match(info: ProcessInfo) -> Role | None:
    return first_role(ROLE_PATTERNS, info.title)


def role_of(info: ProcessInfo) -> Role:
    """The role that the process's title or command line names; OTHER when it names none."""
    return _match(info) or Role.OTHER


def is_vllm(info: ProcessInfo) -> bool:
    """Whether the process is recognisably vLLM by itself (a helper is known by its parent)."""
    return _match(info) is not None


def is_mp_child(info: ProcessInfo) -> bool:
    """Whether the process is a multiprocessing helper (spawned child, resource tracker)."""
    return any(pattern.search(info.title) for pattern in MP_CHILD_PATTERNS)


@dataclass(frozen=True, slots=True)
class Deployment:
    """One vLLM server's processes, roles set, ordered api_server, engine_core, worker, other."""

    root: ProcessInfo
    processes: tuple[ProcessInfo, ...]

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(info.pid for info in self.processes)

    @property
    def api_server(self) -> ProcessInfo | None:
        """The (first) API server: its command line holds vLLM's flags. None for an offline
        `LLM`, whose EngineCore is the root."""
        return next((p for p in self.processes if p.role is Role.API_SERVER), None)

    @property
    def serving(self) -> tuple[ProcessInfo, ...]:
        """The root and the processes that serve (API server, EngineCore, worker): those the
        deployment cannot lose. Helpers (the resource tracker, a DP coordinator) are not."""
        return tuple(p for p in self.processes if p is self.root or p.role in SERVING_ROLES)

    def still_alive(self, procfs: ProcFs) -> bool:
        """Whether the root and every serving process still run; a PID reused by another process
        does not count. A helper that exits does not end the deployment."""
        return all(procfs.exists(info.key) for info in self.serving)

    def is_remnant_of(self, lost: Deployment) -> bool:
        """Whether this is what is left of `lost` while it shuts down: the same root (PID and
        start time) with fewer serving processes of some role. vLLM's API server outlives its
        dead EngineCore by seconds; attaching to that would profile a server on its way out."""
        if self.root.key != lost.root.key:
            return False
        have = Counter(p.role for p in self.serving)
        had = Counter(p.role for p in lost.serving)
        return any(have[role] < count for role, count in had.items())


def find_deployment(procfs: ProcFs, pid: int, *, allow_non_vllm: bool = False) -> Deployment:
    """The deployment that `pid` (API server, EngineCore, worker or helper) belongs to.

    A Python process that is not part of vLLM is refused unless `allow_non_vllm` (the CLI's
    `--any-python`): attaching to the wrong process by a typo would otherwise profile it quietly.
    With it, that process is the root, with role OTHER, and its multiprocessing helpers join it.
    """
    start = procfs.read(pid)
    if start is None:
        raise AttachError(f"no process {pid}: check the PID, or use --discover")
    if not procfs.is_python(pid):
        raise AttachError(
            f"process {pid} ({start.title}) is not a Python process: point --pid at the vLLM "
            "API server, EngineCore or worker"
        )
    table = procfs.snapshot()
    # Not added to `table`: a thread id has its own /proc entry, but it is no process of its own.
    root = _root_of(start, table)
    if root is None:
        if not allow_non_vllm:
            raise AttachError(
                f"process {pid} ({start.title}) is a Python process but not part of a vLLM "
                "server: point --pid at the vLLM API server, EngineCore or worker, or pass "
                "--any-python to profile it anyway"
            )
        root = start
    return _assemble(root, table)


def discover(procfs: ProcFs) -> list[Deployment]:
    """Every vLLM deployment under `procfs`, newest first (by the root's start time)."""
    table = procfs.snapshot()
    roots: dict[tuple[int, int], ProcessInfo] = {}
    for info in table.values():
        root = _root_of(info, table) if is_vllm(info) else None
        if root is not None:
            roots[root.key] = root
    newest_first = sorted(roots.values(), key=lambda r: (r.start_time, r.pid), reverse=True)
    return [_assemble(root, table) for root in newest_first]


def no_server_error(procfs: ProcFs) -> AttachError:
    """The error for an empty `discover`: how to make a server visible."""
    return AttachError(
        f"no vLLM server found under {procfs.root}: start vLLM, pass --pid, or mount the host's "
        '/proc and pass --proc-root /host_proc (Docker: pid: host or pid: "service:vllm")'
    )


# What to do about several servers, where one was asked for (`snapshot`, `doctor`, the Python
# API): `run --discover` profiles them all (sidecar/daemon/choice.py), each in a folder of its own.
PICK_ONE = (
    "Pick one with --pid PID, or profile them all with `vllm-sidecar run --discover` (each "
    "server in a folder of its own, as `targets: [{discover: true}]` in a --config file does)"
)


class AmbiguousTarget(ConfigError):
    """Discovery found more than one vLLM server. For `snapshot` that is a flag to add (exit 2);
    for the daemon after start it is a failed attempt: during a redeploy the old and the new
    server run side by side for a while.

    `found` says which servers (and why some were skipped), `servers` holds them; the message
    is `found` and how to choose (PICK_ONE), which a daemon may say its own way instead."""

    def __init__(self, found: str, servers: tuple[Deployment, ...] = ()) -> None:
        super().__init__(f"{found}. {PICK_ONE}." if servers else found)
        self.found, self.servers = found, servers

    def choosing(self, how: str) -> str:
        """The message with `how` to choose in place of PICK_ONE."""
        return f"{self.found}. {how}" if self.servers else f"{self}. {how}"


def describe_server(d: Deployment) -> str:
    """`pid 6100 (model qwen2.5-0.5b, port 8001)`: the root PID and what its command line says
    of the model and the port (or Unix socket); its title when it names no model (an offline
    `LLM`, whose root is its EngineCore)."""
    name = deployment_name(d.root.cmdline)
    if name is None:
        return f"pid {d.root.pid} ({d.root.title[:60]})"
    model, _, where = name.rpartition("@")
    return f"pid {d.root.pid} (model {model}, {'port' if where.isdigit() else 'socket'} {where})"


@dataclass(frozen=True, slots=True)
class Doubt:
    """A candidate of discovery with the evidence that it is no vLLM server (`doubts`)."""

    deployment: Deployment
    uid: int | None  # the root's user
    reasons: tuple[str, ...]

    def __str__(self) -> str:
        user = "uid unknown" if self.uid is None else f"uid {self.uid}"
        return f"pid {self.deployment.root.pid} ({user}): {'; '.join(self.reasons)}"


def doubts(procfs: ProcFs, d: Deployment) -> tuple[str, ...]:
    """Evidence that `d`, taken for a vLLM server by its titles, is none; () when there is none.

    - An API server root listens on its `--port` (8000 by default; no check with `--uds`): the
      socket listening on it in the root's network namespace (`/proc/PID/net/tcp{,6}`) must be
      held by a process of the tree (`/proc/PID/fd`; the API server holds it, its EngineCore
      does not; with `--api-server-count`, the API server processes share it). Evidence is
      that nothing listens there, or that every process's sockets could be read and none is it.
    - Some process of the tree maps a file of vLLM's package (`_VLLM_FILE`). Evidence is that
      every process's `maps` could be read and none does.
    What cannot be read (`fd` and `maps` need ptrace-read) is no evidence either way.
    """
    reasons = []
    root = d.root
    port = api_port(root.cmdline) if root.role is Role.API_SERVER else None
    if port is not None:
        listening = procfs.listening_inodes(root.pid, port)
        held = [procfs.socket_inodes(p.pid) for p in d.processes]
        if listening is not None and not listening:
            reasons.append(f"nothing listens on port {port}")
        elif listening and not any(h is None or h & listening for h in held):
            reasons.append(f"holds no socket listening on port {port}")
    maps = [procfs.mapped_files(p.pid) for p in d.processes]
    if not any(m is None or any(_VLLM_FILE.search(path) for path in m) for m in maps):
        reasons.append("has no module of vLLM's package loaded (none in its memory maps)")
    return tuple(reasons)


def screen(procfs: ProcFs, found: list[Deployment]) -> tuple[list[Deployment], list[Doubt]]:
    """Break a tie between discovered servers: those without `doubts` are kept, the others
    returned with their reasons. When every one has some, all are kept (nothing to prefer)."""
    judged = [(d, doubts(procfs, d)) for d in found]
    kept = [d for d, reasons in judged if not reasons]
    skipped = [Doubt(d, procfs.uid(d.root.pid), r) for d, r in judged if r]
    return (kept or list(found)), skipped


def resolve_target(procfs: ProcFs, pid: int | None, any_python: bool = False) -> Deployment:
    """The deployment `pid` belongs to, or the one vLLM server discovery finds.

    A lone candidate is taken as it is. Between several, those with evidence that they are no
    vLLM server (`doubts`) are skipped, and logged with why; when exactly one is left it is
    the target, otherwise discovery is ambiguous and the error lists the servers and the
    reasons."""
    if pid is not None:
        return find_deployment(procfs, pid, allow_non_vllm=any_python)
    found = discover(procfs)
    if not found:
        raise no_server_error(procfs)
    if len(found) == 1:
        return found[0]
    kept, doubted = screen(procfs, found)
    skipped = [d for d in doubted if d.deployment not in kept]
    if len(kept) == 1:
        log.warning("found %d vLLM servers; profiling pid %d (%s); skipped %s", len(found),
                    kept[0].root.pid, kept[0].root.title[:60],
                    "; skipped ".join(map(str, skipped)))  # fmt: skip
        return kept[0]
    listing = "; ".join(describe_server(d) for d in kept)
    why = ""
    if skipped:
        why = " (skipped " + "; skipped ".join(map(str, skipped)) + ")"
    elif doubted:  # every one has some: said, but none is preferred
        why = " (none shows that it serves: " + "; ".join(map(str, doubted)) + ")"
    raise AmbiguousTarget(f"found {len(kept)} vLLM servers: {listing}{why}", tuple(kept))


def servers_found(procfs: ProcFs) -> list[Deployment]:
    """The vLLM servers discovery would choose between, newest first: every one it finds, less
    those with evidence that they are none beside one without (`screen`), as `resolve_target`
    chooses; `run --discover` profiles them all when they are several."""
    found = discover(procfs)
    return screen(procfs, found)[0] if len(found) > 1 else found


def configured_target(procfs: ProcFs, t: TargetConfig) -> Deployment:
    """The deployment a daemon config names: its pid, the pid in its pid file, or discovery."""
    pid = t.pid
    if t.pid_file is not None:
        pid = read_pid_file(t.pid_file)
    elif pid is None and not t.discover:
        raise ConfigError("no target: set target.pid, target.pid_file or target.discover")
    return resolve_target(procfs, pid, t.any_python)


@dataclass(frozen=True, slots=True)
class DeploymentId:
    """Which vLLM server a deployment is, across its restarts: `model@port` names its folder
    (OUT/<host>/<name>/) and its exporter series; `root_start` tells one run from the next."""

    name: str
    model: str
    port: str
    root_start: int  # the root's start time, clock ticks since boot (field 22 of its stat)


_UNSAFE = re.compile(r"[^A-Za-z0-9._@+=-]")


def deployment_id(d: Deployment) -> DeploymentId:
    """The deployment's name from its root's command line (serveflags.deployment_name); an
    offline `LLM` (root: the EngineCore, no model on its command line) is `pid-<root pid>`.
    A `/` (a `--uds` path) or any character unsafe in a folder name becomes `_`."""
    name = deployment_name(d.root.cmdline) or f"pid-{d.root.pid}@"
    model, _, port = name.rpartition("@")
    safe = _UNSAFE.sub("_", name.rstrip("@")).lstrip(".") or f"pid-{d.root.pid}"
    return DeploymentId(safe, model, port, d.root.start_time)


def find_all(
    procfs: ProcFs, specs: tuple[TargetSpec, ...], any_python: bool = False
) -> tuple[list[tuple[Deployment, TargetSpec]], list[str]]:
    """Every deployment the `targets:` entries name, each once (by root PID and start time;
    the first entry that names it wins, with its metrics_url), and why an entry found none.
    Finding none is no error here: the fleet daemon waits and rediscovers."""
    found: dict[tuple[int, int], tuple[Deployment, TargetSpec]] = {}
    missing: list[str] = []
    for spec in specs:
        try:
            if spec.discover:
                deployments = discover(procfs)
            else:
                pid = spec.pid if spec.pid_file is None else read_pid_file(spec.pid_file)
                assert pid is not None  # target_spec: exactly one of pid, pid_file, discover
                deployments = [find_deployment(procfs, pid, allow_non_vllm=any_python)]
        except AttachError as exc:
            missing.append(f"{spec.describe()}: {exc}")
            continue
        if not deployments:  # said with the fix, as the single target's discovery says it
            missing.append(f"{spec.describe()}: {no_server_error(procfs)}")
        for d in deployments:
            found.setdefault(d.root.key, (d, spec))
    return list(found.values()), missing


def read_pid_file(path: Path) -> int:
    """The PID in `path`: a regular file, of which the first 64 bytes are read. Opened
    non-blocking, so that a FIFO or a device there cannot stall discovery (issue 26, item 19)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise AttachError(
                    f"pid file {path} is not a regular file; point target.pid_file at the file "
                    "vLLM's service writes its PID to"
                )
            head = os.read(fd, 64).decode("ascii", errors="replace")
        finally:
            os.close(fd)
        return int(head.split()[0])
    except FileNotFoundError:
        raise AttachError(f"pid file {path} does not exist (yet): is vLLM running?") from None
    except (OSError, ValueError, IndexError) as exc:
        raise AttachError(f"pid file {path} holds no PID: {exc}") from None


def _root_of(info: ProcessInfo, table: dict[int, ProcessInfo]) -> ProcessInfo | None:
    """The topmost vLLM process above `info` (itself included), climbing through vLLM processes
    and multiprocessing helpers; None when that chain holds no vLLM process."""
    root = info if is_vllm(info) else None
    seen = {info.pid}
    parent = table.get(info.ppid)
    while parent is not None and parent.pid not in seen and _belongs(parent):
        if is_vllm(parent):
            root = parent
        seen.add(parent.pid)
        parent = table.get(parent.ppid)
    return root


def _belongs(info: ProcessInfo) -> bool:
    return is_vllm(info) or is_mp_child(info)


def _assemble(root: ProcessInfo, table: dict[int, ProcessInfo]) -> Deployment:
    """The root and, recursively, its children that are vLLM or multiprocessing helpers."""
    children: dict[int, list[ProcessInfo]] = {}
    for info in table.values():
        children.setdefault(info.ppid, []).append(info)
    root = replace(root, role=role_of(root))
    members = [root]
    pending = [root]
    while pending:
        parent = pending.pop()
        for child in children.get(parent.pid, []):
            if child.pid != root.pid and _belongs(child):
                members.append(replace(child, role=_member_role(child, parent)))
                pending.append(child)
    members.sort(key=lambda p: (_ROLE_ORDER.index(p.role), p.start_time, p.pid))
    return Deployment(root=root, processes=tuple(members))


def _member_role(child: ProcessInfo, parent: ProcessInfo) -> Role:
    # A forked child shows its parent's command line until it retitles itself (always, before
    # vLLM had titles): a copy of the API server's cmdline under the API server is an EngineCore
    # or a worker that we cannot tell apart here. OTHER; the classifier decides from its stacks.
    if child.cmdline == parent.cmdline:
        return Role.OTHER
    return role_of(child)

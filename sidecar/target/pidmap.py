"""Which PID a process has in which PID namespace, read from the `NSpid:` lines of `/proc`.

NVML reports the PIDs of the *host's* PID namespace, wherever it is called from: the driver
does not know about PID namespaces (NVIDIA/nvidia-docker#1483, "you will always get the host
pids, not the container pids"). The sidecar knows its targets by the PIDs of the `/proc` it
reads (`--proc-root`), and vLLM logs the PIDs of its own container. This module joins them.

`NSpid:` in `/proc/PID/status` lists the PID in every namespace from the one that *mounted that
`/proc`* down to the process's own (innermost) one (proc(5)), so:

- the host's `/proc` (the live one with `pid: host`, or mounted at `/host_proc`):
  `NSpid: 412455 154` -> host 412455, local 154; the first entry is the directory name.
- a container's own `/proc`: `NSpid: 154` -> local 154; the host PID is not visible from
  inside, so it is looked up in the host's `/proc` when one is mounted, else left unknown.
- nested namespaces (Docker in Docker, sysbox): `NSpid: 523117 3301 1`, three entries.

"Local" is always the innermost PID: the one the process sees itself as and vLLM prints
(`(Worker_TP0 pid=154)`). Which namespace a given NVML call answered in is never assumed:
`PidMap.match` tries every PID a target has, and says which one matched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sidecar.records import ProcessInfo
from sidecar.records.gpu import PidMatch
from sidecar.target.procfs import ProcFs

# When one number is the host PID of one target and the local PID of another, trust the
# namespace NVML is known to answer in (nvidia-docker#1483) first.
_PRIORITY = (PidMatch.HOST, PidMatch.LOCAL, PidMatch.VIEW)


@dataclass(frozen=True, slots=True)
class NsPid:
    """One target process, by its PID in each namespace we could learn."""

    view: int  # the PID as the /proc we read lists it (the one discovery and py-spy use)
    nspid: tuple[int, ...]  # that /proc's NSpid line: its namespace first, innermost last
    host: int | None  # in the host's namespace; None when neither /proc shows it

    @property
    def local(self) -> int:
        return self.nspid[-1] if self.nspid else self.view

    def pid_in(self, namespace: PidMatch) -> int | None:
        if namespace is PidMatch.HOST:
            return self.host
        if namespace is PidMatch.LOCAL:
            return self.local
        return self.view if namespace is PidMatch.VIEW else None


def is_host_namespace(procfs: ProcFs) -> bool:
    """Whether `procfs` belongs to the host's PID namespace.

    Kernel threads live in the initial namespace only, so `kthreadd` (PID 2, parent 0) is
    visible in the host's `/proc` and in no container's.
    """
    info = procfs.read(2)
    return info is not None and info.ppid == 0 and info.title == "[kthreadd]"


class PidMap:
    """A two-way map between the host's PIDs and the targets' own, built once per deployment."""

    def __init__(self, entries: Iterable[NsPid], missing: Iterable[int] = ()) -> None:
        self.entries = tuple(entries)
        self.missing = tuple(missing)  # targets that vanished before we could read them
        self._by: dict[PidMatch, dict[int, list[NsPid]]] = {ns: {} for ns in _PRIORITY}
        for entry in self.entries:
            for namespace in _PRIORITY:
                pid = entry.pid_in(namespace)
                if pid is not None:
                    self._by[namespace].setdefault(pid, []).append(entry)

    def __repr__(self) -> str:
        return f"PidMap({list(self.entries)!r})"

    @classmethod
    def build(
        cls,
        procfs: ProcFs,
        pids_of_interest: Iterable[int],
        *,
        host_procfs: ProcFs | None = None,
        host_view: bool | None = None,
    ) -> PidMap:
        """Read the NSpid line of each target under `procfs` (the `--proc-root`).

        `host_view` says whether `procfs` is the host's `/proc`; None detects it. When it is
        not, `host_procfs` (the host's `/proc` mounted into the container) supplies host PIDs.
        """
        if host_view is None:
            host_view = is_host_namespace(procfs)
        found: list[ProcessInfo] = []
        missing: list[int] = []
        for pid in pids_of_interest:
            info = procfs.read(pid)
            if info is None:
                missing.append(pid)
            else:
                found.append(info)
        chains = {info.pid: info.nspid or (info.pid,) for info in found}
        if host_view:
            hosts: dict[int, int | None] = {pid: chain[0] for pid, chain in chains.items()}
        elif host_procfs is not None:
            hosts = _hosts_from(host_procfs, found, chains)
        else:
            hosts = dict.fromkeys(chains)
        entries = (NsPid(view=pid, nspid=chain, host=hosts[pid]) for pid, chain in chains.items())
        return cls(entries, missing)

    @classmethod
    def from_pairs(cls, host_to_local: Mapping[int, int]) -> PidMap:
        """A map from known pairs (host PID -> local PID), targets named by their local PID."""
        return cls(
            NsPid(view=local, nspid=(host, local) if host != local else (host,), host=host)
            for host, local in host_to_local.items()
        )

    @property
    def unmapped(self) -> tuple[int, ...]:
        """Targets (by view PID) whose host PID is unknown: NVML's PIDs cannot reach them."""
        return tuple(entry.view for entry in self.entries if entry.host is None)

    def candidates(self, pid: int) -> list[tuple[NsPid, PidMatch]]:
        """Every target that `pid` could be, with the namespace it would be in, most likely first.

        More than one distinct target means the number is ambiguous (one target's host PID is
        another's local PID); callers take the first and may say so.
        """
        found: list[tuple[NsPid, PidMatch]] = []
        for namespace in _PRIORITY:
            for entry in self._by[namespace].get(pid, ()):
                if all(entry is not seen for seen, _ in found):
                    found.append((entry, namespace))
        return found


def _hosts_from(
    host_procfs: ProcFs, found: list[ProcessInfo], chains: Mapping[int, tuple[int, ...]]
) -> dict[int, int | None]:
    """Find each target in the host's `/proc`: its NSpid ends with the chain we saw.

    A short chain such as `(1,)` is the init of every container, so the start time (clock
    ticks since boot, the same in every PID namespace) decides between them. A time namespace
    would shift it; then a chain that only one host process ends with is still taken.
    """
    wanted = {(chains[info.pid], info.start_time): info.pid for info in found}
    lengths = {len(chain) for chain in chains.values()}
    hosts: dict[int, int | None] = dict.fromkeys(chains)
    by_tail: dict[tuple[int, ...], list[int]] = {}
    for host in host_procfs.snapshot().values():
        nspid = host.nspid or (host.pid,)
        for length in lengths:
            tail = nspid[-length:]
            target = wanted.get((tail, host.start_time))
            if target is not None:
                hosts[target] = nspid[0]
            by_tail.setdefault(tail, []).append(nspid[0])
    for pid, chain in chains.items():
        if hosts[pid] is None and len(by_tail.get(chain, ())) == 1:
            hosts[pid] = by_tail[chain][0]
    return hosts

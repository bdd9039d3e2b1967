"""The TCP connections a server process holds, read from `/proc` (proc(5)): which of its
sockets listen, and which are clients' connections to those ports.

The hang watch reads them (sidecar/daemon/hang.py): a client's connection that the API server
keeps open while no request finishes is a request it accepted and has not answered, evidence
that work is pending which a frozen EngineCore cannot freeze (vLLM's own gauges come from the
engine's last scheduler stats).

`/proc/PID/net/tcp{,6}` lists every socket of PID's network namespace (readable from another
namespace, a sidecar's included); `/proc/PID/fd` says which of them PID holds (it needs
ptrace-read access, as py-spy does).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

LISTEN, ESTABLISHED = 0x0A, 0x01  # the `st` column (include/net/tcp_states.h)
_GONE = (FileNotFoundError, ProcessLookupError, PermissionError, NotADirectoryError)


@dataclass(frozen=True, slots=True)
class TcpSocket:
    local_port: int
    remote_port: int
    state: int
    inode: int


def parse_net_tcp(text: str) -> list[TcpSocket]:
    """The rows of `/proc/net/tcp` or `tcp6`: `sl local_address rem_address st tx:rx tr:when
    retrnsmt uid timeout inode ...`, addresses as `HEXADDR:HEXPORT`. Malformed rows are left
    out."""
    out = []
    for line in text.splitlines()[1:]:
        cols = line.split()
        if len(cols) < 10:
            continue
        try:
            local, remote = cols[1].rsplit(":", 1)[1], cols[2].rsplit(":", 1)[1]
            out.append(TcpSocket(int(local, 16), int(remote, 16), int(cols[3], 16), int(cols[9])))
        except (IndexError, ValueError):
            continue
    return out


def socket_inodes(fd_targets: list[str]) -> frozenset[int]:
    """The socket inodes among a process's `fd` link targets (`socket:[12345]`)."""
    found = set()
    for target in fd_targets:
        if target.startswith("socket:[") and target.endswith("]"):
            inner = target[len("socket:[") : -1]
            if inner.isdigit():
                found.add(int(inner))
    return frozenset(found)


def served_connections(sockets: list[TcpSocket], held: frozenset[int]) -> frozenset[int]:
    """The inodes of the established connections, among the sockets the process holds
    (`held`), whose local port is one the process listens on: its clients' connections."""
    mine = [s for s in sockets if s.inode in held]
    ports = {s.local_port for s in mine if s.state == LISTEN}
    return frozenset(s.inode for s in mine if s.state == ESTABLISHED and s.local_port in ports)


def client_connections(root: Path, pid: int) -> frozenset[int] | None:
    """The clients' connections `pid` holds open on the ports it listens on (socket inodes),
    read under the `/proc` tree `root`; None when its `fd` or `net` cannot be read."""
    base = root / str(pid)
    try:
        targets = []
        for name in os.listdir(base / "fd"):
            try:
                targets.append(os.readlink(base / "fd" / name))
            except OSError:  # closed while we read
                continue
        sockets = []
        for table in ("tcp", "tcp6"):
            try:
                sockets += parse_net_tcp((base / "net" / table).read_text())
            except FileNotFoundError:  # no IPv6 in this kernel
                continue
    except (*_GONE, OSError):
        return None
    return served_connections(sockets, socket_inodes(targets))

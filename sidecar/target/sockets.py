"""The TCP connections a server process holds, read from `/proc` (proc(5)): which of its
sockets listen, and which are clients' connections to those ports.

The hang watch reads them (sidecar/daemon/hang.py): a client's connection that the API server
keeps open while no request finishes is a request it accepted and has not answered, evidence
that work is pending which a frozen EngineCore cannot freeze (vLLM's own gauges come from the
engine's last scheduler stats).

`/proc/PID/net/tcp{,6}` lists every socket of PID's network namespace (readable from another
namespace, a sidecar's included); `/proc/PID/fd` says which of them PID holds (it needs
ptrace-read access, as py-spy does). `ProcFs` reads them (`tcp_sockets`, `socket_inodes`,
`client_connections`); this module only parses.
"""

from __future__ import annotations

from dataclasses import dataclass

LISTEN, ESTABLISHED = 0x0A, 0x01  # the `st` column (include/net/tcp_states.h)


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


def socket_inode(target: str) -> int | None:
    """The inode of a socket from an `fd` link's target (`socket:[12345]`); None otherwise."""
    if target.startswith("socket:[") and target.endswith("]"):
        inner = target[len("socket:[") : -1]
        return int(inner) if inner.isdigit() else None
    return None


def served_connections(sockets: list[TcpSocket], held: frozenset[int]) -> frozenset[int]:
    """The inodes of the established connections, among the sockets the process holds
    (`held`), whose local port is one the process listens on: its clients' connections."""
    mine = [s for s in sockets if s.inode in held]
    ports = {s.local_port for s in mine if s.state == LISTEN}
    return frozenset(s.inode for s in mine if s.state == ESTABLISHED and s.local_port in ports)

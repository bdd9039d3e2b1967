"""Role detection and deployment discovery over fixture /proc trees (tests/fixtures/proc)."""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path

import pytest

from sidecar.classify import classifier
from sidecar.classify.classifier import Classifier
from sidecar.classify.roles import title_role
from sidecar.classify.rules import load_rules
from sidecar.errors import AttachError
from sidecar.parsers import parse_text
from sidecar.records import ProcessInfo, Role
from sidecar.target.discovery import (
    AmbiguousTarget,
    Deployment,
    discover,
    doubts,
    find_deployment,
    is_mp_child,
    is_vllm,
    no_server_error,
    read_pid_file,
    resolve_target,
    role_of,
)
from sidecar.target.procfs import ProcFs

RULES = load_rules()

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "proc"
VENV = "/root/.cache/vllm-sidecar/vllm-venv/bin/python"
SPAWN = "from multiprocessing.spawn import spawn_main; spawn_main(tracker_fd=5, pipe_handle=7)"

API, ENGINE, WORKER, OTHER = Role.API_SERVER, Role.ENGINE_CORE, Role.WORKER, Role.OTHER


def fixture(scenario: str) -> ProcFs:
    return ProcFs(FIXTURES / scenario)


def process(*cmdline: str) -> ProcessInfo:
    return ProcessInfo(
        pid=10, start_time=1, ppid=1, cmdline=cmdline, title=" ".join(cmdline) or "[x]"
    )


def roles(deployment: Deployment) -> list[tuple[int, Role]]:
    return [(p.pid, p.role) for p in deployment.processes]


# --- role_of / is_vllm: rows name the vLLM version they come from ---------------------------------

ROLE_ROWS = [
    # (cmdline, role, is_vllm, where it comes from)
    (("VLLM::Worker",), WORKER, True, "U: before init_device; CPU TP=1"),
    (("VLLM::Worker_TP0",), WORKER, True, "U"),
    (("VLLM::Worker_PP1_TP3",), WORKER, True, "U"),
    (("VLLM::Worker_DP1_EP3",), WORKER, True, "U"),
    (("VLLM::EngineCore_TP0",), WORKER, True, "0.10: suffix appended to the engine title"),
    (("VLLM::DPEngineCore_1_TP1",), WORKER, True, "0.10"),
    (("VLLM::EngineCore",), ENGINE, True, "U"),
    (("VLLM::EngineCore_DP1",), ENGINE, True, "U, since 2025-09"),
    (("VLLM::DPEngineCore_1",), ENGINE, True, "0.10"),
    (("VLLM::APIServer_0",), API, True, "U: --api-server-count 2"),
    (("VLLM::DPCoordinator",), OTHER, True, "U"),
    (("VLLM::KVTransfer",), OTHER, True, "a title vLLM may add"),
    (("VLLM::WorkerFoo",), OTHER, True, "not the worker grammar, still vLLM"),
    (("prod-llm::Worker_TP1",), WORKER, True, "VLLM_PROCESS_NAME_PREFIX=prod-llm"),
    (("prod-llm::EngineCore",), ENGINE, True, "VLLM_PROCESS_NAME_PREFIX=prod-llm"),
    (("prod-llm::Helper",), OTHER, False, "unknown name under a custom prefix"),
    (("ray::Worker",), OTHER, False, "a Ray actor named Worker"),
    (("ray::IDLE",), OTHER, False, "Ray"),
    ((VENV, "-m", "vllm.entrypoints.openai.api_server", "--model", "/x"), API, True, "V0, V1"),
    (("/usr/local/bin/vllm", "serve", "m"), API, True, "console script"),
    (("/usr/bin/python3", "/usr/local/bin/vllm", "serve", "m"), API, True, "via shebang"),
    (("python3", "-X", "dev", "-u", "-m", "vllm.entrypoints.openai.api_server"), API, True, ""),
    (("python3", "-m", "vllm.entrypoints.cli.main", "serve", "m"), API, True, "U"),
    (("python3", "/src/vllm/vllm/entrypoints/openai/api_server.py", "--model", "m"), API, True, ""),
    (("python3", "-m", "vllm.entrypoints.api_server", "--model", "m"), API, True, "V0 demo"),
    (("vllm", "bench", "serve", "--model", "m"), OTHER, False, "a benchmark client"),
    (("bash", "-c", "vllm serve m"), OTHER, False, "a wrapper shell"),
    (("uv", "run", "vllm", "serve", "m"), OTHER, False, "uv's child is the server"),
    (("python3", "-m", "pytest", "-k", "vllm serve"), OTHER, False, "mentions vLLM"),
    (("vllm-sidecar", "attach", "--pid", "4100"), OTHER, False, "ourselves"),
    ((VENV, "-c", SPAWN, "--multiprocessing-fork"), OTHER, False, "known by its parent"),
    ((), OTHER, False, "kernel thread"),
]


@pytest.mark.parametrize(
    ("cmdline", "role", "vllm", "origin"), ROLE_ROWS, ids=[" ".join(r[0]) for r in ROLE_ROWS]
)
def test_role_of(cmdline: tuple[str, ...], role: Role, vllm: bool, origin: str) -> None:
    info = process(*cmdline)
    assert role_of(info) is role, origin
    assert is_vllm(info) is vllm, origin


# --- one place reads a role from a title: discovery and the classifier agree ---------------------


@pytest.mark.parametrize(
    ("cmdline", "role", "vllm", "origin"), ROLE_ROWS, ids=[" ".join(r[0]) for r in ROLE_ROWS]
)
def test_the_classifier_reads_titles_as_discovery_does(
    cmdline: tuple[str, ...], role: Role, vllm: bool, origin: str
) -> None:
    """The same title, as /proc shows it and as py-spy prints it (`Process PID: TITLE`), gives
    the same role with no stack markers to go by. The rules file used to hold its own title
    regexes, which took `VLLM::EngineCore_TP0` (a vLLM 0.10 worker) for an EngineCore and a Ray
    actor titled `ray::Worker` for a vLLM worker."""
    title = process(*cmdline).title
    assert classifier.role_of(RULES, (), title) is role_of(process(*cmdline)) is role, origin


# The names vLLM prefixes its log lines with, `(NAME pid=N) `, which a pasted stack keeps as its
# process: (name, role, where it comes from). None of them is a /proc title.
LOG_TAGS = [
    ("VllmWorkerProcess", WORKER, "V0-0.7 multiproc worker"),
    ("VllmWorker-0", WORKER, "V1-0.8 multiprocessing name"),
    ("VllmWorker TP0", WORKER, "V1-0.10"),
    ("Worker", WORKER, "U: the title without VLLM::"),
    ("Worker_TP1", WORKER, "U"),
    ("Worker_PP1_TP3", WORKER, "U"),
    ("Worker (TP1)", WORKER, "the pid-less tag the parsers read"),
    ("EngineCore_TP0", WORKER, "0.10's worker title without VLLM::"),
    ("EngineCore_0", ENGINE, "V1-0.8"),
    ("EngineCore", ENGINE, "U"),
    ("EngineCore_DP1", ENGINE, "U"),
    ("APIServer", API, "U: decorate_logs('APIServer')"),
    ("ApiServer_1", API, "U: multiprocessing name with --api-server-count"),
    ("Workers", OTHER, "not vLLM's"),
    ("MyWorker", OTHER, "not vLLM's"),
]


@pytest.mark.parametrize(("tag", "role", "origin"), LOG_TAGS, ids=[t[0] for t in LOG_TAGS])
def test_log_tags_name_roles_for_the_classifier_only(tag: str, role: Role, origin: str) -> None:
    assert (title_role(tag) or OTHER) is role, origin
    assert classifier.role_of(RULES, (), tag) is role, origin
    assert not is_vllm(process(tag)), "a log tag is no /proc title: discovery ignores it"


def test_a_pasted_worker_log_is_read_as_a_worker() -> None:
    """End to end: the tag of a pasted line reaches the classifier through the parser."""
    paste = (
        '(VllmWorker TP0 pid=812) Thread 812 (idle): "MainThread"\n'
        "(VllmWorker TP0 pid=812)     wait (threading.py:355)\n"
    )
    (stack,) = parse_text(paste).stacks
    assert Classifier(RULES).classify(stack).role is WORKER


@pytest.mark.parametrize(
    ("title", "frame", "role"),
    [
        ("ray::Worker", None, OTHER),
        ("ray::RayWorkerWrapper.execute_method", "execute_method (vllm/executor/ray_utils.py:1)", WORKER),
        ("VLLM::EngineCore_TP0", "run_engine_core (vllm/v1/engine/core.py:1)", WORKER),
        ("VLLM::EngineCore", "worker_main (vllm/v1/executor/multiproc_executor.py:1)", WORKER),
        ("VLLM::APIServer_0", "run_engine_core (vllm/v1/engine/core.py:1)", ENGINE),
        ("VLLM::Worker_TP0", "run_server (vllm/entrypoints/openai/api_server.py:1)", WORKER),
    ],
)  # fmt: skip
def test_the_most_specific_of_title_and_stack_wins(
    title: str, frame: str | None, role: Role
) -> None:
    """A forked child keeps its parent's title and root frames: the most specific role wins."""
    frames = parse_text(f"Thread 1 (idle)\n    {frame}\n").stacks[0].frames if frame else ()
    assert classifier.role_of(RULES, frames, title) is role


@pytest.mark.parametrize(
    ("cmdline", "expected"),
    [
        ((VENV, "-c", SPAWN, "--multiprocessing-fork"), True),
        ((VENV, "-c", "from multiprocessing.resource_tracker import main;main(27)"), True),
        (("python3", "-c", "from multiprocessing.forkserver import main; main(3, 4)"), True),
        (("python3", "-m", "torch._inductor.compile_worker"), False),
        (("VLLM::EngineCore",), False),
    ],
)
def test_is_mp_child(cmdline: tuple[str, ...], expected: bool) -> None:
    assert is_mp_child(process(*cmdline)) is expected


# --- find_deployment -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pid", [4100, 4187, 4262, 4105], ids=["api", "engine", "worker", "tracker"]
)
def test_any_pid_finds_the_whole_v1_cpu_deployment(pid: int) -> None:
    deployment = find_deployment(fixture("v1_cpu"), pid)
    assert deployment.root.pid == 4100
    assert deployment.root.role is API
    # Not the zombie lscpu, the shell, nor the unrelated Python job.
    assert roles(deployment) == [(4100, API), (4187, ENGINE), (4262, WORKER), (4105, OTHER)]
    assert deployment.pids == (4100, 4187, 4262, 4105)
    assert [p.key for p in deployment.processes[:2]] == [(4100, 1523407), (4187, 1524211)]


def test_tp2_in_a_container() -> None:
    deployment = find_deployment(fixture("tp2"), 7151)
    assert deployment.root.pid == 7001  # not the containerd shim above it
    assert roles(deployment) == [
        (7001, API),
        (7090, ENGINE),
        (7150, WORKER),
        (7151, WORKER),
        (7003, OTHER),
    ]
    assert [p.title for p in deployment.processes if p.role is WORKER] == [
        "VLLM::Worker_TP0",
        "VLLM::Worker_TP1",
    ]
    assert deployment.root.nspid == (7001, 1)


def test_data_parallel_with_two_api_servers() -> None:
    deployment = find_deployment(fixture("dp2"), 8111)
    assert roles(deployment) == [
        (8000, API),  # `vllm serve` running run_multi_api_server
        (8010, API),
        (8011, API),
        (8030, ENGINE),
        (8031, ENGINE),
        (8100, WORKER),
        (8101, WORKER),
        (8110, WORKER),
        (8111, WORKER),
        (8020, OTHER),  # VLLM::DPCoordinator
    ]


def test_the_api_server_is_the_first_one_and_none_for_an_offline_llm() -> None:
    """Every reader of vLLM's flags (the fingerprint, the metrics URL, the GPUs' world size,
    the KV cache) takes the API server from here."""
    assert find_deployment(fixture("dp2"), 8111).api_server.pid == 8000  # type: ignore[union-attr]
    engine = dataclasses.replace(process("VLLM::EngineCore"), role=ENGINE)
    worker = dataclasses.replace(process("VLLM::Worker_TP0"), pid=11, role=WORKER)
    assert Deployment(engine, (engine, worker)).api_server is None  # LLM(...): no API server


def test_pre_title_spawned_helpers_are_found_through_their_parent() -> None:
    deployment = find_deployment(fixture("pre_title_spawn"), 3251)
    assert deployment.root.pid == 3100
    # torch.compile's worker pool (3300, 3301) is a child of a worker but not vLLM's.
    assert roles(deployment) == [
        (3100, API),
        (3104, OTHER),
        (3180, OTHER),
        (3250, OTHER),
        (3251, OTHER),
    ]


def test_pre_title_forked_copies_are_not_taken_for_api_servers() -> None:
    deployment = find_deployment(fixture("pre_title_fork"), 2241)
    assert deployment.root.pid == 2100
    assert roles(deployment) == [
        (2100, API),
        (2105, OTHER),
        (2180, OTHER),
        (2240, OTHER),
        (2241, OTHER),
    ]


def test_a_vanished_worker_is_left_out() -> None:
    assert find_deployment(fixture("vanished"), 5187).pids == (5100, 5187)


@pytest.mark.parametrize(
    ("scenario", "pid", "message"),
    [
        ("v1_cpu", 99999, "no process 99999: check the PID, or use --discover"),
        ("vanished", 5262, "no process 5262: check the PID, or use --discover"),
        (
            "v1_cpu",
            4300,
            "process 4300 (sleep infinity) is not a Python process: point --pid at the vLLM "
            "API server, EngineCore or worker",
        ),
        ("v1_cpu", 2, "process 2 ([kthreadd]) is not a Python process"),
        (
            "v1_cpu",
            4310,
            "process 4310 (/usr/bin/python3 /srv/jobs/batch.py --shards 4) is a Python process "
            "but not part of a vLLM server: point --pid at the vLLM API server, EngineCore or "
            "worker, or pass --any-python to profile it anyway",
        ),
        ("v1_cpu", 4311, "is a Python process but not part of a vLLM server"),
    ],
)
def test_find_deployment_errors_name_the_fix(scenario: str, pid: int, message: str) -> None:
    with pytest.raises(AttachError) as raised:
        find_deployment(fixture(scenario), pid)
    assert message in str(raised.value)


def test_any_python_profiles_a_non_vllm_program_and_its_helpers() -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4310, allow_non_vllm=True)
    assert deployment.root.pid == 4310
    assert roles(deployment) == [(4310, OTHER), (4311, OTHER)]


def test_this_test_process_is_python_but_not_vllm() -> None:
    procfs = ProcFs()
    me = procfs.read(os.getpid())
    assert me is not None
    assert role_of(me) is OTHER
    assert not is_vllm(me)
    with pytest.raises(AttachError, match="--any-python"):
        find_deployment(procfs, os.getpid())
    deployment = find_deployment(procfs, os.getpid(), allow_non_vllm=True)
    assert deployment.root.key == me.key
    assert deployment.still_alive(procfs)


# --- still_alive ---------------------------------------------------------------------------------


def test_still_alive_while_every_process_runs() -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4100)
    assert deployment.still_alive(fixture("v1_cpu"))


def test_not_alive_after_a_restart_that_reused_every_pid() -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4100)
    restarted = fixture("pid_reuse")
    assert find_deployment(restarted, 4100).pids == deployment.pids
    assert not deployment.still_alive(restarted)


def test_not_alive_when_a_process_is_gone(tmp_path: Path) -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4100)
    assert not deployment.still_alive(ProcFs(tmp_path))


def without(tmp_path: Path, scenario: str, *pids: int) -> ProcFs:
    """A copy of a recorded /proc with some processes gone."""
    shutil.copytree(FIXTURES / scenario, tmp_path / scenario, symlinks=True)
    for pid in pids:
        shutil.rmtree(tmp_path / scenario / str(pid))
    return ProcFs(tmp_path / scenario)


def test_a_helper_that_exits_does_not_end_the_deployment(tmp_path: Path) -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4100)
    assert deployment.still_alive(without(tmp_path, "v1_cpu", 4105))  # the resource tracker


@pytest.mark.parametrize("gone", [4100, 4187, 4262], ids=["api", "engine", "worker"])
def test_losing_a_serving_process_ends_the_deployment(tmp_path: Path, gone: int) -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4100)
    assert not deployment.still_alive(without(tmp_path, "v1_cpu", gone))


def test_an_api_server_outliving_its_engine_is_a_remnant_not_a_new_target(tmp_path: Path) -> None:
    """vLLM's API server takes seconds to exit after its EngineCore dies; rediscovery by PID finds
    it again, and the daemon must not take it for a restarted server."""
    lost = find_deployment(fixture("v1_cpu"), 4100)
    dying = find_deployment(without(tmp_path, "v1_cpu", 4187), 4100)
    assert roles(dying) == [(4100, API), (4105, OTHER)]
    assert dying.is_remnant_of(lost)
    assert not lost.is_remnant_of(lost)
    assert not find_deployment(without(tmp_path / "b", "v1_cpu", 4105), 4100).is_remnant_of(lost)


def test_a_new_server_on_reused_pids_is_no_remnant() -> None:
    lost = find_deployment(fixture("v1_cpu"), 4100)
    assert not find_deployment(fixture("pid_reuse"), 4100).is_remnant_of(lost)


def test_deployment_is_frozen() -> None:
    deployment = find_deployment(fixture("v1_cpu"), 4100)
    with pytest.raises(dataclasses.FrozenInstanceError):
        deployment.root = deployment.processes[1]  # type: ignore[misc]


# --- discover ------------------------------------------------------------------------------------


def test_discover_two_deployments_newest_first() -> None:
    found = discover(fixture("two_deployments"))
    assert [d.root.pid for d in found] == [6100, 5100]
    assert roles(found[0]) == [(6100, API), (6180, ENGINE), (6240, WORKER)]
    # One GPU with TP=1: the model runs inside the EngineCore, there is no worker process.
    assert roles(found[1]) == [(5100, API), (5180, ENGINE), (5104, OTHER)]


@pytest.mark.parametrize(
    ("scenario", "roots"),
    [
        ("v1_cpu", [4100]),
        ("tp2", [7001]),
        ("dp2", [8000]),
        ("pre_title_spawn", [3100]),
        ("pre_title_fork", [2100]),
        ("odd_comm", []),
    ],
)
def test_discover_finds_one_root_per_deployment(scenario: str, roots: list[int]) -> None:
    assert [d.root.pid for d in discover(fixture(scenario))] == roots


def test_discover_matches_find_deployment() -> None:
    (found,) = discover(fixture("dp2"))
    assert found == find_deployment(fixture("dp2"), 8000)


def test_nothing_to_discover(tmp_path: Path) -> None:
    procfs = ProcFs(tmp_path)
    assert discover(procfs) == []
    error = no_server_error(procfs)
    assert isinstance(error, AttachError)
    assert str(error) == (
        f"no vLLM server found under {tmp_path}: start vLLM, pass --pid, or mount the host's "
        '/proc and pass --proc-root /host_proc (Docker: pid: host or pid: "service:vllm")'
    )


# --- a title is only a claim (issue 26, item 19; tests/fixtures/proc_listen, recorded) -----------

LISTEN = FIXTURES.parent / "proc_listen"


def test_a_foreign_vllm_serve_title_beside_a_real_server_is_skipped_saying_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """`nobody` runs a script named `vllm` with `serve tiny` beside the real server on port
    8000: it holds no socket listening on 8000 and maps nothing of vLLM. It made discovery
    ambiguous; now the real server is the target and the log says why the other was skipped."""
    procfs = ProcFs(LISTEN / "foreign_title")
    assert [d.root.pid for d in discover(procfs)] == [7661, 7660]  # both still look like vLLM
    with caplog.at_level("WARNING", logger="vllm_sidecar"):
        target = resolve_target(procfs, None)
    assert target.root.pid == 7661
    assert target.pids == (7661, 7765, 8072, 7764)
    [message] = [r.getMessage() for r in caplog.records]
    assert "profiling pid 7661" in message
    assert message.endswith(
        "skipped pid 7660 (uid 65534): holds no socket listening on port 8000; "
        "has no module of vLLM's package loaded (none in its memory maps)"
    )


def test_a_lone_candidate_is_taken_even_with_doubts(tmp_path: Path) -> None:
    """Filtering only breaks ties: alone, the foreign process is the target as before (a
    server still starting, not yet listening, must be found)."""
    shutil.copytree(LISTEN / "foreign_title", tmp_path / "alone", symlinks=True)
    for pid in (7661, 7764, 7765, 8072):
        shutil.rmtree(tmp_path / "alone" / str(pid))
    procfs = ProcFs(tmp_path / "alone")
    (lone,) = discover(procfs)
    # its net/tcp still lists the server's socket on 8000: removing /proc dirs closes nothing
    assert doubts(procfs, lone) == ("holds no socket listening on port 8000", DOUBT_MAPS)
    assert resolve_target(procfs, None).root.pid == 7660


def test_a_real_server_has_no_doubts_and_what_cannot_be_read_is_none() -> None:
    procfs = ProcFs(LISTEN / "foreign_title")
    real, _ = discover(procfs)
    assert doubts(procfs, real) == ()
    # no fd/, net/ or the vLLM lines in these trees' maps: only the maps say anything
    (v1,) = discover(fixture("v1_cpu"))
    assert doubts(fixture("v1_cpu"), v1) == (DOUBT_MAPS,)


def test_when_every_candidate_has_doubts_none_is_preferred_and_the_error_says_them() -> None:
    with pytest.raises(AmbiguousTarget) as raised:
        resolve_target(fixture("two_deployments"), None)
    message = str(raised.value)
    assert message.startswith("found 2 vLLM servers: pid 6100 (")
    assert f"none shows that it serves: pid 6100 (uid 0): {DOUBT_MAPS}; pid 5100" in message
    assert message.endswith("Pick one with --pid PID, or profile them all with `vllm-sidecar "
                            "run --discover` (each server in a folder of its own, as `targets: "
                            "[{discover: true}]` in a --config file does).")  # fmt: skip


DOUBT_MAPS = "has no module of vLLM's package loaded (none in its memory maps)"


def test_a_pid_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    # Issue 26, item 19: reading it blocked discovery for ever.
    fifo = tmp_path / "vllm.pid"
    os.mkfifo(fifo)
    with pytest.raises(AttachError, match="not a regular file"):
        read_pid_file(fifo)
    regular = tmp_path / "ok.pid"
    regular.write_text("4242\n")
    assert read_pid_file(regular) == 4242

"""The parsers against real stack text: the public dumps in tests/fixtures/public, the outputs
recorded from real tools in tests/fixtures/parsers (README there says how), the real vLLM
recordings in tests/fixtures/recorded when present, and variants of those for each quirk of
pasting (quotes, log prefixes, cut-off lines). Inline inputs copy the exact shape of the tool's
output; each names the source file that prints it.
"""

from __future__ import annotations

import json
import os
import random
import re
from pathlib import Path

import pytest

from sidecar.errors import ConfigError, InputError
from sidecar.parsers import (
    InputFormat,
    detect_format,
    parse_faulthandler,
    parse_file,
    parse_pyspy_dump,
    parse_pyspy_json,
    parse_pytest_timeout,
    parse_raw,
    parse_text,
    parse_traceback,
)
from sidecar.records import Frame, ParseResult, StackSample

STACKS = Path(__file__).parents[2] / "fixtures" / "public"  # = ../shared/data/stacks
FIXTURES = Path(__file__).parents[2] / "fixtures" / "parsers"
RECORDED = Path(__file__).parents[2] / "fixtures" / "recorded"
NO_STACK = "is it a py-spy dump, a faulthandler dump or a traceback?"


def lines_of(path: Path) -> list[str]:
    return path.read_text().split("\n")


def shape(stack: StackSample) -> tuple[str | None, int, str, str, int | None]:
    inner = stack.frames[0]
    return (stack.thread_id, len(stack.frames), inner.function, inner.file, inner.line)


# --------------------------------------------------- public dumps (tests/fixtures/public)

# (file, format, [(thread id, frame count, innermost function, file suffix, line)], warned lines)
PUBLIC = [
    ("public_005.txt", "pyspy_dump",
     [(None, 11, "broadcast", "torch/distributed/distributed_c10d.py", 2437)], []),
    ("public_006.txt", "faulthandler",
     [("0x00007f57a77d7640", 5, "wait", "/usr/lib/python3.12/threading.py", 359),
      ("0x00007f581410d000", 27, "acquire_read",
       "vllm/distributed/device_communicators/shm_broadcast.py", 425)],
     [29, 30, 39]),
    ("public_011.txt", "pyspy_dump", [("3904726", 5, "poll", "zmq/sugar/poll.py", 106)], []),
    ("public_012.txt", "pyspy_dump", [("3903451", 4, "wait", "threading.py", 355)], []),
    ("public_014.txt", "faulthandler",
     [("0x00007fcf597eb640", 2, "begin_forward", "/flashinfer/decode.py", 514)], [6]),
    ("public_016.txt", "pyspy_dump",
     [("1066282", 16, "fn", "torch/_dynamo/utils.py", 4353)], [20]),
]  # fmt: skip


@pytest.mark.parametrize(("name", "fmt", "expected", "warned"), PUBLIC, ids=[r[0] for r in PUBLIC])
def test_public_stacks(name: str, fmt: str, expected: list[tuple], warned: list[int]) -> None:
    result = parse_file(STACKS / name)
    assert result.format == fmt
    got = [shape(s) for s in result.stacks]
    assert [(t, n, fn, line) for t, n, fn, _, line in got] == [
        (t, n, fn, line) for t, n, fn, _, line in expected
    ]
    assert all(g[3].endswith(e[3]) for g, e in zip(got, expected, strict=True))
    assert [int(m[1]) for w in result.warnings if (m := re.match(r"line (\d+):", w))] == warned
    assert all(s.source == str(STACKS / name) for s in result.stacks)


def test_public_006_keeps_the_frames_after_the_cut() -> None:
    worker = parse_file(STACKS / "public_006.txt").stacks[1]
    names = [f.function for f in worker.frames]
    assert names[17:20] == ["run_engine_core", "run", "_bootstrap"]
    assert worker.frames[18] == Frame("run", "", 108)  # the stray ", line 108 in run"
    assert worker.frames[-1].function == "__init__"
    assert worker.frames[-1].file.endswith("vllm/v1/engine/core_client.py")


def test_public_016_headers_and_cut_frame() -> None:
    (stack,) = parse_file(STACKS / "public_016.txt").stacks
    assert (stack.pid, stack.thread_name, stack.idle) == (1066282, "MainThread", False)
    assert stack.process is not None and stack.process.endswith("--multiprocessing-fork")
    assert stack.frames[-1] == Frame("execute_model")  # "execute_model (vllm/v1/engine/co"


def test_public_005_without_headers_or_indentation() -> None:
    (stack,) = parse_file(STACKS / "public_005.txt").stacks
    assert (stack.thread_id, stack.pid, stack.idle) == (None, None, None)
    assert stack.frames[-1].label() == "run_engine_loop (vllm/engine/multiprocessing/engine.py:226)"


# ------------------------------------------------------- real tool outputs (fixtures/parsers)

# (file, format, [(thread id, frame count, innermost function, file, line)])
RECORDED_HERE = [
    ("pyspy_dump.txt", "pyspy_dump",
     [("5355", 2, "idle_wait", "toy_server.py", 20),
      ("5359", 4, "idle_wait", "toy_server.py", 20),
      ("5360", 5, "busy_step", "toy_server.py", 10)]),
    ("pyspy_dump_locals.txt", "pyspy_dump",
     [("5355", 2, "idle_wait", "toy_server.py", 20),
      ("5359", 4, "idle_wait", "toy_server.py", 20),
      ("5360", 5, "busy_step", "toy_server.py", 10)]),
    ("pyspy_dump_native.txt", "pyspy_dump",
     [("5355", 5, "clock_nanosleep", "libc.so.6", None),
      ("5359", 9, "clock_nanosleep", "libc.so.6", None),
      ("5360", 8, "busy_step", "toy_server.py", 10)]),
    ("pyspy_dump_subprocesses.txt", "pyspy_dump",
     [("5355", 2, "idle_wait", "toy_server.py", 20),
      ("5359", 4, "idle_wait", "toy_server.py", 20),
      ("5360", 5, "busy_step", "toy_server.py", 9),
      ("5358", 7, "busy_step", "toy_server.py", 10),
      ("5357", 2, "main", "multiprocessing/resource_tracker.py", 227)]),
    ("pyspy_dump.json", "pyspy_json",
     [("5360", 5, "busy_step", "toy_server.py", 10),
      ("5359", 4, "idle_wait", "toy_server.py", 20),
      ("5355", 2, "idle_wait", "toy_server.py", 20)]),
    ("pyspy_record.raw.txt", "pyspy_raw",
     [(None, 5, "busy_step", "toy_server.py", 9),
      (None, 5, "busy_step", "toy_server.py", 10)]),
    ("pyspy_record_native_nolineno.raw.txt", "pyspy_raw",
     [("5360", 8, "busy_step", "toy_server.py", None)]),
    ("faulthandler_segfault.txt", "faulthandler",
     [("0x00007f69e37ad6c0", 4, "_poll_forever", "/tmp/fx/crash.py", 10),
      ("0x00007f69e442fb80", 4, "string_at",
       "/root/.pyenv/versions/3.11.7/lib/python3.11/ctypes/__init__.py", 519)]),
    ("faulthandler_timeout.txt", "faulthandler",
     [("0x00007f71086e36c0", 4, "_poll_forever", "/tmp/fx/crash.py", 10),
      ("0x00007f7109280b80", 1, "<module>", "/tmp/fx/crash.py", 27)]),
    # One sample (PHASES.md rule 11): the first traceback's frames innermost, the chain's after.
    ("traceback_chained.txt", "traceback",
     [(None, 5, "load_weights", "/tmp/fx/chained.py", 2)]),
    ("pytest_timeout_thread.txt", "pytest_timeout",
     [("139920554112704", 4, "_poll_forever", "/tmp/fx/hang_test.py", 7),
      ("139920595225472", 31, "test_engine_hangs", "/tmp/fx/hang_test.py", 12)]),
    ("pytest_timeout_signal.txt", "pytest_timeout",
     [("139811076904640", 4, "_poll_forever", "/tmp/fx/hang_test.py", 7)]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "fmt", "expected"), RECORDED_HERE, ids=[r[0] for r in RECORDED_HERE]
)
def test_real_tool_outputs(name: str, fmt: str, expected: list[tuple]) -> None:
    result = parse_file(FIXTURES / name)
    chain_notes = [w for w in result.warnings if "chained traceback read as one sample" in w]
    assert (result.format, len(result.warnings)) == (fmt, len(chain_notes))
    assert [shape(s) for s in result.stacks] == expected
    assert detect_format((FIXTURES / name).read_text()) == InputFormat(fmt)


def test_dump_sets_process_idle_and_native_per_thread() -> None:
    stacks = parse_file(FIXTURES / "pyspy_dump_native.txt").stacks
    assert [(s.pid, s.thread_name, s.idle) for s in stacks] == [
        (5355, "MainThread", True), (5355, "monitor", True), (5355, "busy", False)
    ]  # fmt: skip
    assert stacks[0].process == "/work/main/.venv/bin/python /tmp/fx/toy_server.py"
    assert [f.native for f in stacks[1].frames] == [True, True] + [False] * 4 + [True] * 3
    assert stacks[1].frames[-1] == Frame("0x7f7d4f9278ec", "libc.so.6", None, native=True)


def test_dump_subprocesses_sets_pid_and_command_per_process() -> None:
    stacks = parse_file(FIXTURES / "pyspy_dump_subprocesses.txt").stacks
    assert [s.pid for s in stacks] == [5355, 5355, 5355, 5358, 5357]
    assert stacks[3].process is not None and "spawn_main; spawn_main(" in stacks[3].process
    assert stacks[3].frames[-1] == Frame("<module>", "<string>", 1)


def test_json_fields() -> None:
    busy, monitor, _ = parse_file(FIXTURES / "pyspy_dump.json").stacks
    assert (busy.pid, busy.thread_name, busy.idle, busy.process) == (5355, "busy", False, None)
    assert monitor.idle is True
    assert busy.frames[2] == Frame("Thread.run", "threading.py", 982)  # short_filename wins


def test_raw_subprocesses_and_threads() -> None:
    result = parse_file(FIXTURES / "pyspy_record_threads_idle_subprocesses.raw.txt")
    assert sum(s.weight for s in result.stacks) == 995
    by_thread = {(s.pid, s.thread_id, s.thread_name) for s in result.stacks}
    assert by_thread == {
        (5355, "5355", "MainThread"), (5355, "5359", "monitor"), (5355, "5360", "busy"),
        (5358, "5358", "MainThread"), (5357, "5357", "MainThread"),
    }  # fmt: skip
    child = next(s for s in result.stacks if s.pid == 5358)
    # The child's command line holds "; " and is still one pseudo-frame, dropped from frames.
    assert child.process is not None and child.process.endswith("--multiprocessing-fork")
    assert [f.function for f in child.frames][-2:] == ["spawn_main", "<module>"]
    assert all(not f.function.startswith(("process ", "thread ")) for f in child.frames)


def test_raw_weights_and_native_frames() -> None:
    counts = [s.weight for s in parse_file(FIXTURES / "pyspy_record.raw.txt").stacks]
    assert counts == [34, 165]
    (native,) = parse_file(FIXTURES / "pyspy_record_native_nolineno.raw.txt").stacks
    assert native.frames[-1] == Frame("0x7f7d4f9278ec", "libc.so.6", native=True)
    assert native.frames[5] == Frame("thread_run", "libpython3.11.so.1.0", native=True)
    assert native.frames[0] == Frame("busy_step", "toy_server.py")


def test_pytest_timeout_ignores_captured_output_sections() -> None:
    text = (FIXTURES / "pytest_timeout_thread.txt").read_text()
    captured = (
        "~~~~~~~~~~~~~~~~~~~~~~~~~~~ Captured stdout ~~~~~~~~~~~~~~~~~~~~~~~~~~~\n"
        '  File "/srv/app.py", line 3, in noise\n'
    )
    text = text.replace(
        "~~~~~~~~~~~~~~~~~~~~ Stack of MainThread", captured + "~~~ Stack of MainThread"
    )
    result = parse_pytest_timeout(text)
    assert [s.thread_name for s in result.stacks] == ["zmq-poller", "MainThread"]
    assert all(f.function != "noise" for s in result.stacks for f in s.frames)


# ------------------------------------------------------------ pasted and prefixed variants

PREFIXES = [
    # (prefix put on every line, pid it carries, process name it carries)
    ("> ", None, None),  # markdown quote
    ("> > ", None, None),
    (">> ", None, None),
    ("(Worker pid=12) ", 12, "Worker"),  # vLLM _add_prefix (vllm/utils), V0 workers
    ("(EngineCore_DP0 pid=345) ", 345, "EngineCore_DP0"),
    ("(VllmWorker TP0 pid=9) ", 9, "VllmWorker TP0"),
    ("\x1b[1;36m(VllmWorker TP0 pid=9)\x1b[0;0m ", 9, "VllmWorker TP0"),  # coloured
    ("(RayWorkerWrapper pid=4321, ip=10.0.0.7) ", 4321, "RayWorkerWrapper"),
    ("(Worker (TP1)) ", None, "Worker (TP1)"),  # newer vLLM, pid-less
    ("[rank0]: ", None, None),  # torch.distributed
    ("2025-01-02 03:04:05 ", None, None),
    ("2025-01-02T03:04:05.123456789Z ", None, None),  # docker / kubectl logs
    ("INFO 01-02 03:04:05 [file.py:12] ", None, None),  # vllm/logger.py _FORMAT
    ("vllm-1  | ", None, None),  # docker compose
    ("> (EngineCore_DP0 pid=345) ERROR 01-02 03:04:05 [core.py:1] ", 345, "EngineCore_DP0"),
]


@pytest.mark.parametrize(("prefix", "pid", "process"), PREFIXES, ids=[repr(p[0]) for p in PREFIXES])
@pytest.mark.parametrize("name", ["public_011.txt", "public_005.txt", "public_006.txt",
                                  "public_014.txt", "traceback_chained.txt",
                                  "pytest_timeout_thread.txt"])  # fmt: skip
def test_prefixes_are_stripped_per_line(
    name: str, prefix: str, pid: int | None, process: str | None
) -> None:
    path = STACKS / name if name.startswith("public") else FIXTURES / name
    plain = parse_file(path)
    prefixed = parse_text("\n".join(prefix + line for line in lines_of(path)))
    assert prefixed.format == plain.format
    assert [s.frames for s in prefixed.stacks] == [s.frames for s in plain.stacks]
    assert [s.thread_id for s in prefixed.stacks] == [s.thread_id for s in plain.stacks]
    assert {s.pid for s in prefixed.stacks} == {pid}
    assert {s.process for s in prefixed.stacks} == {process}


def test_process_header_wins_over_prefix_pid() -> None:
    text = "\n".join("(Worker pid=7) " + line for line in lines_of(STACKS / "public_016.txt"))
    (stack,) = parse_text(text).stacks
    assert stack.pid == 1066282


def test_interleaved_workers_are_read_one_stream_each() -> None:
    a = [f"(VllmWorker TP0 pid=10) {line}" for line in lines_of(STACKS / "public_011.txt")]
    b = [f"(VllmWorker TP1 pid=11) {line}" for line in lines_of(STACKS / "public_012.txt")]
    mixed = [line for pair in zip(a, b + [""] * (len(a) - len(b)), strict=True) for line in pair]
    result = parse_text("\n".join(mixed))
    assert [(s.pid, s.thread_id, len(s.frames)) for s in result.stacks] == [
        (10, "3904726", 5), (11, "3903451", 4)
    ]  # fmt: skip


# --------------------------------------------------------------- py-spy dump: shapes inline

# Shapes from py-spy src/dump.rs write_trace and src/stack_trace.rs format_threadid/status_str.
HEADERS = [
    ('Thread 3904726 (idle): "MainThread"', "3904726", "MainThread", True),
    ('Thread 0x7F3A2B1C0740 (active+gil): "EngineCore"', "0x7F3A2B1C0740", "EngineCore", False),
    ("Thread 0x00007f74511ef700 (active)", "0x00007f74511ef700", None, False),
    ('Thread 765 (gil): "x"', "765", "x", None),  # src/coredump.rs: include_activity=false
    ('Thread 765: "x"', "765", "x", None),
    ("Thread 765", "765", None, None),
    ('Thread 765 (idle): "Thread-3 (run) "q""', "765", 'Thread-3 (run) "q"', True),
]


@pytest.mark.parametrize(("header", "tid", "name", "idle"), HEADERS, ids=[h[0] for h in HEADERS])
def test_thread_headers(header: str, tid: str, name: str | None, idle: bool | None) -> None:
    (stack,) = parse_pyspy_dump(f"{header}\n    poll (zmq/sugar/poll.py:106)\n").stacks
    assert (stack.thread_id, stack.thread_name, stack.idle) == (tid, name, idle)


FRAMES = [
    ("poll (zmq/sugar/poll.py:106)", Frame("poll", "zmq/sugar/poll.py", 106)),
    ("<module> (<string>:1)", Frame("<module>", "<string>", 1)),
    ("run (vllm/entrypoints/cli/main.py)", Frame("run", "vllm/entrypoints/cli/main.py")),
    ("cudaStreamSynchronize (libcudart.so.12)",
     Frame("cudaStreamSynchronize", "libcudart.so.12", native=True)),
    ("0x7f1234 (libc.so.6)", Frame("0x7f1234", "libc.so.6", native=True)),
    ("0x7f1234 (?)", Frame("0x7f1234", "?", native=True)),
    ("_PyEval_EvalFrameDefault (python3.12)",
     Frame("_PyEval_EvalFrameDefault", "python3.12", native=True)),
    ("at::native::copy_ (aten/src/ATen/native/Copy.cpp:314)",
     Frame("at::native::copy_", "aten/src/ATen/native/Copy.cpp", 314, native=True)),
    ("(anonymous namespace)::launch (libtorch_cuda.so)",
     Frame("(anonymous namespace)::launch", "libtorch_cuda.so", native=True)),
    ("main (vllm:8)", Frame("main", "vllm", 8)),  # the console script, not native
]  # fmt: skip


@pytest.mark.parametrize(("text", "frame"), FRAMES, ids=[f[0] for f in FRAMES])
def test_frame_shapes(text: str, frame: Frame) -> None:
    (stack,) = parse_pyspy_dump(f"Thread 1 (active)\n    {text}\n").stacks
    assert stack.frames == (frame,)


def test_locals_blocks_are_skipped_even_flattened() -> None:
    text = (FIXTURES / "pyspy_dump_locals.txt").read_text()
    flat = "\n".join(line.strip() for line in text.split("\n"))
    for variant in (text, flat):
        result = parse_pyspy_dump(variant)
        assert ([len(s.frames) for s in result.stacks], result.warnings) == ([2, 4, 5], ())


def test_anonymous_stacks_split_on_blank_lines() -> None:
    one = (STACKS / "public_005.txt").read_text()
    result = parse_pyspy_dump(one + "\n\n" + one)
    assert [len(s.frames) for s in result.stacks] == [11, 11]


def test_core_dump_header() -> None:
    # src/coredump.rs print_traces: "Signal N: CORE", "Process PID: ARGS", "Python vX.Y".
    text = (
        "Signal 11: /tmp/core.123\nProcess 123: python -m vllm\nPython v3.12.3\n\n"
        'Thread 123: "MainThread"\n    f (x.py:1)\n'
    )
    result = parse_text(text)
    assert (result.warnings, [(s.pid, s.thread_id, s.idle) for s in result.stacks]) == (
        (), [(123, "123", None)]
    )  # fmt: skip


def test_thread_without_frames_is_kept() -> None:
    result = parse_pyspy_dump('Thread 1 (idle): "a"\nThread 2 (idle): "b"\n    f (x.py:1)\n')
    assert [len(s.frames) for s in result.stacks] == [0, 1]


# -------------------------------------------------------------------- py-spy --json inline


def trace(os_tid: int | None = 77, **extra: object) -> dict[str, object]:
    frame = {"name": "poll", "filename": "/venv/zmq/sugar/poll.py", "module": None,
             "short_filename": "zmq/sugar/poll.py", "line": 106, "locals": None,
             "is_entry": True, "is_shim_entry": False}  # fmt: skip
    return {"pid": 9, "thread_id": 140234, "thread_name": "MainThread", "os_thread_id": os_tid,
            "active": False, "owns_gil": False, "frames": [frame], "process_info": None,
            **extra}  # fmt: skip


def test_json_shapes() -> None:
    one = json.dumps([trace()], indent=2)
    assert [s.thread_id for s in parse_pyspy_json(one).stacks] == ["77"]
    no_os = parse_pyspy_json(json.dumps([trace(None)])).stacks[0]
    assert no_os.thread_id == "0x223CA"  # format_threadid: {:#X} of the pthread id
    wrapped = parse_pyspy_json(json.dumps({"9": [trace()], "10": [trace(78)]}))
    assert [s.thread_id for s in wrapped.stacks] == ["77", "78"]
    single = parse_pyspy_json(json.dumps(trace()))
    assert len(single.stacks) == 1
    two_docs = parse_pyspy_json(one + "\n" + one)
    assert len(two_docs.stacks) == 2
    info = {"pid": 9, "command_line": "VLLM::EngineCore_DP0", "parent": None}
    assert parse_pyspy_json(json.dumps([trace(process_info=info)])).stacks[0].process == (
        "VLLM::EngineCore_DP0"
    )


def test_json_frame_fields() -> None:
    native = {
        "name": "cudaStreamSynchronize",
        "filename": "/usr/lib/libcudart.so.12",
        "module": "/usr/lib/libcudart.so.12",
        "short_filename": None,
        "line": 0,
    }
    t = trace(frames=[native, {"name": "f", "filename": "/a/b.py", "line": 3}, {"bad": 1}])
    result = parse_pyspy_json(json.dumps([t]))
    assert result.stacks[0].frames == (
        Frame("cudaStreamSynchronize", "/usr/lib/libcudart.so.12", None, native=True),
        Frame("f", "/a/b.py", 3),
    )
    assert any("without a function name" in w for w in result.warnings)


def test_json_cut_short_keeps_complete_threads() -> None:
    text = (FIXTURES / "pyspy_dump.json").read_text()
    cut = text[: text.index('"thread_name": "MainThread"')]
    result = parse_text(cut)
    assert result.format == "pyspy_json"
    assert [s.thread_name for s in result.stacks] == ["busy", "monitor"]
    assert any("kept 2 complete threads" in w for w in result.warnings)


# ------------------------------------------------------------------------- raw, inline

# Shapes from py-spy src/flamegraph.rs (frames) and src/main.rs record_samples (pseudo-frames).
RAW = [
    ("main (app.py:3) 5", (None, None, None, None), ["main"]),
    ("main (app.py) 5", (None, None, None, None), ["main"]),
    ("a (x.py:1);b 2", (None, None, None, None), ["b", "a"]),  # no file: bare name
    ("thread (0x7F00AB12);a (x.py:1) 1", ("0x7F00AB12", None, None, None), ["a"]),
    ("thread 0x7F00AB12;a (x.py:1) 1", ("0x7F00AB12", None, None, None), ["a"]),  # before 2020
    ("thread (12): MainThread;a (x.py:1) 1", ("12", "MainThread", None, None), ["a"]),
    ('process 1:"vllm serve m";process 2:"python -c a; b(1)";thread (2): w;a (x.py:1) 4',
     ("2", "w", 2, "python -c a; b(1)"), ["a"]),
    ('process 1:"";a (x.py:1) 4', (None, None, 1, ""), ["a"]),
    ("thread (x.py:1);f (y.py:2) 1", (None, None, None, None), ["f", "thread"]),  # a real fn
]  # fmt: skip


@pytest.mark.parametrize(("line", "who", "functions"), RAW, ids=[r[0] for r in RAW])
def test_raw_lines(line: str, who: tuple, functions: list[str]) -> None:
    result = parse_text(line + "\n")
    assert (result.format, result.warnings) == ("pyspy_raw", ())
    (stack,) = result.stacks
    assert (stack.thread_id, stack.thread_name, stack.pid, stack.process) == who
    assert [f.function for f in stack.frames] == functions


def test_raw_bad_lines_are_warnings() -> None:
    result = parse_raw("a (x.py:1) 3\nnot a raw line\na (x.py:1) 0\n\n")
    assert [s.weight for s in result.stacks] == [3]
    assert [w.split(":")[0] for w in result.warnings] == ["line 2", "line 3"]


# ------------------------------------------------ faulthandler and tracebacks, inline shapes


def test_faulthandler_shapes() -> None:
    # CPython Python/traceback.c: `Stack (...)` for one thread; ??? for what it cannot read;
    # 3.14 names the thread in brackets and appends the C stack, which is not read.
    text = (
        "Stack (most recent call first):\n"
        '  File "/a/x.py", line 3 in f\n'
        "  File ???, line ??? in ???\n"
        "\n"
        "Current thread 0x000021f4 [EngineCore] (most recent call first):\n"
        '  File "/a/x.py", line 9 in g\n'
        "  Garbage-collecting\n"
        "\n"
        "Thread 0x000021f5 (most recent call first):\n"
        "  <no Python frame>\n"
        "\n"
        "Current thread's C stack trace (most recent call first):\n"
        '  Binary file "/usr/bin/python3.14", at _Py_DumpStack+0x42 [0x5b27f7d7147e]\n'
        "  <truncated rest of calls>\n"
    )
    result = parse_faulthandler(text)
    assert result.warnings == ()
    assert [
        (s.thread_id, s.thread_name, [f.function for f in s.frames]) for s in result.stacks
    ] == [
        (None, None, ["f", "???"]),
        ("0x000021f4", "EngineCore", ["g"]),
        ("0x000021f5", None, []),
    ]
    assert result.stacks[0].frames[1] == Frame("???", "", None)


def test_traceback_shapes() -> None:
    # Lib/traceback.py: exception groups put "| " before their lines; 3.11+ adds carets.
    text = (
        "  + Exception Group Traceback (most recent call last):\n"
        '  |   File "/a/main.py", line 5, in <module>\n'
        "  |     run()\n"
        "  |     ^^^^^\n"
        "  | ExceptionGroup: boom (1 sub-exception)\n"
        "  +-+---------------- 1 ----------------\n"
        "    | Traceback (most recent call last):\n"
        '    |   File "/a/worker.py", line 7, in step\n'
        '    |   File "/a/model.py", line 9, in forward\n'
        "    | ValueError: bad\n"
        "    +------------------------------------\n"
        '  File "/a/x.py", line 3\n'  # SyntaxError location: not a frame
    )
    result = parse_traceback(text)
    assert [[f.function for f in s.frames] for s in result.stacks] == [
        ["<module>"], ["forward", "step"]
    ]  # fmt: skip


def test_traceback_inside_a_vllm_log() -> None:
    tb = (FIXTURES / "traceback_chained.txt").read_text().split("\n")
    log = ["INFO 01-02 03:04:05 [api_server.py:1] Starting vLLM API server"] + [
        f"ERROR 01-02 03:04:06 [core.py:7] {line}" for line in tb
    ]
    log[1] = "ERROR 01-02 03:04:06 [core.py:7] EngineCore failed: " + tb[0]
    result = parse_text("\n".join(log))
    assert (result.format, len(result.stacks)) == ("traceback", 1)  # one chain, one sample
    assert result.warnings == (
        "read past a log header at the start of 19 lines (first: line 1); it is not part of a frame",
        "line 11: chained traceback read as one sample with the one before it (PHASES.md rule 11:"
        " the first decides the phase, the last the role)",
    )


def test_pytest_timeout_shapes() -> None:
    # pytest_timeout.py dump_stacks: "<unknown>" for threads missing from threading.enumerate();
    # pytest's sep() puts a single "~" on each side when the terminal is narrow.
    text = (
        "~ Stack of <unknown> (1402) ~\n"
        '  File "/a/x.py", line 3, in f\n'
        "    f()\n"
        "~ Stack of Thread-1 (worker) (1403) ~\n"
        '  File "/a/x.py", line 3, in g\n'
    )
    result = parse_text(text)
    assert result.format == "pytest_timeout"
    assert [(s.thread_id, s.thread_name) for s in result.stacks] == [
        ("1402", "<unknown>"), ("1403", "Thread-1 (worker)")
    ]  # fmt: skip


# -------------------------------------------------------------------- detection and files

DETECT = [
    ("[W102 12:00:00.000 ProcessGroupNCCL.cpp:1] Warning\nTraceback (most recent call last):\n"
     '  File "/a.py", line 1, in f\n', InputFormat.TRACEBACK),
    ("[]", InputFormat.PYSPY_JSON),
    # py-spy's pretty-printed `[` alone on line 1, then a garbled line (found by test_properties)
    ("[\n=\n  {\n    \"pid\": 1,\n", InputFormat.PYSPY_JSON),
    ('{"traces": []}', InputFormat.PYSPY_JSON),
    ("main (app.py:3) 5\n", InputFormat.PYSPY_RAW),
    ("Thread 0x1 (most recent call first):\n", InputFormat.FAULTHANDLER),
    ("just words\n", InputFormat.PYSPY_DUMP),
]  # fmt: skip


@pytest.mark.parametrize(("text", "fmt"), DETECT, ids=[repr(d[0][:30]) for d in DETECT])
def test_detect_format(text: str, fmt: InputFormat) -> None:
    assert detect_format(text) == fmt


def test_forced_format_and_unknown_format() -> None:
    text = (STACKS / "public_011.txt").read_text()
    assert parse_text(text, input_format="pyspy_raw").format == "pyspy_raw"
    assert parse_text(text, input_format=InputFormat.PYSPY_DUMP).stacks
    with pytest.raises(ConfigError, match="unknown stack format 'flamegraph'; use one of"):
        parse_text(text, input_format="flamegraph")


def test_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("\n  \n")
    assert parse_file(path) == ParseResult((), (f"no stack found in {path}: {NO_STACK}",))


@pytest.mark.parametrize(
    ("text", "kept"),
    [('[{"frames":' * 3000, 0), ("[\n" + '{"a": ' * 50_000, 0),
     ('[\n{"frames": []},\n' + "[" * 100_000, 1)],
    ids=["nested-threads", "nested-objects", "nested-after-a-thread"],
)  # fmt: skip
def test_json_nested_past_the_recursion_limit_is_a_warning(text: str, kept: int) -> None:
    """json's decoder recurses per level and raised RecursionError (found by test_properties);
    the threads before the deep part are kept."""
    result = parse_pyspy_json(text)
    assert "line 1: JSON nested too deeply to be a py-spy dump; kept" in result.warnings[0]
    assert len(result.stacks) == kept
    assert parse_text(text).format == "pyspy_json"


def test_garbage_gives_capped_warnings_and_no_stack() -> None:
    result = parse_text("\n".join(f"garbage line {i} ~" for i in range(50)), source="g.txt")
    assert result.stacks == ()
    assert result.warnings[0] == f"no stack found in g.txt: {NO_STACK}"
    assert result.warnings[1].startswith("line 1: not a py-spy frame or header: ")
    assert result.warnings[-1] == "... and 40 more warnings"
    assert len(result.warnings) == 12


@pytest.mark.parametrize("kind", ["missing", "directory"])
def test_unreadable_files_raise_input_error(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "dump.txt"
    if kind == "directory":
        path.mkdir()
    fix = {"missing": "no such file; check the path", "directory": "pass one stack file"}[kind]
    with pytest.raises(InputError, match=fix):
        parse_file(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_permission_denied_names_the_fix(tmp_path: Path) -> None:
    path = tmp_path / "dump.txt"
    path.write_text("x")
    path.chmod(0)
    with pytest.raises(InputError, match="chmod"):
        parse_file(path)


def test_not_utf8_is_decoded_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes((STACKS / "public_011.txt").read_bytes().replace(b"MainThread", b"M\xe4in"))
    result = parse_file(path)
    assert result.stacks[0].thread_name == "M\ufffdin"
    assert result.warnings[0].startswith("not UTF-8 (first bad byte at offset 25)")


def test_utf16_bom_and_crlf(tmp_path: Path) -> None:
    text = (STACKS / "public_012.txt").read_text()
    crlf = text.replace("\n", "\r\n").encode()
    for name, data in [("a", text.encode("utf-16")), ("b", text.encode("utf-8-sig")), ("c", crlf)]:
        (tmp_path / name).write_bytes(data)
        result = parse_file(tmp_path / name)
        assert ([shape(s) for s in result.stacks], result.warnings) == (
            [("3903451", 4, "wait", "threading.py", 355)], ()
        )  # fmt: skip


# ---------------------------------------------------------------------------- fuzz-ish

ALL_INPUTS = (
    sorted(STACKS.glob("*.txt")) + sorted(FIXTURES.glob("*.txt")) + sorted(FIXTURES.glob("*.json"))
)
PARSERS = [parse_text, parse_pyspy_dump, parse_pyspy_json, parse_raw, parse_faulthandler,
           parse_traceback, parse_pytest_timeout]  # fmt: skip


def check(result: ParseResult) -> None:
    assert isinstance(result, ParseResult)
    for stack in result.stacks:
        assert all(isinstance(f, Frame) and isinstance(f.function, str) for f in stack.frames)
        assert stack.weight >= 1


@pytest.mark.parametrize("path", ALL_INPUTS, ids=[p.name for p in ALL_INPUTS])
def test_truncations_and_mutations_never_raise(path: Path) -> None:
    rng = random.Random(path.name)
    text = path.read_text()
    for _ in range(60):
        cut = text[: rng.randrange(len(text) + 1)]
        lines = text.split("\n")
        rng.shuffle(lines)
        at, junk = rng.randrange(len(text)), chr(rng.randrange(1, 0x3000)) * rng.randrange(4)
        spliced = text[:at] + junk + text[at + rng.randrange(3) :]
        for variant in (cut, "\n".join(lines[: rng.randrange(len(lines) + 1)]), spliced):
            check(parse_text(variant))
    for parser in PARSERS:
        check(parser(text))


def test_random_bytes_never_raise(tmp_path: Path) -> None:
    rng = random.Random(20250102)
    alphabet = "()[]{};:\"'\\ \n\t0123456789xX,.~+|>-abcFileThreadline in" + "\x1b\ufffd\u2028"
    for i in range(300):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(200)))
        path = tmp_path / f"r{i}"
        path.write_bytes(data)
        check(parse_file(path))
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(300)))
        for parser in PARSERS:
            check(parser(text))


# ------------------------------------------ real vLLM recordings (fixtures/recorded), if any

# The stack recordings only: the folder also holds /metrics text and the process tree.
RECORDED_VLLM = sorted(
    p for p in RECORDED.rglob("*") if p.is_file() and ("-dump" in p.name or ".raw" in p.name)
)


def test_recorded_vllm_fixtures_are_present() -> None:
    assert len(RECORDED_VLLM) >= 6, "tests/fixtures/recorded lost its real vLLM recordings"


@pytest.mark.parametrize("path", RECORDED_VLLM, ids=[p.name for p in RECORDED_VLLM])
def test_recorded_vllm_outputs(path: Path) -> None:
    # Unedited output of real py-spy on a real vLLM: it must read completely, without warnings.
    result = parse_file(path)
    check(result)
    assert result.stacks
    assert result.warnings == ()

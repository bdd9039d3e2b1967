"""The stack parsers (sidecar/parsers) on any input, in bounded time and memory.

Every parser turns what it cannot read into warnings (never an exception); parse_file refuses
only a file it cannot read, with InputError. Inputs: any text, any bytes, real dumps of
tests/fixtures mutated the way pastes get damaged and then some (lines inserted, dropped,
doubled, garbled; lines 200,000 characters long; one frame repeated into a deep stack; a thread
repeated into many), and single long lines built from the pieces each parser's patterns look
for, read in every format and in the one detected. Each case must stay within the CPU, wall
clock and memory bounds of tests/unit/property/bounds.py: a pattern that backtracks on a long
line, or a join that copies a growing line at every step, fails here naming its input.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from sidecar.errors import InputError
from sidecar.parsers import InputFormat, detect_format, parse_file, parse_text
from sidecar.parsers.lines import MAX_LINE, clean_lines
from sidecar.records import ParseResult, StackSample
from tests.unit.property.bounds import bounded, cases

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
TEXTS = {
    path.name: path.read_text(encoding="utf-8")
    for folder in ("parsers", "fragments", "public", "public/corpus")
    for path in sorted((FIXTURES / folder).iterdir())
    if path.suffix in (".txt", ".json")
}
FORMATS = [None, *InputFormat]  # None: detected
MAX_TEXT = 2**20  # characters a mutated text may grow to

# What the patterns of the parsers and of the line cleaner look for: repeated, each makes a long
# line that keeps a pattern trying (a prefix, a header, a frame, a count, a quote left open).
PIECES = [
    " ", "\t", "a", "(", ")", '"', ";", ":", "~", "[", "]", "{", "|", "> ", "...", "…", "0x1f",
    "1 ", "a;", "f (a.py:1)", 'File "', '", line 1, in f', "(Python) ", "Thread ", "Thread 0x1 ",
    "Traceback ", "Traceback for thread 1 ", "(most recent call last):", "~~~ Stack of ",
    "Process 1: ", 'process 1:"x";', "thread (1): ", "(W pid=1) ", "(Worker (TP1)) ", "pid=",
    "[rank0]: ", "INFO 01-02 03:04:05 [core.py:12] ", "2025-01-01T00:00:00Z ", "\x1b[0m", "^[[1m",
    "\ufffd[0m", "^M", "99.9% ", "libc.so.6 ", ".so.", "[.] ", "Locals:", "        x: 1", "a\\",
    "[repeated 2x across cluster]",
]  # fmt: skip
# First lines that make each format the detected one, so a long line after them is read by it.
HEADERS = [
    "", "Process 1: python x.py", 'Thread 1 (active): "MainThread"', "[", "f;g 1",
    "Thread 0x00007f (most recent call first):", "Traceback (most recent call last):",
    "+++++ Timeout +++++\n~~~~ Stack of MainThread (1) ~~~~", "99.94%  VLLM::Worker",
    "(W pid=1) Traceback (most recent call last):",
]  # fmt: skip

# ------------------------------------------------------------------------------- strategies

_PIECE = st.sampled_from(PIECES)
_NOISE = st.lists(_PIECE, max_size=8).map("".join) | st.text(max_size=20)


@st.composite
def long_line(draw: st.DrawFn) -> str:
    """Up to three pieces, each repeated to as many as 200,000 characters (past MAX_LINE)."""
    parts = []
    for _ in range(draw(st.integers(1, 3))):
        piece = draw(_PIECE)
        size = draw(
            st.sampled_from([MAX_LINE - 1, MAX_LINE, MAX_LINE + 1, 200_000])
            | st.integers(1, 80_000)
        )
        parts.append(piece * max(1, size // len(piece)))
    return draw(st.sampled_from(["", "    ", "(W pid=1) ", "> "])) + "".join(parts)


@st.composite
def mutated(draw: st.DrawFn, max_text: int = MAX_TEXT) -> str:
    """A real dump with one to four mutations, growing to MAX_TEXT characters at most."""
    lines = TEXTS[draw(st.sampled_from(sorted(TEXTS)))].split("\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        size = sum(len(line) + 1 for line in lines)
        room = max_text - size
        action = draw(
            st.sampled_from(
                [
                    "insert",
                    "delete",
                    "duplicate",
                    "garble",
                    "cut",
                    "long line",
                    "deep stack",
                    "many threads",
                ]
            )
        )
        if action == "insert":
            lines.insert(i, draw(_NOISE))
        elif action == "delete" and len(lines) > 1:
            del lines[i]
        elif action == "duplicate":
            lines.insert(i, lines[i])
        elif action == "garble":
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(_NOISE) + lines[i][at + draw(st.integers(0, 5)) :]
        elif action == "cut":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        elif action == "long line" and room > 200_000:
            lines.insert(i, draw(long_line()))
        elif action == "deep stack":  # one line (a frame, mostly) repeated
            times = min(draw(st.integers(1, 1000)), room // (len(lines[i]) + 1))
            lines[i + 1 : i + 1] = [lines[i]] * times
        elif action == "many threads":  # a run of lines (a thread, mostly) repeated
            block = lines[i : i + draw(st.integers(1, 20))]
            times = min(
                draw(st.integers(1, 100)), room // (sum(len(line) + 1 for line in block) + 1)
            )
            lines[i:i] = block * times
    return "\n".join(lines)


@st.composite
def one_long_line(draw: st.DrawFn) -> str:
    """A header that picks a format, then a long line, then a line of that format again."""
    header = draw(st.sampled_from(HEADERS))
    return f"{header}\n{draw(long_line())}{draw(_NOISE)}\n    f (a.py:1)\n"


# Found by these properties (issue 26), fixed in sidecar/parsers; each took seconds per line.
PERF_BLANKS = "99% cmd\n  a" + " " * 60_000 + "b\n"  # perf.py's entry pattern: 9 s
TRACEBACK_FOR_THREAD = ("Traceback for thread 1 " * 2_800 + "\n") * 4  # detect_format: 2.7 s
WRAPPED = '(W pid=1) File "x\n' + 'a"b"c\n' * 40_000  # lines.py's wrapped join: 7 s, growing

# ------------------------------------------------------------------------------- properties


def _well_formed(result: ParseResult, text: str, input_format: InputFormat | None = None) -> None:
    assert isinstance(result, ParseResult)
    assert all(isinstance(stack, StackSample) and stack.weight > 0 for stack in result.stacks)
    assert all(isinstance(warning, str) and warning for warning in result.warnings)
    if not result.stacks:
        assert result.warnings  # nothing found is said, never silent
    if input_format is not None and text.strip():  # blank text is no format at all
        assert result.format == input_format.value


def _shown(text: str) -> str:
    return f"{len(text)} characters, {text.count(chr(10)) + 1} lines: {text[:200]!r}"


@cases(80)
@given(st.text(max_size=300) | mutated(), st.sampled_from(FORMATS))
@example(PERF_BLANKS, None)
@example(TRACEBACK_FOR_THREAD, None)
def test_any_text_parses_within_bounds(text: str, input_format: InputFormat | None) -> None:
    with bounded(f"parse_text as {input_format or 'detected'}: {_shown(text)}"):
        _well_formed(
            parse_text(text, source="paste", input_format=input_format), text, input_format
        )


@cases(100)
@given(one_long_line(), st.sampled_from(FORMATS))
def test_a_long_line_is_read_within_bounds(text: str, input_format: InputFormat | None) -> None:
    with bounded(f"parse_text as {input_format or 'detected'}: {_shown(text)}"):
        _well_formed(
            parse_text(text, source="paste", input_format=input_format), text, input_format
        )


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@cases(40)
@given(
    st.binary(max_size=2000)
    | st.tuples(
        mutated(max_text=2**16),
        st.sampled_from(["utf-8", "utf-16", "utf-8-sig", "latin-1", "cp1252"]),
    ).map(lambda pair: pair[0].encode(pair[1], errors="replace"))
)
@example(b"\xff\xfe" + b"\x00" * 3)
@example(b"\xc3" * 100_000)
def test_any_bytes_parse_within_bounds(scratch: Path, data: bytes) -> None:
    path = scratch / "stack.txt"
    path.write_bytes(data)
    with bounded(f"parse_file of {len(data)} bytes: {data[:200]!r}"):
        try:
            result = parse_file(path)
        except InputError as error:  # the one way parse_file refuses: a file it cannot read
            assert str(error)
            return
        _well_formed(result, "")


# ------------------------------------------------------------------ found by the properties


def _cpu_seconds(text: str) -> float:
    started = time.process_time()
    parse_text(text)
    return time.process_time() - started


def test_perf_report_line_with_a_long_run_of_blanks_is_read_in_linear_time() -> None:
    assert _cpu_seconds(PERF_BLANKS) < 0.5  # milliseconds now
    (stack,) = parse_text(PERF_BLANKS).stacks
    assert stack.frames[0].function == "a" + " " * 60_000 + "b"  # the name as it was


def test_lines_naming_traceback_for_thread_are_detected_in_linear_time() -> None:
    assert _cpu_seconds(TRACEBACK_FOR_THREAD) < 0.5
    assert (
        detect_format("Traceback for thread 7 (Main) [x] (most recent call last):") == "traceback"
    )


def test_a_wrapped_line_takes_one_continuation() -> None:
    """A cut path in a tagged line goes on on the next line once; lines that keep the quote
    open after it are lines of their own, not joined into one that grows with each."""
    lines = clean_lines('(W pid=1) File "/usr/lib/vll\nm/x.py", line 3, in f "a"\nb"c"\n')
    assert [line.text for line in lines] == [
        'File "/usr/lib/vllm/x.py", line 3, in f "a"',
        'b"c"',
        "",
    ]
    assert lines[0].wrapped and not lines[1].wrapped
    assert _cpu_seconds(WRAPPED) < 1.5  # 0.4 s; joined into one line, 7 s

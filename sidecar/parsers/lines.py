"""What every text parser shares: cleaning pasted lines, grouping them per process, warnings.

Stacks reach us pasted into issues and logs, so each line may carry markdown quote marks,
terminal colours, timestamps and the per-process prefixes that vLLM and Ray put on worker
output. Those are removed line by line, and a `(Name pid=N)` prefix is kept as the line's tag so
that interleaved output of several workers is read as one stream per worker.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from sidecar.records import Frame, ParseResult, StackSample

MAX_LISTED_WARNINGS = 10

# Terminal colours; where the paste lost the ESC byte it shows U+FFFD, or nothing at all
# (`[36m(WorkerDict pid=1)[0m` in https://github.com/ray-project/ray/issues/50418).
# A terminal's caret notation of ESC (`^[[1;36m`, as `less` or `cat -v` shows it) is one more.
_ANSI = re.compile(r"(?:\x1b|\ufffd|\^\[)\[[0-9;?]*[A-Za-z]")
_CARET_CR = re.compile(r"\^M$")  # a carriage return in caret notation, at the end of a line
_BARE_ANSI = re.compile(r"\[[0-9;]*m")  # only where a prefix may stand
_QUOTE = re.compile(r"[ \t]*(?:>[ \t]?)+")  # markdown quotes, nested ("> > ") or not (">> ")
# vLLM's `_add_prefix` (vllm/utils): "(VllmWorker TP0 pid=9) "; Ray adds ", ip=...".
# (The name is greedy and stripped after: a lazy name before `\s*pid=` was quadratic.)
_PID_TAG = re.compile(r"\((?P<name>[^()]*)pid=(?P<pid>\d+)(?:,\s*ip=[^()]*)?\)\s?")
# Newer vLLM simplifies the tag to "(Worker (TP1)) " or "(Engine) ", without a pid.
_NAME_TAG = re.compile(r"\((?P<name>[A-Z][\w.:-]*(?: \([\w.:-]+\))?)\) ")
_RANK_TAG = re.compile(r"\[rank(?P<rank>\d+)\]:\s?")  # torchrun / torch.distributed
_LEVEL = r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL|FATAL)"
_ISO = r"\d{4}[-/]\d{2}[-/]\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2}| UTC)?"
_TIMESTAMPS = (
    # ISO timestamps (docker/k8s logs, python logging), with an optional level after them.
    # (No two adjacent `\s*`: the patterns here stay linear on a line of 40,000 spaces.)
    re.compile(rf"{_ISO}(?:[ \t]*(?:-[ \t]*)?{_LEVEL}\b[ \t]*-?)?\s"),
    # Bracketed, as CI runners and log shippers stamp every line: "[2025-05-20T10:47:04Z] ",
    # "[10:47:04.123] ".
    re.compile(rf"\[(?:{_ISO}|\d{{2}}:\d{{2}}:\d{{2}}(?:[.,]\d+)?)\]\s?"),
    # glog, as Ray's and PyTorch's C++ parts write it: "I0520 10:47:04.123456 12345 x.cc:12] ".
    re.compile(r"[IWEF]\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ [\w.-]+:\d+\] "),
    re.compile(r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [^\s:]+: "),  # journald
)
_LOG_HEADERS = (
    # vLLM's logger: "INFO 01-02 03:04:05 [core.py:12] " (vllm/logger.py, _FORMAT/_DATE_FORMAT);
    # before 2025 without the brackets: "ERROR 01-29 20:00:47 multiproc_worker_utils.py:240] ".
    # The module that logged the line is kept (`logger`): it can name the process.
    re.compile(
        rf"{_LEVEL}\s+\d{{2}}-\d{{2}}\s+\d{{2}}:\d{{2}}:\d{{2}}(?:\.\d+)?"
        r"(?:\s+\[(?P<logger>[\w.-]+?)(?::\d+)?\]|\s+(?P<logger_>[\w.-]+):\d+\])?\s?"
    ),
    re.compile(r"[\w.-]+[-_]\d+\s+\|\s?"),  # docker compose: "vllm-1  | "
    re.compile(r"[\w.-]+ +\| "),  # docker compose, the service named alone: "vllm-sm120  | "
    re.compile(r"\s*\|\s+"),  # a column bar before the line (Buildkite's log view: "  | ")
    # Python's logging.basicConfig format (logging.BASIC_FORMAT, "%(levelname)s:%(name)s:"),
    # as a harness that logs vLLM's output puts it in front: "INFO:tests.docker_utils: ".
    re.compile(rf"{_LEVEL}:[\w.-]+:\s?"),
    # Application loggers: "- runners.py[line:118] - ERROR: " after the timestamp.
    re.compile(rf"-\s+[\w.-]+\[line:\d+\]\s+-\s+{_LEVEL}:?\s"),
)
_PREFIXES = (
    ("process tag", _PID_TAG),
    ("process tag", _NAME_TAG),
    ("rank tag", _RANK_TAG),
    *(("timestamp", p) for p in _TIMESTAMPS),
    *(("log header", p) for p in _LOG_HEADERS),
    ("colour code", _BARE_ANSI),
)
# Ray's log deduplication appends this to the line it folded (LogDeduplicator,
# ray/_private/ray_logging/__init__.py).
_RAY_REPEATED = re.compile(r"\[repeated \d+x across cluster\]$")  # on a right-stripped line
# A paste whose newlines were lost: every log line's `(Name pid=N) ` tag mid-line
# (https://github.com/vllm-project/vllm/issues/4650). A tag only counts as a line start there.
_MID_TAG = re.compile(r"(?<=\S) (?=\([^()]*?pid=\d+(?:,\s*ip=[^()]*)?\) )")


@dataclass(frozen=True, slots=True)
class Line:
    """One input line with its prefixes removed (indentation kept) and its process tag."""

    number: int  # 1-based, as an editor counts
    text: str
    pid: int | None = None
    process: str | None = None
    rank: int | None = None
    removed: tuple[str, ...] = ()  # the kinds of prefix read past ("timestamp", ...)
    logger: str | None = None  # the file vLLM's log header names ("core.py")
    joined: bool = False  # split off a line that held several log lines
    cut: bool = False  # the input line was longer than MAX_LINE and was read up to it
    wrapped: bool = False  # the rest of it was on the next line (a paste wrapped it)


@dataclass(frozen=True, slots=True)
class Stream:
    """The lines of one process (one prefix tag), in input order."""

    lines: tuple[Line, ...]
    pid: int | None = None
    process: str | None = None
    logger: str | None = None  # the module that logged most of its lines, if vLLM's logger did


def clean_line(number: int, raw: str, *, joined: bool = False) -> Line:
    text = _CARET_CR.sub("", _ANSI.sub("", raw).rstrip())
    if text.endswith("]"):
        text = _RAY_REPEATED.sub("", text).rstrip()
    tag: dict[str, str] = {}
    removed: list[str] = []
    for _ in range(8):  # prefixes stack up ("(Worker pid=1) INFO ... [x.py:1] "); a few suffice
        before = text
        if quote := _QUOTE.match(text):
            text = text[quote.end() :]
            removed.append("quote mark")
        if found := _match_prefix(text):
            kind, m = found
            tag.update({k: v.strip() for k, v in m.groupdict().items() if v and v.strip()})
            text = text[m.end() :]
            removed.append(kind)
        if text == before:
            break
    pid, rank = tag.get("pid"), tag.get("rank")
    return Line(
        number,
        text,
        pid=int(pid) if pid else None,
        process=tag.get("name"),
        rank=int(rank) if rank else None,
        removed=tuple(dict.fromkeys(removed)),
        logger=tag.get("logger") or tag.get("logger_"),
        joined=joined,
    )


def _match_prefix(text: str) -> tuple[str, re.Match[str]] | None:
    for kind, pattern in _PREFIXES:
        if m := pattern.match(text):
            return kind, m
    return None


def clean_lines(text: str) -> list[Line]:
    # split on "\n" only: str.splitlines() also splits on \x0b, \x1c, U+2028 ... and would
    # shift the line numbers that warnings report.
    lines: list[Line] = []
    for number, raw in enumerate(text.split("\n"), start=1):
        cut = len(raw) > MAX_LINE
        if cut:  # no frame is this long; what is, is read up to the cap (issue 26, item 15)
            raw = raw[:MAX_LINE]
        parts = _split_joined(_ANSI.sub("", raw))
        for part in parts:
            line = clean_line(number, part, joined=len(parts) > 1)
            if cut and part is parts[-1]:
                line = replace(line, cut=True)
            if lines and _continues(lines[-1], line):
                line = replace(lines[-1], text=lines[-1].text + line.text, wrapped=True)
                lines[-1] = line
            else:
                lines.append(line)
    return lines


MAX_LINE = 64 * 1024  # characters of one input line that are read


def _continues(previous: Line, line: Line) -> bool:
    """A line that a narrow paste wrapped: the previous line carries a process tag and stops
    inside a quoted path (`File "/usr/lib/vll`), and this one has no prefix of its own and
    goes on with the rest of it (`m/v1/worker/x.py", line 3, in f`). Once: a line already
    joined takes no more (lines of `a"b"` after a cut path, each keeping the quote open, were
    joined into one ever longer line, copied and counted again at each: 300 kB took 4 s)."""
    return (
        previous.pid is not None
        and not previous.wrapped
        and not line.removed
        and previous.text.count('"') % 2 == 1
        and bool(line.text)
        and not line.text[0].isspace()
        and '"' in line.text
    )


def _split_joined(raw: str) -> list[str]:
    """A line that holds `(Name pid=N)` tags inside it (one at its start and one more, or two
    when the paste cut the first) is several log lines whose newlines the paste lost: split
    before each tag."""
    inside = len(_MID_TAG.findall(raw))
    if inside >= 2 or (inside and _PID_TAG.match(raw.lstrip("> \t"))):
        return _MID_TAG.split(raw)
    return [raw]


def pasted_notes(lines: list[Line]) -> list[str]:
    """What was read past before parsing, one warning per kind (issue: pasted text never
    loses anything silently): prefixes, Ray's fold marks, flattened lines."""
    notes = []
    kinds: dict[str, list[int]] = {}
    for line in lines:
        for kind in line.removed:
            kinds.setdefault(kind, []).append(line.number)
    for kind, numbers in kinds.items():
        if kind in _SILENT_PREFIXES:
            continue
        first = numbers[0]
        notes.append(
            f"read past a {kind} at the start of {len(set(numbers))} lines (first: line {first});"
            " it is not part of a frame"
        )
    for flag, what in _LINE_NOTES:
        numbers = sorted({line.number for line in lines if getattr(line, flag)})
        if numbers:
            notes.append(f"lines {_ranges(numbers)} {what}")
    return notes


# What a Line's flag says was done to its input line, in the order the notes come.
_LINE_NOTES = (
    ("cut", f"were over {MAX_LINE:,} characters: each was read up to there"),
    (
        "wrapped",
        "were cut inside a path and went on on the next line (a wrapped paste): read as "
        "one line each",
    ),
    (
        "joined",
        "each held several log lines (a paste that lost its newlines): split before each "
        "`(Name pid=N)` tag",
    ),
)


# Markdown quotes are how pastes always look, and a process tag is kept as the stack's process
# (and groups its lines, which a note says where several interleave): nothing is lost there.
# What is dropped for good (a rank, a timestamp, a log header) is worth a line.
_SILENT_PREFIXES = frozenset({"quote mark", "process tag"})


def _ranges(numbers: list[int]) -> str:
    shown_ = [str(n) for n in numbers[:5]]
    return ", ".join(shown_) + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def split_streams(lines: list[Line]) -> list[Stream]:
    """Group lines by process tag, first-seen order; untagged lines form their own stream."""
    groups: dict[tuple[int | None, str | None, int | None], list[Line]] = {}
    for line in lines:
        groups.setdefault((line.pid, line.process, line.rank), []).append(line)
    return [
        Stream(tuple(group), pid, process, _main_logger(group))
        for (pid, process, _), group in groups.items()
    ]


def _main_logger(lines: list[Line]) -> str | None:
    counts = Counter(line.logger for line in lines if line.logger)
    return counts.most_common(1)[0][0] if counts else None


def streams_of(text: str) -> list[Stream]:
    return split_streams(clean_lines(text))


class WarningLog:
    """Warnings of one parse, capped so that a garbled file gives a short list. They name the
    line but not the file, which the caller knows (and prefixes, as the CLI does)."""

    def __init__(self) -> None:
        self._items: list[str] = []

    def note(self, message: str) -> None:
        self._items.append(message)

    def line(self, number: int, message: str) -> None:
        self._items.append(f"line {number}: {message}")

    def render(self) -> tuple[str, ...]:
        listed = self._items[:MAX_LISTED_WARNINGS]
        hidden = len(self._items) - len(listed)
        return (*listed, f"... and {hidden} more warnings") if hidden else tuple(listed)


@dataclass(slots=True)
class StackBuilder:
    """A stack being read, frames in input order; `build` freezes it into a StackSample."""

    thread_id: str | None = None
    thread_name: str | None = None
    pid: int | None = None
    process: str | None = None
    idle: bool | None = None
    frames: list[Frame] = field(default_factory=list)
    logger: str | None = None

    def build(
        self, source: str | None, *, root_first: bool = False, weight: int = 1
    ) -> StackSample:
        frames = tuple(reversed(self.frames)) if root_first else tuple(self.frames)
        return StackSample(
            frames=frames,
            weight=weight,
            thread_id=self.thread_id,
            thread_name=self.thread_name,
            pid=self.pid,
            process=self.process,
            idle=self.idle,
            source=source,
            logger=self.logger,
        )


# Native code as py-spy --native names it: a shared library (`libc.so.6`,
# `libpython3.11.so.1.0`), the interpreter binary, C/C++/CUDA/Cython sources when symbols
# carry lines, or `?` for an address that could not be symbolised (src/native_stack_trace.rs).
_NATIVE_FILE = re.compile(
    r"(?:\.so(?:\.[\d.]+)?|\.dylib|\.dll|\.(?:c|cc|cpp|cxx|cu|cuh|h|hh|hpp|hxx|pyx|rs|S))$"
    r"|(?:^|/)python[\d.]*$|^\?$",
    re.IGNORECASE,
)


def looks_native(function: str, file: str) -> bool:
    return bool(_NATIVE_FILE.search(file)) or re.fullmatch(r"0x[0-9a-fA-F]+", function) is not None


def shown(text: str) -> str:
    """A line as a warning quotes it: short, and with its control characters escaped."""
    return repr(text if len(text) <= 60 else text[:57] + "...")


def make_frame(function: str, file: str = "", line: int | None = None) -> Frame:
    return Frame(function, file, line, native=looks_native(function, file))


class StreamReader(Protocol):
    """Reads one stream's lines into stacks: what every line-oriented parser provides."""

    stacks: list[StackSample]

    def feed(self, line: Line) -> None: ...

    def close(self) -> None: ...


def parse_streams(
    reader: Callable[[Stream, WarningLog, str | None], StreamReader],
    name: str,
    text: str,
    source: str | None,
) -> ParseResult:
    """Split `text` into streams (one per log prefix), read each, and gather the stacks."""
    log = WarningLog()
    lines = clean_lines(text)
    for note in pasted_notes(lines):
        log.note(note)
    streams = split_streams(lines)
    tagged = [s for s in streams if s.pid is not None or s.process is not None]
    if len(tagged) > 1:
        names = ", ".join(f"{s.process or '?'} pid={s.pid or '?'}" for s in tagged[:4])
        more = f" and {len(tagged) - 4} more" if len(tagged) > 4 else ""
        log.note(
            f"the lines of {len(tagged)} processes ({names}{more}) were read as one stream each,"
            " by their tags"
        )
    stacks: list[StackSample] = []
    for stream in streams:
        current = reader(stream, log, source)
        for line in stream.lines:
            current.feed(line)
        current.close()
        stacks.extend(current.stacks)
    return ParseResult(tuple(stacks), log.render(), name)

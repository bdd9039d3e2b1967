"""What every text parser shares: cleaning pasted lines, grouping them per process, warnings.

Stacks reach us pasted into issues and logs, so each line may carry markdown quote marks,
terminal colours, timestamps and the per-process prefixes that vLLM and Ray put on worker
output. Those are removed line by line, and a `(Name pid=N)` prefix is kept as the line's tag so
that interleaved output of several workers is read as one stream per worker.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.records import Frame, ParseResult, StackSample

MAX_LISTED_WARNINGS = 10

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_QUOTE = re.compile(r"[ \t]*(?:>[ \t]?)+")  # markdown quotes, nested ("> > ") or not (">> ")
# vLLM's `_add_prefix` (vllm/utils): "(VllmWorker TP0 pid=9) "; Ray adds ", ip=...".
_PID_TAG = re.compile(r"\((?P<name>[^()]*?)\s*pid=(?P<pid>\d+)(?:,\s*ip=[^()]*)?\)\s?")
# Newer vLLM simplifies the tag to "(Worker (TP1)) " or "(Engine) ", without a pid.
_NAME_TAG = re.compile(r"\((?P<name>[A-Z][\w.:-]*(?: \([\w.:-]+\))?)\) ")
_RANK_TAG = re.compile(r"\[rank(?P<rank>\d+)\]:\s?")  # torchrun / torch.distributed
_NOISE = (
    # ISO timestamps (docker/k8s logs, python logging), with an optional level after them.
    re.compile(
        r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}:?\d{2})?"
        r"(?:\s*-?\s*(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b\s*-?)?\s"
    ),
    # vLLM's logger: "INFO 01-02 03:04:05 [core.py:12] " (vllm/logger.py, _FORMAT/_DATE_FORMAT).
    re.compile(
        r"(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}(?:\.\d+)?"
        r"(?:\s+\[[^\]]*\])?\s?"
    ),
    re.compile(r"[A-Z][a-z]{2} [ \d]\d \d{2}:\d{2}:\d{2} \S+ [^\s:]+: "),  # journald
    re.compile(r"[\w.-]+[-_]\d+\s+\|\s?"),  # docker compose: "vllm-1  | "
)
_PREFIXES = (_PID_TAG, _NAME_TAG, _RANK_TAG, *_NOISE)


@dataclass(frozen=True, slots=True)
class Line:
    """One input line with its prefixes removed (indentation kept) and its process tag."""

    number: int  # 1-based, as an editor counts
    text: str
    pid: int | None = None
    process: str | None = None
    rank: int | None = None


@dataclass(frozen=True, slots=True)
class Stream:
    """The lines of one process (one prefix tag), in input order."""

    lines: tuple[Line, ...]
    pid: int | None = None
    process: str | None = None


def clean_line(number: int, raw: str) -> Line:
    text = _ANSI.sub("", raw).rstrip()
    tag: dict[str, str] = {}
    for _ in range(8):  # prefixes stack up ("(Worker pid=1) INFO ... [x.py:1] "); a few suffice
        before = text
        if quote := _QUOTE.match(text):
            text = text[quote.end() :]
        if m := _match_prefix(text):
            tag.update({key: value for key, value in m.groupdict().items() if value})
            text = text[m.end() :]
        if text == before:
            break
    pid, rank = tag.get("pid"), tag.get("rank")
    return Line(
        number,
        text,
        pid=int(pid) if pid else None,
        process=tag.get("name"),
        rank=int(rank) if rank else None,
    )


def _match_prefix(text: str) -> re.Match[str] | None:
    for pattern in _PREFIXES:
        if m := pattern.match(text):
            return m
    return None


def clean_lines(text: str) -> list[Line]:
    # split on "\n" only: str.splitlines() also splits on \x0b, \x1c, U+2028 ... and would
    # shift the line numbers that warnings report.
    return [clean_line(i, raw) for i, raw in enumerate(text.split("\n"), start=1)]


def split_streams(lines: list[Line]) -> list[Stream]:
    """Group lines by process tag, first-seen order; untagged lines form their own stream."""
    groups: dict[tuple[int | None, str | None, int | None], list[Line]] = {}
    for line in lines:
        groups.setdefault((line.pid, line.process, line.rank), []).append(line)
    return [Stream(tuple(group), pid, process) for (pid, process, _), group in groups.items()]


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
    stacks: list[StackSample] = []
    for stream in streams_of(text):
        current = reader(stream, log, source)
        for line in stream.lines:
            current.feed(line)
        current.close()
        stacks.extend(current.stacks)
    return ParseResult(tuple(stacks), log.render(), name)

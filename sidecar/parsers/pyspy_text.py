"""py-spy's text outputs: `py-spy dump` and `py-spy record --format raw`.

The shapes, as benfred/py-spy writes them:
- dump, src/dump.rs (`write_traces`, `write_trace`): `Process PID: CMDLINE`, `Python vX.Y.Z (EXE)`,
  with --subprocesses `Parent Process PID: CMDLINE` and a line of dashes between processes; then
  per thread `Thread TID (idle|active|active+gil): "NAME"` (no name when the thread has none;
  TID from `StackTrace::format_threadid`, src/stack_trace.rs: the OS thread id in decimal, else
  the pthread id as `0x...`), and frames innermost first, `    NAME (FILE:LINE)`, or
  `    NAME (FILE)` when the line is 0 (native frames without line info). --locals adds
  `        Arguments:` / `        Locals:` blocks of `            NAME: REPR` lines. A dump of a
  core file (src/coredump.rs) starts with `Signal N: CORE` and leaves the activity out:
  `Thread TID: "NAME"`, or `Thread TID (gil): "NAME"` for the GIL holder.
- raw, src/flamegraph.rs (`increment`, `write_raw`): one `FRAME;FRAME;... COUNT` line per distinct
  stack, root first, frames as in dump (a bare NAME when the file is empty). src/main.rs
  (`record_samples`) puts pseudo-frames at the root: `process PID:"CMDLINE"` for the sampled
  process and each parent (--subprocesses, `ProcessInfo::to_frame`), then `thread (TID): NAME`
  (--threads; `thread (TID)` without a name, `thread 0x...` before 2020). --idle and --gil only
  choose which samples are kept and leave no mark in the line.
"""

from __future__ import annotations

import re

from sidecar.parsers.lines import (
    Line,
    StackBuilder,
    Stream,
    WarningLog,
    make_frame,
    parse_streams,
    shown,
    streams_of,
)
from sidecar.records import Frame, ParseResult, StackSample

_TID = r"\d+|0[xX][0-9a-fA-F]+"
# Reporters often redact the id: `Thread <pid> (active): "MainThread"` (vllm-project/vllm#42897),
# `Thread X (active)`, or drop it: `Thread (idle) "MainThread"`; a name may be cut at the end of
# a paste (`"ThreadPoo`). Anything that is not a number is kept as written, with a warning.
_DUMP_TID = r"[^\s():\"]+"
# A redacted pid (`Process <PID>: VLLM::EngineCore`) keeps the title, which names the role.
_PROCESS = re.compile(r"Process (?:(?P<pid>\d+)|<\w+>|[A-Za-z]+):(?: (?P<cmd>.*))?")
_STATUS = r"idle|active|active\+gil|gil"
_THREAD = re.compile(
    rf"Thread(?: (?P<tid>{_DUMP_TID}))?"
    rf'(?: \((?P<status>{_STATUS})\))?(?::? "(?P<name>.*?)"?)?:?'
)
# The thread first, then its activity: `MainThread (active, 100% CPU):`, `"pool-1" (idle):`, as
# some tools and reporters reshape a dump (https://github.com/vllm-project/vllm/issues/53960).
_NAMED_THREAD = re.compile(rf'"?(?P<name>[^"()]+?)"? \((?P<status>{_STATUS})(?:,[^()]*)?\):')
_ELISION = re.compile(r"\.{3}|…|\[\.{3}\]|<\.{3}>|\.\.\. ?\(?\d+ (?:more )?frames?.*")
_IDLE = {"idle": True, "active": False, "active+gil": False}  # "gil" alone: activity not shown
_IGNORED = re.compile(r"Python v\d|Parent Process \d+:|Signal \d+: |-{10,}$")
_FRAME = re.compile(r"(?P<fn>.+) \((?P<loc>[^()]*)\)")  # greedy: the last "(...)" is the location
# A frame followed by its arguments on the same line: `get (queue.py:171)   block=True`.
# Or a reporter's note: `from_ipc_handle   (torch/cuda/streams.py:197)   <-- BLOCKS FOREVER`.
_FRAME_ARGS = re.compile(r"(?P<frame>\S+\s+\([^()]*:\d+\))\s{2,}\S.*")
# "fn (vllm/v1/eng" at the end of a paste; the cut location still tells a native library
_CUT_FRAME = re.compile(r"(?P<fn>[^()]+?) \((?P<loc>[^()]*)")
_LOCAL = re.compile(r" {8,}\S| *[A-Za-z_]\w*: ")  # indented 8+, or "name: repr" when flattened

_RAW_LINE = re.compile(r"(?P<stack>.*\S) (?P<count>\d+)")
_RAW_PROCESS = re.compile(r'process (?P<pid>\d+):"(?P<cmd>.*?)"(?:;|$)')
_RAW_THREAD = re.compile(rf"thread (?:\((?P<tid>{_TID})\)(?:: (?P<name>.*))?|(?P<old>{_TID}))")


def parse_frame(text: str) -> Frame | None:
    """`fn (file:line)` or `fn (file)` as py-spy prints a frame; None if it is neither."""
    m = _FRAME.fullmatch(text)
    if m is None:
        return None
    function, location = m["fn"].strip(), m["loc"]
    file, _, line = location.rpartition(":")
    if file and line.isascii() and line.isdecimal():
        return make_frame(function, file, int(line))
    return make_frame(function, location)


class _DumpReader:
    """Reads one stream of `py-spy dump` text; headers set the pid and thread of what follows."""

    def __init__(self, stream: Stream, log: WarningLog, source: str | None) -> None:
        self._log, self._source = log, source
        self._pid, self._process = stream.pid, stream.process
        self._open: StackBuilder | None = None
        self._in_locals = False
        self.stacks: list[StackSample] = []

    def feed(self, line: Line) -> None:
        if self._in_locals and _LOCAL.match(line.text):
            return
        self._in_locals = False
        text = line.text.strip()
        if not text:
            # py-spy writes no blank line inside a process, so a blank line only ends a stack
            # pasted without its thread header (two such stacks would otherwise merge).
            if self._open is not None and self._open.thread_id is None:
                self.close()
        elif m := _PROCESS.fullmatch(text):
            self.close()
            self._pid = int(m["pid"]) if m["pid"] else None
            self._process = m["cmd"].strip() if m["cmd"] else None
        elif m := _THREAD.fullmatch(text) or _NAMED_THREAD.fullmatch(text):
            self.close()
            tid = m.groupdict().get("tid")
            if tid is None:
                self._log.line(line.number, "thread header without an id: stack kept without one")
            elif not re.fullmatch(_TID, tid):
                self._log.line(line.number, f"thread id {tid!r} is not a number (redacted?): kept")
            idle = _IDLE.get(m["status"] or "")
            self._open = StackBuilder(tid, m["name"], self._pid, self._process, idle)
        elif _ELISION.fullmatch(text):
            self._log.line(line.number, "frames elided in the paste (`...`): read without them")
        elif text in ("Arguments:", "Locals:"):
            self._in_locals = True
        elif not _IGNORED.match(text):
            self._add_frame(line.number, text)

    def _add_frame(self, number: int, text: str) -> None:
        frame = parse_frame(text)
        if frame is None and (with_args := _FRAME_ARGS.fullmatch(text)):
            frame = parse_frame(with_args["frame"])
            self._log.line(number, f"text after the frame skipped: {shown(text)}")
        if frame is None and (cut := _CUT_FRAME.fullmatch(text)):
            frame = _cut_frame(cut)
            kept = f"its function and library {frame.file}" if frame.native else "its function only"
            self._log.line(number, f"frame cut off, kept {kept}: {shown(text)}")
        if frame is None:
            self._log.line(number, f"not a py-spy frame or header: {shown(text)}")
            return
        if self._open is None:  # frames pasted without a thread header: one anonymous stack
            self._open = StackBuilder(pid=self._pid, process=self._process)
        self._open.frames.append(frame)

    def close(self) -> None:
        if self._open is not None:
            self.stacks.append(self._open.build(self._source))
            self._open = None


def parse_pyspy_dump(text: str, source: str | None = None) -> ParseResult:
    """`py-spy dump` text (also `--native`, `--locals`, `--subprocesses`, pasted or quoted)."""
    return parse_streams(_DumpReader, "pyspy_dump", text, source)


def _cut_frame(cut: re.Match[str]) -> Frame:
    """A frame cut inside its location: the function, and the library if it is a native one
    (`cuEventSynchronize (libcuda.so.5` keeps `libcuda.so.5`, so native rules still apply)."""
    function, location = cut["fn"].strip(), cut["loc"].strip()
    native = make_frame(function, location)
    return native if native.native else make_frame(function)


def _raw_frame(text: str) -> Frame:
    if frame := parse_frame(text):
        return frame
    cut = _CUT_FRAME.fullmatch(text)
    return make_frame(cut["fn"].strip() if cut else text.strip())  # bare: py-spy had no file


def _raw_sample(
    line: Line, stream: Stream, log: WarningLog, source: str | None
) -> StackSample | None:
    m = _RAW_LINE.fullmatch(line.text.strip())
    if m is None or int(m["count"]) == 0:
        log.line(line.number, f"not a `stack COUNT` line: {shown(line.text.strip())}")
        return None
    stack = StackBuilder(pid=stream.pid, process=stream.process)
    rest = m["stack"]
    while p := _RAW_PROCESS.match(rest):  # root process first: the last one is the sampled one
        stack.pid, stack.process, rest = int(p["pid"]), p["cmd"], rest[p.end() :]
    parts = [part for part in rest.split(";") if part.strip()]
    if parts and (t := _RAW_THREAD.fullmatch(parts[0])):
        stack.thread_id, stack.thread_name = t["tid"] or t["old"], t["name"]
        parts = parts[1:]
    stack.frames = [_raw_frame(part) for part in parts]
    return stack.build(source, root_first=True, weight=int(m["count"]))


def parse_raw(text: str, source: str | None = None) -> ParseResult:
    """`py-spy record --format raw` (collapsed stacks); each line's count becomes its weight."""
    log = WarningLog()
    stacks = [
        sample
        for stream in streams_of(text)
        for line in stream.lines
        if line.text.strip() and (sample := _raw_sample(line, stream, log, source)) is not None
    ]
    return ParseResult(tuple(stacks), log.render(), "pyspy_raw")

"""Stacks that Python prints itself: faulthandler dumps, tracebacks, pytest-timeout dumps.

- faulthandler, CPython Python/traceback.c (`write_thread_id`, `dump_frame`, `dump_traceback`):
  `Thread 0xHEX (most recent call first):`, `Current thread 0xHEX ...` for the faulting one
  (3.14 adds ` [NAME]` after the id), `Stack (most recent call first):` for a single thread,
  then `  File "PATH", line N in FUNC`, innermost first (`???` for what it cannot read). A fatal
  error starts with `Fatal Python error: ...`; 3.13+ may add `Current thread's C stack trace`
  with `  Binary file "...", at ...` lines, which are skipped.
- tracebacks (Lib/traceback.py): `Traceback (most recent call last):` then
  `  File "PATH", line N, in FUNC` and the source line, root first; chained exceptions each
  bring their own header, exception groups prefix theirs with `| `.
- pystack (bloomberg/pystack, `pystack remote PID`): `Traceback for thread TID (NAME) [...]
  (most recent call last):`, then `    (Python) File "PATH", line N, in FUNC` (`(C)` for native
  frames with --native), root first, as a traceback.
- pytest-timeout, pytest_timeout.py (`dump_stacks`, `timeout_timer`, `timeout_sigalrm`): banners
  `+++ Timeout +++`, one `~~~ Stack of NAME (IDENT) ~~~` section per thread (`<unknown>` as NAME
  when the thread is not in `threading.enumerate()`) holding `traceback.format_stack` lines,
  root first. Other `~~~ TITLE ~~~` sections (captured output) are not stacks.
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
)
from sidecar.records import Frame, ParseResult, StackSample

# One pattern for both: faulthandler writes "line N in F", tracebacks "line N, in F".
_FILE_LINE = re.compile(
    r"[\s|]*(?:\((?:Python|C)\) )?"  # pystack marks each frame "(Python)" or "(C)"
    r'File (?:"(?P<file>.*)"|\?\?\?), line (?P<line>\d+|\?\?\?),? in (?P<fn>.+)'
)
_CUT_FILE = re.compile(r'[\s|]*File "[^"]*"?')  # a `File "...` line cut before "in FUNC"
_FRAGMENT = re.compile(r'(?:[^"]*")?, line (?P<line>\d+|\?\?\?),? in (?P<fn>\S+)')  # its tail

_FH_HEADER = re.compile(
    r"(?P<current>Current thread|Thread) (?P<tid>0x[0-9a-fA-F]+)(?: \[(?P<name>.*)\])?"
    r" \(most recent call first\):?"
)
_FH_STACK = re.compile(r"Stack \(most recent call first\):?")
# "<no Python frame>", "...", C stack lines: nothing to read, nothing to warn about.
_FH_SKIPPED = re.compile(r"Binary file |<|\.\.\.$|Garbage-collecting$")
_TB_HEADER = re.compile(
    r"(?:.*\s)?Traceback (?:for thread (?P<tid>\d+)(?: \((?P<name>[^()]*)\))?(?: \[[^\]]*\])? )?"
    r"\(most recent call last\):"
)
# CPython's two chain messages (Lib/traceback.py, _cause_message / _context_message).
# A caller's source line that calls a registered op through torch's dispatcher:
# `x = torch.ops.vllm.unified_attention_with_output(q, k, v, ...)`.
_TORCH_OP_CALL = re.compile(r"torch\.ops\.(?P<ns>\w+)\.(?P<op>\w+)(?:\.\w+)?\(")
_TB_CHAIN = re.compile(
    r"The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:"
)
_PT_SECTION = re.compile(r"~+ (?P<title>.*?) ~+")
_PT_STACK = re.compile(r"Stack of (?P<name>.*) \((?P<tid>\d+)\)")
_PT_BANNER = re.compile(r"\++ Timeout \++")


class _Reader:
    """Collects stacks of one stream; subclasses say which lines open and close a stack."""

    root_first = False
    header = "header"

    def __init__(self, stream: Stream, log: WarningLog, source: str | None) -> None:
        self.stream, self.log, self.source = stream, log, source
        self.open: StackBuilder | None = None
        self.stacks: list[StackSample] = []

    def start(self, thread_id: str | None = None, name: str | None = None) -> None:
        self.close()
        self.open = StackBuilder(
            thread_id, name, self.stream.pid, self.stream.process, logger=self.stream.logger
        )

    def close(self) -> None:
        if self.open is not None and (self.open.frames or self.open.thread_id is not None):
            self.stacks.append(self.open.build(self.source, root_first=self.root_first))
        self.open = None

    def frame_line(self, line: Line, text: str) -> bool:
        """Reads `text` as a frame (or a cut-off one) if it is one; False if it is not."""
        if m := _FILE_LINE.fullmatch(text):
            number = int(m["line"]) if m["line"].isdecimal() else None
            frame = make_frame(m["fn"].strip(), m["file"] or "", number)
        elif m := _FRAGMENT.fullmatch(text):
            line_no = int(m["line"]) if m["line"].isdecimal() else None
            frame = make_frame(m["fn"], "", line_no)
            self.log.line(line.number, f"frame cut off, kept without its file: {shown(text)}")
        elif _CUT_FILE.fullmatch(text):
            self.log.line(line.number, f"frame cut off, skipped: {shown(text)}")
            return True
        else:
            return False
        if self.open is None:
            self.log.line(
                line.number,
                f"frames with no {self.header} above them (a pasted fragment?): read as one "
                "stack of an unnamed thread; paste the header too to name it",
            )
            self.start()
        assert self.open is not None
        self.open.frames.append(frame)
        return True

    def feed(self, line: Line) -> None:
        raise NotImplementedError


class _FaulthandlerReader(_Reader):
    header = "`Thread 0x... (most recent call first):` header"

    def feed(self, line: Line) -> None:
        text = line.text.strip()
        if m := _FH_HEADER.fullmatch(text):
            self.start(m["tid"], m["name"])
        elif _FH_STACK.fullmatch(text):
            self.start()
        elif not text or text.startswith("Current thread's C stack"):
            self.close()  # threads are separated by a blank line; the C stack is not Python's
        elif self.frame_line(line, text) or _FH_SKIPPED.match(text):
            return
        elif self.open is not None and self.open.frames:
            self.log.line(line.number, f"not a faulthandler frame: {shown(text)}")


class _TracebackReader(_Reader):
    """Tracebacks, a chain of them read as one sample (docs/PHASES.md rule 11): the frames of
    the first (which holds the call that failed or blocked) innermost, then each later one's,
    so that the first decides the phase and the last's outermost frames the role."""

    root_first = True
    header = "`Traceback (most recent call last):` line"

    def __init__(self, stream: Stream, log: WarningLog, source: str | None) -> None:
        super().__init__(stream, log, source)
        self.chained = False  # a chain message was seen since the last traceback began
        self.earlier: list[Frame] = []  # the chain so far, in input order (root first)
        self.source_lines: dict[int, str] = {}  # frame index -> the source line printed under it

    def start(self, thread_id: str | None = None, name: str | None = None) -> None:
        super().start(thread_id, name)
        self.source_lines = {}

    def feed(self, line: Line) -> None:
        text = line.text.strip()
        if m := _TB_HEADER.fullmatch(text):
            if self.chained and self.open is not None and self.open.frames:
                self._add_dispatched_op(line)
                self.source_lines = {}
                self.earlier = self.open.frames + self.earlier
                self.open = StackBuilder(
                    m["tid"], m["name"], self.stream.pid, self.stream.process,
                    logger=self.stream.logger,
                )  # fmt: skip
                self.log.line(
                    line.number,
                    "chained traceback read as one sample with the one before it (PHASES.md "
                    "rule 11: the first decides the phase, the last the role)",
                )
            else:
                self.start(m["tid"], m["name"])
            self.chained = False
        elif _TB_CHAIN.fullmatch(text):
            self.chained = True
        elif not self.frame_line(line, text) and self.open is not None and self.open.frames:
            # source lines, carets, the exception line: not frames; the first line under a
            # frame is its source line
            self.source_lines.setdefault(len(self.open.frames) - 1, text)

    def _add_dispatched_op(self, line: Line | None = None) -> None:
        """A traceback that ends in torch's dispatcher (`torch/_ops.py` `__call__`) names the op
        it dispatched only in its caller's source line (`torch.ops.vllm.unified_attention(...)`):
        that op becomes the innermost frame (file `torch.ops.NS`), as py-spy --native would show
        it, and a warning says so."""
        frames = self.open.frames if self.open is not None else []
        if len(frames) < 2 or not frames[-1].file.endswith("torch/_ops.py"):
            return
        call = _TORCH_OP_CALL.search(self.source_lines.get(len(frames) - 2, ""))
        if call is None:
            return
        frames.append(make_frame(call["op"], f"torch.ops.{call['ns']}"))
        where = f"line {line.number}: " if line is not None else ""
        self.log.note(
            f"{where}the op torch dispatched to, torch.ops.{call['ns']}.{call['op']}, read from "
            "its caller's source line as the innermost frame"
        )

    def close(self) -> None:
        self._add_dispatched_op()
        if self.open is not None and self.earlier:
            self.open.frames = self.open.frames + self.earlier
        self.earlier = []
        super().close()


class _PytestTimeoutReader(_Reader):
    root_first = True
    header = "`~~~ Stack of NAME (ID) ~~~` line"

    def feed(self, line: Line) -> None:
        text = line.text.strip()
        if m := _PT_SECTION.fullmatch(text):
            if stack := _PT_STACK.fullmatch(m["title"]):
                self.start(stack["tid"], stack["name"])
            else:
                self.close()
        elif _PT_BANNER.fullmatch(text):
            self.close()
        elif self.open is not None:
            self.frame_line(line, text)


def parse_faulthandler(text: str, source: str | None = None) -> ParseResult:
    """A faulthandler dump (fatal error, `dump_traceback`, `dump_traceback_later`)."""
    return parse_streams(_FaulthandlerReader, "faulthandler", text, source)


def parse_traceback(text: str, source: str | None = None) -> ParseResult:
    """Python tracebacks, one stack per `Traceback (most recent call last):`, chained or not."""
    return parse_streams(_TracebackReader, "traceback", text, source)


def parse_pytest_timeout(text: str, source: str | None = None) -> ParseResult:
    """pytest-timeout's dump of every thread's stack when a test times out."""
    return parse_streams(_PytestTimeoutReader, "pytest_timeout", text, source)

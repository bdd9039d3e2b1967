"""`perf report --hierarchy` text: where a native profile, not a stack dump, is what was pasted.

`perf report --stdio --hierarchy --sort comm,dso,sym` (tools/perf/ui/stdio/hist.c,
hist_entry__hierarchy_fprintf) prints one level per sort key, each indented under the one
before: the command (the thread or process title), then the shared object, then the symbol, each
led by its share (`99.94%`); pastes often keep the share on the first level only:

    99.94%  VLLM::Worker
        libur_adapter_level_zero_v2.so
        ur::level_zero::urEventWait()

(https://github.com/vllm-project/vllm/pull/50887). Each symbol becomes a one-frame native
sample of the command above it, weighted by nothing: the shares are not sample counts, and a
warning says so.
"""

from __future__ import annotations

import re

from sidecar.parsers.lines import WarningLog, clean_lines, shown
from sidecar.records import Frame, ParseResult, StackSample

_SHARE = r"(?:(?P<share>\d+(?:\.\d+)?)%\s+)?"
# Matched against the line stripped on the right: a lazy name before a trailing `\s*` tried
# every blank of a run inside the line (a 60 kB line with one took 9 s).
_ENTRY = re.compile(rf"(?P<indent>\s*){_SHARE}(?:\[[.k]\]\s+)?(?P<name>\S.*)")
_LIBRARY = re.compile(r".*(?:\.so(?:\.[\d.]+)?|\.ko|\[kernel\.kallsyms\]|/python[\d.]*)$")
# The first line: a share and a command, nothing else (a py-spy or traceback line never is).
HEADER = re.compile(r"\s*\d+(?:\.\d+)?%\s+\S+(?: \S+)*\s*")


def parse_perf_hierarchy(text: str, source: str | None = None) -> ParseResult:
    log = WarningLog()
    stacks: list[StackSample] = []
    command: str | None = None
    library = ""
    for line in clean_lines(text):
        if not line.text.strip():
            continue
        m = _ENTRY.fullmatch(line.text.rstrip())
        if m is None:  # pragma: no cover - the pattern takes any non-blank line
            log.line(line.number, f"not a perf report line: {shown(line.text)}")
            continue
        name = m["name"]
        if not m["indent"]:
            command, library = name, ""
        elif _LIBRARY.match(name):
            library = name
        elif command is None:
            log.line(line.number, f"symbol with no command above it, skipped: {shown(name)}")
        else:
            frame = Frame(name, library, None, native=True)
            stacks.append(StackSample((frame,), process=command, source=source))
    if stacks:
        log.note(
            "a perf report (hierarchy) is a profile, not a dump: each symbol was read as one "
            "native sample of its command; the shares are not sample counts and were not kept"
        )
    return ParseResult(tuple(stacks), log.render(), "perf_hierarchy")

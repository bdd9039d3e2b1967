"""Stack text into StackSamples: py-spy dump/--json/raw, faulthandler, tracebacks, pytest-timeout.

`parse_text` finds the format and hands the text to one parser; each parser also works alone.
Frames come out innermost first whatever order the format prints them in. No parser raises on
garbled content: what cannot be read becomes a warning that names its line.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from collections.abc import Callable
from dataclasses import replace
from enum import StrEnum
from pathlib import Path

from sidecar.errors import ConfigError, InputError
from sidecar.parsers.lines import clean_lines
from sidecar.parsers.perf import HEADER as _PERF_HEADER
from sidecar.parsers.perf import parse_perf_hierarchy
from sidecar.parsers.pyspy_json import parse_pyspy_json
from sidecar.parsers.pyspy_text import parse_pyspy_dump, parse_raw
from sidecar.parsers.python_dumps import parse_faulthandler, parse_pytest_timeout, parse_traceback
from sidecar.records import ParseResult

__all__ = [
    "InputFormat",
    "detect_format",
    "parse_faulthandler",
    "parse_file",
    "parse_perf_hierarchy",
    "parse_pyspy_dump",
    "parse_pyspy_json",
    "parse_pytest_timeout",
    "parse_raw",
    "parse_text",
    "parse_traceback",
]


class InputFormat(StrEnum):
    """The formats read here; the value is what ParseResult.format says."""

    PYSPY_DUMP = "pyspy_dump"
    PYSPY_JSON = "pyspy_json"
    PYSPY_RAW = "pyspy_raw"
    FAULTHANDLER = "faulthandler"
    TRACEBACK = "traceback"
    PYTEST_TIMEOUT = "pytest_timeout"
    PERF_HIERARCHY = "perf_hierarchy"


PARSERS: dict[InputFormat, Callable[[str, str | None], ParseResult]] = {
    InputFormat.PYSPY_DUMP: parse_pyspy_dump,
    InputFormat.PYSPY_JSON: parse_pyspy_json,
    InputFormat.PYSPY_RAW: parse_raw,
    InputFormat.FAULTHANDLER: parse_faulthandler,
    InputFormat.TRACEBACK: parse_traceback,
    InputFormat.PYTEST_TIMEOUT: parse_pytest_timeout,
    InputFormat.PERF_HIERARCHY: parse_perf_hierarchy,
}

# "[{" or "[]" opens py-spy's JSON; a log line such as "[W102 12:00:00 ProcessGroupNCCL.cpp]"
# does not.
_JSON_START = re.compile(r'\s*(?:\[\s*(?:[{\]]|$)|\{\s*["}])')


# A raw line: several frames joined by ";", or one frame "fn (file)", then " COUNT".
def _raw_line(line: str) -> bool:
    """`FRAME;FRAME;... COUNT` or `FRAME (FILE) COUNT`: a regex of two `.*` around the `;` took
    seconds on one long line, so the line is split instead."""
    head, _, count = line.rpartition(" ")
    return (
        bool(head)
        and count.isdigit()
        and not head[0].isspace()
        and (";" in head or head.endswith(")"))
    )


_PYTEST_STACK = re.compile(r"~+ Stack of .* \(\d+\) ~+")
# Frame lines of a Python dump pasted without its header: faulthandler writes `line N in F`,
# a traceback `line N, in F` (CPython Python/traceback.c and Lib/traceback.py).
_FH_FRAME = re.compile(r'File "[^"]*", line (?:\d+|\?\?\?) in \S.*')
_TB_FRAME = re.compile(r'(?:\((?:Python|C)\) )?File "[^"]*", line \d+, in \S.*')
# A traceback's header, pystack's `Traceback for thread TID (NAME) [...]` form too. Searched
# only in a line that ends like one: the `.*` took each `Traceback for thread N ` of a long line
# to its end (0.7 s for a 64 kB line, per line).
_TB_HEADER = re.compile(r"Traceback (?:for thread \d+ .*)?\(most recent call last\):$")
_TB_TAIL = "(most recent call last):"


def detect_format(text: str) -> InputFormat:
    body = [line.text.strip() for line in clean_lines(text) if line.text.strip()]
    # py-spy pretty-prints, so `[` stands alone on the first line: that decides by itself, so
    # that a garbled second line does not turn a cut JSON dump into hundreds of bad text frames.
    if _JSON_START.match(body[0] if body else "") or _JSON_START.match("\n".join(body[:2])):
        return InputFormat.PYSPY_JSON
    if body and 2 * sum(_raw_line(line) for line in body) > len(body):
        return InputFormat.PYSPY_RAW
    if any(_PYTEST_STACK.fullmatch(line) for line in body):
        return InputFormat.PYTEST_TIMEOUT
    if any(line.endswith("(most recent call first):") for line in body):
        return InputFormat.FAULTHANDLER
    if any(line.endswith(_TB_TAIL) and _TB_HEADER.search(line) for line in body):
        return InputFormat.TRACEBACK
    # Headerless fragments: whichever Python frame shape the lines hold (the readers warn).
    fh, tb = (sum(bool(p.fullmatch(line)) for line in body) for p in (_FH_FRAME, _TB_FRAME))
    if fh or tb:
        return InputFormat.FAULTHANDLER if fh >= tb else InputFormat.TRACEBACK
    if body and _PERF_HEADER.fullmatch(body[0]):
        return InputFormat.PERF_HIERARCHY
    return InputFormat.PYSPY_DUMP


def _nothing_found(source: str | None) -> str:
    where = source or "the input"
    return f"no stack found in {where}: is it a py-spy dump, a faulthandler dump or a traceback?"


def _chosen_format(input_format: InputFormat | str) -> InputFormat:
    try:
        return InputFormat(input_format)
    except ValueError:
        known = ", ".join(f.value for f in InputFormat)
        raise ConfigError(
            f"unknown stack format {input_format!r}; use one of {known}, or leave it out to detect"
        ) from None


def parse_text(
    text: str, source: str | None = None, input_format: InputFormat | str | None = None
) -> ParseResult:
    """Parses `text` in `input_format`, or in the format it looks like when that is None."""
    if not text.strip():
        return ParseResult((), (_nothing_found(source),))
    chosen = _chosen_format(input_format) if input_format else detect_format(text)
    result = PARSERS[chosen](text, source)
    if not result.stacks:
        result = replace(result, warnings=(_nothing_found(source), *result.warnings))
    return result


# A stack file larger than this is not a dump (the largest recordings here are a few MB): reading
# `/dev/zero` grew the process to 3 GB before it failed (issue 26, item 19).
MAX_STACK_FILE = 256 * 2**20


def _read(path: Path) -> bytes:
    try:
        info = path.stat()
        if path.is_dir():
            raise IsADirectoryError(path)
        if not stat.S_ISREG(info.st_mode):
            raise InputError(
                f"{path} is not a regular file (a device, a FIFO or a socket); save the dump to a "
                "file first (`py-spy dump --pid PID > FILE`)"
            )
        if info.st_size > MAX_STACK_FILE:
            raise InputError(
                f"{path} is {info.st_size / 2**20:.0f} MiB, over the {MAX_STACK_FILE // 2**20} MiB "
                "a stack file may be; pass the dump itself, not a log or a core file"
            )
        return path.read_bytes()
    except FileNotFoundError as error:
        raise InputError(
            f"{path}: no such file; check the path (write one with `py-spy dump --pid PID > FILE`)"
        ) from error
    except IsADirectoryError as error:
        raise InputError(f"{path} is a directory; pass one stack file from it instead") from error
    except PermissionError as error:
        raise InputError(
            f"{path}: permission denied; make it readable (chmod a+r) or run as its owner"
        ) from error
    except OSError as error:
        raise InputError(
            f"cannot read {path}: {error.strerror or error}; pass a regular, readable file"
        ) from error


def _decode(data: bytes) -> tuple[str, str | None]:
    if data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):  # PowerShell's `>`
        return data.decode("utf-16", errors="replace"), None
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError as error:
        note = (
            f"not UTF-8 (first bad byte at offset {error.start}); "
            "undecodable bytes were replaced with U+FFFD"
        )
        return data.decode("utf-8-sig", errors="replace"), note


def parse_file(
    path: str | os.PathLike[str], input_format: InputFormat | str | None = None
) -> ParseResult:
    """Reads and parses one stack file; InputError (naming the fix) if it cannot be read."""
    file = Path(path)
    text, note = _decode(_read(file))
    result = parse_text(text, str(file), input_format)
    return replace(result, warnings=(note, *result.warnings)) if note else result

"""`py-spy dump --json`.

src/dump.rs (`write_traces`) prints `serde_json::to_string_pretty(&traces)`, a list of
`StackTrace` (src/stack_trace.rs): `pid`, `thread_id` (the pthread id), `thread_name` (or null),
`os_thread_id` (or null), `active`, `owns_gil`, `frames` innermost first, and `process_info`
(`{pid, command_line, parent}`, null in a dump). Each frame: `name`, `filename`, `module` (the
shared library of a native frame, null for Python), `short_filename` (or null), `line` (0 when
unknown), `locals`, `is_entry`, `is_shim_entry`. Every py-spy release since JSON output appeared
(2019) writes that list; an object wrapping such lists, several documents in one file, and a
list cut short are read too, since files get concatenated and pastes get cut.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.parsers.lines import WarningLog, clean_lines, looks_native
from sidecar.records import Frame, ParseResult, StackSample

_DECODER = json.JSONDecoder()


def _skip_space(text: str, pos: int, also: str = "") -> int:
    while pos < len(text) and (text[pos].isspace() or text[pos] in also):
        pos += 1
    return pos


def _salvage_list(text: str, pos: int) -> list[Any]:
    """The complete elements of a JSON list that starts at `pos` and is cut short."""
    items: list[Any] = []
    pos = _skip_space(text, pos + 1)
    while pos < len(text) and text[pos] != "]":
        try:
            item, pos = _DECODER.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError):
            break
        items.append(item)
        pos = _skip_space(text, pos, also=",")
    return items


def _documents(text: str, log: WarningLog) -> list[Any]:
    docs: list[Any] = []
    pos = _skip_space(text, 0)
    while pos < len(text):
        try:
            doc, pos = _DECODER.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError) as error:
            partial = _salvage_list(text, pos) if text[pos] == "[" else []
            docs.append(partial)
            line, what = _failure(error, text, pos)
            log.line(line, f"{what}; kept {len(partial)} complete threads before it")
            break
        docs.append(doc)
        pos = _skip_space(text, pos)
    return docs


def _failure(error: Exception, text: str, pos: int) -> tuple[int, str]:
    """The line and the words of a decoding failure. The decoder recurses once per level of
    nesting (py-spy writes four), so input nested past Python's limit raises RecursionError."""
    if isinstance(error, json.JSONDecodeError):
        return error.lineno, f"JSON cut off or invalid ({error.msg})"
    return text.count("\n", 0, pos) + 1, "JSON nested too deeply to be a py-spy dump"


def _traces(doc: Any) -> list[Any]:
    """The thread objects in one document: a list of them, one alone, or lists in an object."""
    if isinstance(doc, list):
        return doc
    if isinstance(doc, dict):
        if "frames" in doc:
            return [doc]
        return [item for value in doc.values() if isinstance(value, list) for item in value]
    return []


def _frame(obj: Any) -> Frame | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    short, full = obj.get("short_filename"), obj.get("filename")
    file = short if isinstance(short, str) and short else full if isinstance(full, str) else ""
    line = obj.get("line")
    line = line if isinstance(line, int) and not isinstance(line, bool) and line > 0 else None
    native = obj.get("module") is not None or looks_native(obj["name"], file)
    return Frame(obj["name"], file, line, native=native)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _thread_id(obj: dict[str, Any]) -> str | None:
    # As the text dump shows it (StackTrace::format_threadid), so both name a thread alike.
    if (os_tid := _int(obj.get("os_thread_id"))) is not None:
        return str(os_tid)
    if (tid := _int(obj.get("thread_id"))) is not None:
        return f"0x{tid:X}"
    return None


def _sample(obj: Any, index: int, log: WarningLog, source: str | None) -> StackSample | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("frames"), list):
        log.note(f"thread {index} of the JSON is not a py-spy trace (no frames list); skipped")
        return None
    frames = [_frame(item) for item in obj["frames"]]
    if None in frames:
        log.note(f"thread {index} of the JSON: skipped frames without a function name")
    info = obj.get("process_info")
    command = info.get("command_line") if isinstance(info, dict) else None
    active, name = obj.get("active"), obj.get("thread_name")
    return StackSample(
        frames=tuple(frame for frame in frames if frame is not None),
        thread_id=_thread_id(obj),
        thread_name=name if isinstance(name, str) else None,
        pid=_int(obj.get("pid")),
        process=command if isinstance(command, str) else None,
        idle=(not active) if isinstance(active, bool) else None,
        source=source,
    )


def parse_pyspy_json(text: str, source: str | None = None) -> ParseResult:
    """`py-spy dump --json`, innermost frame first as py-spy lists it."""
    log = WarningLog()
    cleaned = "\n".join(line.text for line in clean_lines(text))  # quote marks, log prefixes
    traces = [trace for doc in _documents(cleaned, log) for trace in _traces(doc)]
    samples = [_sample(trace, i, log, source) for i, trace in enumerate(traces, start=1)]
    stacks = tuple(sample for sample in samples if sample is not None)
    return ParseResult(stacks, log.render(), "pyspy_json")

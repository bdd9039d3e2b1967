"""`py-spy record --format speedscope`, read back as the collapsed stacks `--format raw` writes,
and cut into consecutive time slices.

Why: `--format raw` adds up each distinct stack's samples, so one py-spy run is one unit for a
comparison of windows, and a 20 s window of two runs has about one degree of freedom. The
speedscope file keeps each thread's samples in the order they were taken (one `sampled` profile
a thread, `samples` root first, one `weights` entry of 1/rate seconds a sample), so the same run
cuts into slices of `unit_s` seconds: with --idle every thread is read at every tick, so a
thread's i-th sample was taken at i / rate seconds (a thread that started after py-spy did is
placed from the run's start: its few samples land early, not lost).

The shapes, as benfred/py-spy 0.4 writes them (src/speedscope.rs): `shared.frames` holds
`{name, file, line}`; with --threads and --subprocesses the `thread (TID): NAME` and
`process PID:"CMDLINE"` pseudo-frames that `raw` puts at the root are frames with an empty file
at the root of each sample. A frame prints as raw prints it (src/flamegraph.rs, through
`StackTrace`'s frames): `NAME (SHORT:LINE)`, `NAME (SHORT)` for line 0, the bare NAME for an
empty file, where SHORT is py-spy's short file name (src/python_spy.rs `shorten_filename`: the
path below the innermost folder on its way up that is not a package, i.e. has no
`__init__.py`; the full name when the file cannot be found). `short` is that lookup, injected:
it needs the target's file system (sidecar/sampling/pyspy.py, `ShortNames`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Ordered:
    """One py-spy run: its collapsed stacks (`raw`, as `--format raw` writes them) and the
    same samples per time slice, in order (`parts`: stack line without its count -> samples)."""

    raw: str
    parts: tuple[Mapping[str, int], ...]
    samples: int


class SpeedscopeError(ValueError):
    """The file is not py-spy's speedscope output (the caller keeps the run, without slices)."""


def read_speedscope(
    text: str, rate_hz: float, unit_s: float, short: Callable[[str], str]
) -> Ordered:
    """The run in `text` at `rate_hz` samples a second, cut into slices of `unit_s` seconds."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise SpeedscopeError(f"not JSON: {exc}") from None
    frames, profiles = _shape(doc)
    labels = [_frame_text(f, short) for f in frames]
    per_slice = max(1, round(rate_hz * unit_s))
    parts: list[dict[str, int]] = []
    total: dict[str, int] = {}
    samples = 0
    for profile in profiles:
        for i, stack in enumerate(profile):
            try:
                key = ";".join(labels[k] for k in stack)
            except (IndexError, TypeError):
                raise SpeedscopeError("a sample names a frame not in shared.frames") from None
            if not key:
                continue
            n = i // per_slice
            while len(parts) <= n:
                parts.append({})
            parts[n][key] = parts[n].get(key, 0) + 1
            total[key] = total.get(key, 0) + 1
            samples += 1
    raw = "".join(f"{key} {n}\n" for key, n in total.items())
    return Ordered(raw, tuple(parts), samples)


def _shape(doc: Any) -> tuple[list[Any], list[list[Any]]]:
    if not isinstance(doc, dict):
        raise SpeedscopeError("not a speedscope document")
    frames = doc.get("shared", {}).get("frames") if isinstance(doc.get("shared"), dict) else None
    profiles = doc.get("profiles")
    if not isinstance(frames, list) or not isinstance(profiles, list):
        raise SpeedscopeError("no shared.frames or profiles")
    stacks = []
    for p in profiles:
        if not isinstance(p, dict) or p.get("type") != "sampled":
            raise SpeedscopeError("a profile is not py-spy's `sampled` kind")
        samples = p.get("samples")
        if not isinstance(samples, list):
            raise SpeedscopeError("a profile has no samples list")
        stacks.append(samples)
    return frames, stacks


def _frame_text(frame: Mapping[str, Any], short: Callable[[str], str]) -> str:
    name = str(frame.get("name", ""))
    file = str(frame.get("file") or "")
    if not file:
        return name
    line = frame.get("line")
    where = short(file)
    if isinstance(line, int) and line > 0:
        return f"{name} ({where}:{line})"
    return f"{name} ({where})"

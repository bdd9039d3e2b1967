"""py-spy's speedscope output read back as its raw output, cut into time slices
(sidecar/parsers/speedscope.py), on a pair py-spy wrote side by side from the real vLLM CPU
worker (devtools/ordered_check.py: `raw` and `speedscope` of the same process, same rate)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from sidecar.parsers import parse_raw
from sidecar.parsers.speedscope import SpeedscopeError, read_speedscope
from sidecar.sampling.pyspy import ShortNames

PAIR = Path(__file__).resolve().parents[2] / "fixtures" / "parsers" / "speedscope"


def recorded() -> tuple[str, str, int, dict[str, str]]:
    names = json.loads((PAIR / "short_names.json").read_text())
    return ((PAIR / "worker.json").read_text(), (PAIR / "worker.raw").read_text(),
            names["rate_hz"], names["short"])  # fmt: skip


def lines(raw: str) -> Counter[str]:
    out = Counter[str]()
    for line in raw.splitlines():
        if line.strip():
            key, n = line.rsplit(" ", 1)
            out[key] += int(n)
    return out


def test_every_frame_read_is_one_raw_printed_for_the_same_process() -> None:
    text, raw, rate, short = recorded()
    read = read_speedscope(text, rate, 1.0, lambda f: short.get(f, f))
    mine, theirs = lines(read.raw), lines(raw)
    # py-spy's short names: every file the reading names that raw names a file of the same
    # base name for is named exactly as raw names it (the path below the last package folder)
    raw_files = {_file(f) for k in theirs for f in k.split(";")} - {None}
    mine_files = {_file(f) for k in mine for f in k.split(";")} - {None}
    checked = [f for f in mine_files if any(Path(r).name == Path(f).name for r in raw_files)]
    assert len(checked) > 20
    assert all(f in raw_files for f in checked), sorted(set(checked) - raw_files)

    # the same threads, each sampled as often (the two runs start a moment apart)
    def threads(c: Counter[str]) -> Counter[str]:
        out = Counter[str]()
        for k, n in c.items():
            out[k.split(";", 1)[0]] += n
        return out

    mt, rt = threads(mine), threads(theirs)
    assert set(mt) == set(rt)
    assert all(abs(mt[t] - rt[t]) <= max(2, 0.1 * rt[t]) for t in rt)
    assert abs(sum(mine.values()) - sum(theirs.values())) <= 0.1 * sum(theirs.values())
    # the parser reads the lines as it reads py-spy's own, with the thread and its frames
    stacks = parse_raw(read.raw).stacks
    assert all(s.thread_id and s.frames for s in stacks)


def _lineless(stack: str) -> str:
    return re.sub(r":\d+\)(;|$)", r")\1", stack)


def _file(frame: str) -> str | None:
    m = re.search(r" \(([^()]*?)(:\d+)?\)$", frame)
    return m[1] if m else None


def test_the_slices_add_up_to_the_run_in_order() -> None:
    text, _, rate, short = recorded()
    read = read_speedscope(text, rate, 1.0, lambda f: short.get(f, f))
    total = Counter[str]()
    for part in read.parts:
        total.update(part)
    assert total == lines(read.raw)
    assert sum(total.values()) == read.samples
    # one slice a second of the run (the last one may be short), each thread in each
    doc = json.loads(text)
    longest = max(len(p["samples"]) for p in doc["profiles"])
    assert len(read.parts) == -(-longest // rate)
    assert all(sum(p.values()) >= len(doc["profiles"]) for p in read.parts[:-1])


def test_a_thread_sample_lands_in_the_slice_of_its_tick() -> None:
    doc = {"shared": {"frames": [{"name": "thread (7): T", "file": "", "line": 0},
                                 {"name": "f", "file": "/x/a.py", "line": 3},
                                 {"name": "g", "file": "/x/a.py", "line": 0}]},
           "profiles": [{"type": "sampled", "samples": [[0, 1]] * 5 + [[0, 2]] * 3}]}  # fmt: skip
    read = read_speedscope(json.dumps(doc), 4, 1.0, lambda f: "a.py")
    assert read.parts == ({"thread (7): T;f (a.py:3)": 4},
                          {"thread (7): T;f (a.py:3)": 1, "thread (7): T;g (a.py)": 3})  # fmt: skip
    assert lines(read.raw) == {"thread (7): T;f (a.py:3)": 5, "thread (7): T;g (a.py)": 3}


@pytest.mark.parametrize(
    ("text", "why"),
    [("{", "not JSON"), ("[]", "not a speedscope"), ('{"profiles": []}', "no shared.frames"),
     ('{"shared": {"frames": []}, "profiles": [{"type": "evented"}]}', "sampled"),
     ('{"shared": {"frames": []}, "profiles": [{"type": "sampled", "samples": [[3]]}]}',
      "not in shared.frames")],
)  # fmt: skip
def test_a_garbled_file_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(SpeedscopeError, match=why):
        read_speedscope(text, 5, 1.0, str)


def test_short_names_follow_py_spy_up_to_the_first_folder_that_is_no_package() -> None:
    files = {"/proc/9/root/v/site-packages/vllm/v1/core.py", "/proc/9/root/v/site-packages/vllm/__init__.py",
             "/proc/9/root/v/site-packages/vllm/v1/__init__.py", "/proc/9/root/usr/lib/threading.py"}  # fmt: skip
    seen: list[str] = []

    def stat(path: str) -> object:
        seen.append(path)
        if path not in files:
            raise FileNotFoundError(path)
        return object()

    names = ShortNames(stat=stat)
    assert names.short(9, "/v/site-packages/vllm/v1/core.py") == "vllm/v1/core.py"
    assert names.short(9, "/usr/lib/threading.py") == "threading.py"
    assert names.short(9, "<string>") == "<string>"
    assert names.short(9, "/gone.py") == "/gone.py"  # py-spy prints what it cannot find in full
    asked = len(seen)
    assert names.short(9, "/v/site-packages/vllm/v1/core.py") == "vllm/v1/core.py"
    assert len(seen) == asked  # remembered


def test_short_names_read_this_namespace_when_the_targets_root_is_refused() -> None:
    def stat(path: str) -> object:
        if path.startswith("/proc/"):
            raise PermissionError(path)
        if path in ("/a/pkg/m.py", "/a/pkg/__init__.py"):
            return object()
        raise FileNotFoundError(path)

    assert ShortNames(stat=stat).short(5, "/a/pkg/m.py") == "pkg/m.py"

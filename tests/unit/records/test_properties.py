"""Property tests: the readers of outside input never crash, whatever they are given.

Stack text, config files and `/metrics` answers come from operators, pastes and servers we do not
control. Each reader has one documented way to refuse (parse_file: InputError for a file it
cannot read; load_config: ConfigError; parse_scrape: a scrape whose `error` says why) and must
turn everything else into data: a warning naming the line, or a reason. Inputs are arbitrary
text and bytes, and real fixtures (tests/fixtures) mutated the way pastes and answers get
damaged: cut short, lines dropped, doubled, swapped or garbled.
"""

from __future__ import annotations

import functools
import math
import re
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.config.load import load_config
from sidecar.config.settings import Config
from sidecar.errors import ConfigError
from sidecar.parsers import PARSERS, InputFormat, detect_format, parse_file, parse_text
from sidecar.records import ParseResult, StackSample
from sidecar.vllm_metrics import MetricsScrape, ServingFigures, parse_scrape, serving_figures
from sidecar.vllm_metrics import figures as vllm_figures

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
STACK_FIXTURES = sorted(
    path
    for folder in ("parsers", "public")
    for path in (FIXTURES / folder).iterdir()
    if path.suffix in (".txt", ".json")
)
CORPORA = {"stacks": [path.read_text() for path in STACK_FIXTURES]}

# Modest example counts keep the unit suite in seconds; `derandomize` makes a run reproducible,
# so a failure seen once is seen again (and in CI) rather than by chance.
FAST = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SLOW = settings(FAST, max_examples=50)  # inputs that take milliseconds each

# ---------------------------------------------------------------------------- damaged text

# What shows up in pastes: other formats' punctuation, log prefixes, control characters.
_TOKENS = [*"()[]{}:;\"'#>|~+-=., \t\x00\x1b\u2028\ufffd", "0x7f", "12", "pid=", "Thread "]
_NOISE = st.lists(st.sampled_from(_TOKENS), max_size=10).map("".join) | st.text(max_size=20)


def _cut(text: str, draw: Callable[..., Any]) -> str:
    return text[: draw(st.integers(0, len(text)))]


@st.composite
def damaged(draw: Callable[..., Any], corpus: str) -> str:
    """A real text of `corpus` (CORPORA) with one to four kinds of damage applied, at places
    hypothesis chooses. Named by key so that a failure report shows a name, not the texts."""
    lines = draw(st.sampled_from(CORPORA[corpus])).split("\n")
    for _ in range(draw(st.integers(1, 4))):
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        j = draw(st.integers(0, max(len(lines) - 1, 0)))
        action = draw(st.sampled_from(["cut", "drop", "double", "swap", "insert", "garble"]))
        if action == "cut":
            lines = [*lines[:i], _cut(lines[i], draw)] if lines else lines
        elif action == "drop" and lines:
            del lines[i]
        elif action == "double" and lines:
            lines.insert(i, lines[i])
        elif action == "swap" and lines:
            lines[i], lines[j] = lines[j], lines[i]
        elif action == "insert":
            lines.insert(i, draw(_NOISE))
        elif action == "garble" and lines:
            at = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:at] + draw(_NOISE) + lines[i][at + draw(st.integers(0, 5)) :]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- stack parsers


def _well_formed(result: ParseResult) -> None:
    assert isinstance(result, ParseResult)
    assert all(isinstance(stack, StackSample) and stack.weight > 0 for stack in result.stacks)
    assert all(isinstance(warning, str) and warning for warning in result.warnings)
    if not result.stacks:  # nothing found is said, never silent
        assert result.warnings


@FAST
@given(st.text() | damaged("stacks"))
@example("Process 1: x\nThread 0x1 (idle)\n    f (a.py:1)\n")
@example('[{"frames": [{"name": 1}], "pid": true, "line": "x"}]')
@example("[" * 5000)
@example('[{"frames":' * 3000)  # nesting past the JSON decoder's recursion limit
@example('{"traces": [' + "[" * 100_000 + "]" * 100_000 + "]}")
def test_parse_text_never_raises(text: str) -> None:
    assert detect_format(text) in set(InputFormat)
    _well_formed(parse_text(text, source="paste"))


@FAST
@given(st.sampled_from(list(InputFormat)), st.text() | damaged("stacks"))
def test_every_parser_reads_any_text(input_format: InputFormat, text: str) -> None:
    """A forced format on the wrong text (the CLI's --format) gives warnings, not a crash."""
    _well_formed(parse_text(text, source="paste", input_format=input_format))
    result = PARSERS[input_format](text, None)  # each parser alone, too
    assert isinstance(result, ParseResult) and result.format == input_format.value


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


@FAST
@given(
    st.binary()
    | damaged("stacks").map(str.encode)
    | st.tuples(damaged("stacks"), st.sampled_from(["utf-16", "latin-1", "utf-8-sig"])).map(
        lambda pair: pair[0].encode(pair[1], errors="replace")
    )
)
@example(b"\xff\xfe\x00")  # a UTF-16 byte-order mark with half a character after it
@example(b"Thread 1 (idle)\n    f (a.py:1)\n\xc3")
def test_parse_file_reads_any_bytes(scratch: Path, data: bytes) -> None:
    path = scratch / "stack.txt"
    path.write_bytes(data)
    result = parse_file(path)
    _well_formed(result)
    if not _decodes(data):
        assert any("not UTF-8" in warning for warning in result.warnings)


def _decodes(data: bytes) -> bool:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return True  # read as UTF-16, with replacement characters if it is not
    try:
        data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return False
    return True


# A garbled line that no format can read as a frame or a header: no parentheses, no count.
_GARBLE = st.text(st.sampled_from(list("!#$%&*+=?@^`")), min_size=1, max_size=30)
_LINE_READERS = {
    "pyspy_dump.txt": InputFormat.PYSPY_DUMP,
    "pyspy_dump_locals.txt": InputFormat.PYSPY_DUMP,
    "pyspy_dump_subprocesses.txt": InputFormat.PYSPY_DUMP,
    "pyspy_record.raw.txt": InputFormat.PYSPY_RAW,
    "pyspy_record_threads_idle_subprocesses.raw.txt": InputFormat.PYSPY_RAW,
    "pyspy_dump.json": InputFormat.PYSPY_JSON,
}


@FAST
@given(st.sampled_from(sorted(_LINE_READERS)), st.data(), _GARBLE)
def test_a_garbled_line_is_a_warning_naming_it(name: str, data: st.DataObject, junk: str) -> None:
    """A line inserted into real py-spy output is named by number, and the rest still reads."""
    lines = (FIXTURES / "parsers" / name).read_text().rstrip("\n").split("\n")
    first = 1 if _LINE_READERS[name] is InputFormat.PYSPY_JSON else 0  # keep `[` first
    at = data.draw(st.integers(first + 1, len(lines)), label="inserted as line")
    text = "\n".join([*lines[: at - 1], junk, *lines[at - 1 :]])
    clean = parse_text("\n".join(lines))
    result = parse_text(text)
    assert result.format == _LINE_READERS[name].value
    assert any(warning.startswith(f"line {at}: ") for warning in result.warnings), result
    if result.format != InputFormat.PYSPY_JSON:  # JSON keeps only what came before the break
        assert sum(s.weight for s in result.stacks) == sum(s.weight for s in clean.stacks)


# ---------------------------------------------------------------------------- config loader

ENV_PREFIX = "VLLM_SIDECAR_"


def _default(field: Any) -> Any:
    return field.default_factory() if field.default is MISSING else field.default


# Known sections and keys, read from the Config dataclasses so that new settings are covered.
_DEFAULTS = {f.name: _default(f) for f in fields(Config) if f.name != "source"}
_SECTION_KEYS = {
    name: [f.name for f in fields(default)]
    for name, default in _DEFAULTS.items()
    if is_dataclass(default)
}
_TOP_KEYS = [name for name in _DEFAULTS if name not in _SECTION_KEYS]

# Values of every YAML kind, biased towards what a setting might hold or nearly hold: numbers
# at the edges (NaN and infinities too: YAML writes them .nan / .inf) and strings that look like
# numbers, durations, shares or booleans.
_EDGES = ["inf", "-inf", "nan", "1e999", "2%", "1e999%", "90s", "1e999s", "5m", "0", "-1", "0x10"]
_SCALARS = (
    st.sampled_from([math.inf, -math.inf, math.nan, 0, -1, 0.0, 1e308, 2**63, 2**1000, True])
    | st.sampled_from([*_EDGES, "off", "null", "true", "no", "127.0.0.1:19464", "/tmp/x", "info"])
    | st.none()
    | st.integers()
    | st.floats()
    | st.text(max_size=12)
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=8,
)


_PLACES = [
    *((section, key) for section, keys in _SECTION_KEYS.items() for key in [*keys, "bogus"]),
    *((key, None) for key in [*_TOP_KEYS, "bogus"]),
]


@st.composite
def config_documents(draw: Callable[..., Any]) -> Any:
    """Mostly known settings with odd values (so the values reach the checks), else anything."""
    if draw(st.integers(0, 9)) == 0:
        return draw(_VALUES)
    document: dict[str, Any] = {}
    for section, key in draw(st.lists(st.sampled_from(_PLACES), min_size=1, max_size=3)):
        value = draw(_SCALARS if draw(st.integers(0, 9)) else _VALUES)
        if key is None:
            document[section] = value
        elif isinstance(document.setdefault(section, {}), dict):
            document[section][key] = value
    return document


_ENV_NAMES = st.sampled_from(
    [f"{ENV_PREFIX}{key.upper()}" for key in _TOP_KEYS]
    + [f"{ENV_PREFIX}{s.upper()}_{k.upper()}" for s, keys in _SECTION_KEYS.items() for k in keys]
    + [f"{ENV_PREFIX}BOGUS", ENV_PREFIX, "PATH", "VLLM_SIDECAR"]
)
_ENV_VALUES = st.sampled_from([*_EDGES, "off", "true", "maybe", "/tmp/x", "3.5"]) | st.text(
    st.characters(exclude_characters="\x00"), max_size=12
)


@SLOW
@given(config_documents(), st.dictionaries(_ENV_NAMES, _ENV_VALUES, max_size=2))
@example({"target": {"pid": math.inf}}, {})
@example({}, {f"{ENV_PREFIX}TARGET_PID": "1e999"})
@example({"sampling": {"rate_hz": math.nan}}, {})
@example({"schedule": {"window_s": "1e999s"}}, {})
def test_load_config_raises_only_config_error(
    scratch: Path, document: Any, environ: dict[str, str]
) -> None:
    path = scratch / "config.yaml"
    path.write_text(yaml.safe_dump(document, allow_unicode=True))
    try:
        config = load_config(path, environ, {})
    except ConfigError as error:
        assert str(error)  # it says what is wrong
        return
    assert isinstance(config, Config)
    for number in (config.sampling.rate_hz, config.schedule.window_s, config.schedule.interval_s):
        assert math.isfinite(number), config  # an infinity accepted here is a bug later
    for section in _SECTION_KEYS:
        for key in _SECTION_KEYS[section]:
            value = getattr(getattr(config, section), key)
            assert not (isinstance(value, float) and math.isnan(value)), (section, key, config)


@FAST
@given(st.text(max_size=300))
def test_load_config_reads_any_file_text(scratch: Path, text: str) -> None:
    path = scratch / "config.yaml"
    path.write_text(text)
    try:
        assert isinstance(load_config(path, {}, {}), Config)
    except ConfigError as error:
        assert str(error)


# ---------------------------------------------------------------------------- /metrics reader

_READ_FAMILIES = tuple(
    name
    for value in vars(vllm_figures).values()
    if isinstance(value, tuple) and all(isinstance(v, str) for v in value)
    for name in value
    if name.startswith("vllm:")
)


def _figure_lines(text: str) -> str:
    """The lines of a real scrape that serving_figures reads, comments included: a 50 kB answer
    parses in tens of milliseconds, the families the figures use in a few."""
    wanted = {*_READ_FAMILIES, vllm_figures.PROCESS_START}
    kept = [line for line in text.split("\n") if _family(line) in wanted]
    return "\n".join(kept) + "\n"


def _family(line: str) -> str:
    words = line.split()
    name = words[2] if line.startswith("#") and len(words) > 2 else re.split(r"[{ ]", line)[0]
    return re.sub(r"_(total|bucket|sum|count|created)$", "", name)


METRICS = FIXTURES / "metrics"
SCRAPES = [
    _figure_lines((METRICS / f"v0.32.0-cpu-{when}{names}.txt").read_text())
    for when in ("before", "after")
    for names in ("", "-oldnames")
]
CORPORA["scrapes"] = SCRAPES
URL = "http://127.0.0.1:8000/metrics"


def _scrape(text: str, taken_at: float) -> MetricsScrape:
    return parse_scrape(text, url=URL, taken_at=taken_at, wall=0.0)


@functools.cache
def _parsed(index: int) -> MetricsScrape:
    return _scrape(SCRAPES[index], 100.0)


def _checked(scrape: MetricsScrape) -> MetricsScrape:
    assert isinstance(scrape, MetricsScrape)
    if not scrape.ok:
        assert scrape.error and not scrape.samples
    return scrape


def _figures_ok(figures: ServingFigures) -> None:
    for field in fields(figures):
        value = getattr(figures, field.name)
        if isinstance(value, float):
            assert math.isfinite(value), (field.name, figures)  # None, never NaN or inf


def test_the_trimmed_fixtures_still_give_figures() -> None:
    """_figure_lines keeps what the figures read: the real pair still yields them all."""
    figures = serving_figures(_scrape(SCRAPES[0], 0.0), _scrape(SCRAPES[2], 30.0))
    assert figures.reason is None and not figures.missing, figures
    assert figures.ttft_p95_s is not None and figures.kv_cache_usage is not None


@FAST
@given(st.text() | damaged("scrapes"))
@example("vllm:x 1\n")
@example('vllm:x{le="+Inf"} 1\nvllm:x_count NaN\n')
@example('# TYPE vllm:x histogram\nvllm:x_bucket{le="a"} 1\n')
def test_parse_scrape_never_raises(text: str) -> None:
    _checked(_scrape(text, 1.0))


_NUMBERS = st.sampled_from(["NaN", "+Inf", "-Inf", "-1", "0", "1e308", "1e-320", "x", ""])


@st.composite
def renumbered(draw: Callable[..., Any]) -> str:
    """A real scrape whose sample values are replaced here and there by odd numbers."""
    lines = draw(st.sampled_from(SCRAPES)).split("\n")
    for _ in range(draw(st.integers(1, 6))):
        i = draw(st.integers(0, len(lines) - 1))
        if lines[i] and not lines[i].startswith("#"):
            lines[i] = lines[i].rsplit(" ", 1)[0] + " " + draw(_NUMBERS)
    return "\n".join(lines)


@SLOW
@given(
    st.sampled_from(range(len(SCRAPES))),
    damaged("scrapes") | renumbered() | st.text(),
    st.floats(-10, 60, allow_nan=False),
)
def test_serving_figures_never_raise(first: int, last: str, gap_s: float) -> None:
    """Figures from a real first scrape and a damaged later one: None and a reason, no crash."""
    before = _parsed(first)
    after = _checked(_scrape(last, 100.0 + gap_s))
    figures = serving_figures(before, after)
    assert isinstance(figures, ServingFigures)
    _figures_ok(figures)
    if not after.ok:
        assert figures.reason == after.error
    _figures_ok(serving_figures(after))  # a single scrape, too
    _figures_ok(serving_figures(after, before))  # and backwards in time

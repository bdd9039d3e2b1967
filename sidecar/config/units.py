"""What a config value means, declared per setting: a `Unit` turns what an operator wrote (in a
YAML file, a variable or a flag) into the number or object the code uses, or says why not.

A suffix means the same everywhere, scaled to the setting's own unit: `7d` is 604800 for a
seconds setting and 7 for a days setting. A value of the wrong kind is refused rather than
guessed at: `2%` is a share, so a megabyte setting refuses it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from os import PathLike, fspath
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sidecar.config.listen import FORMS, listen_address
from sidecar.records.window import SamplingMode


class Unfit(ValueError):
    """A value this unit cannot take; the message says what is wrong with it ("is a share")."""


@dataclass(frozen=True, slots=True)
class Unit:
    name: str
    parse: Callable[[Any], Any]  # raises Unfit
    hint: str  # what fits, with examples


_NUMBER = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([a-z%]*)\s*", re.I)
_DAY = 86400.0


def kind_of(value: Any) -> str:
    """`a list`, `a mapping`, ...: what a value is, for a message about what it should be."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, Mapping):
        return "a mapping"
    return f"a {type(value).__name__}"


def quantity(value: Any, scale: Mapping[str, float], most: float) -> float:
    """A non-negative finite number, a bare one or with one of `scale`'s suffixes."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise Unfit(f"is {kind_of(value)}")
    if isinstance(value, str):
        match = _NUMBER.fullmatch(value)
        if match is None:
            raise Unfit("is not a number")
        suffix = match[2].lower()
        if suffix not in scale:
            raise Unfit(
                "is a share" if suffix == "%" else f"has a unit ({match[2]}) that does not fit"
            )
        number = float(match[1]) * scale[suffix]
    else:
        try:
            number = float(value)
        except OverflowError:
            raise Unfit("is far too large") from None
    if not math.isfinite(number):
        raise Unfit("is not a finite number")
    if number < 0:
        raise Unfit("is negative")
    if number > most:
        raise Unfit(f"is more than the most this setting takes ({most:g})")
    return number


def _scaled(scale: Mapping[str, float], most: float) -> Callable[[Any], float]:
    return lambda value: quantity(value, scale, most)


def _share(value: Any) -> float:
    share = quantity(value, {"": 1.0, "%": 0.01}, math.inf)
    if not 0 < share <= 1:
        raise Unfit("is not between 0 and 1 (100%) of one core")
    return share


def _hertz(value: Any) -> float:
    rate = quantity(value, {"": 1.0, "hz": 1.0}, 1000.0)
    if rate == 0:
        raise Unfit("is zero")
    return rate


def _bool(value: Any) -> bool:
    # Strict: 2, "maybe" or a list are mistakes, not truthy values.
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower() if isinstance(value, str | int) else None
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise Unfit(f"is {kind_of(value)}" if text is None else "is not true or false")


def _text(value: Any) -> str:
    if isinstance(value, PathLike):
        value = fspath(value)
    if not isinstance(value, str):
        raise Unfit(f"is {kind_of(value)}")
    if not value.strip() or "\0" in value:
        raise Unfit("is empty" if not value.strip() else "holds a NUL byte")
    return value


def _pid(value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*-?[0-9]{1,12}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise Unfit("is not a whole number" if isinstance(value, str | float) else
                    f"is {kind_of(value)}")  # fmt: skip
    if not 1 <= value <= 2**22:  # the kernel's largest pid_max
        raise Unfit("is not a process ID (1 to 4194304)")
    return value


def _url(value: Any) -> str:
    text = _text(value).strip()
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018 (raises on a port that is not a number in range)
    except ValueError as exc:
        raise Unfit(f"is not a URL ({exc})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise Unfit("is not an http(s) URL with a host")
    return text


def _object_url(value: Any) -> str:
    """s3://bucket/prefix; a key or secret in it (s3://KEY:SECRET@bucket) is refused: the
    credentials come from the AWS chain, never from the config (config.CREDENTIALS_HELP)."""
    text = _text(value).strip()
    parts = urlsplit(text)
    if parts.scheme != "s3" or not parts.netloc:
        raise Unfit("is not an s3://bucket/prefix URL")
    if "@" in parts.netloc or parts.password is not None:
        raise Unfit("holds credentials; give them in the AWS environment or ~/.aws, not here")
    if parts.query or parts.fragment:
        raise Unfit("has a query or fragment; give s3://bucket/prefix only")
    return text.rstrip("/")


def _count(value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"\s*[0-9]{1,6}\s*", value):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Unfit("is not a whole number >= 0")
    return value


def _log_level(value: Any) -> str:
    text = _text(value).strip().lower()
    if text not in LOG_LEVELS:
        raise Unfit("is not a log level")
    return text


def _sampling_mode(value: Any) -> SamplingMode:
    text = _text(value).strip().lower()
    if text not in SAMPLING_MODES:
        raise Unfit("is not a sampling mode")
    return SamplingMode(text)


def _listen(value: Any) -> str:
    if value is False:  # YAML 1.1 reads a bare `off` as false
        return "off"
    text = str(value) if isinstance(value, int) and not isinstance(value, bool) else _text(value)
    try:
        listen_address(text)
    except ValueError as exc:
        raise Unfit(str(exc)) from None
    return text.strip()


LOG_LEVELS = ("debug", "info", "warning", "error")
# A stall incident's `dump` is a window's mode, never one to configure.
SAMPLING_MODES = (SamplingMode.CONTINUOUS.value, SamplingMode.WINDOWS.value)

SECONDS = Unit(
    "seconds",
    _scaled({"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": _DAY}, 366 * _DAY),
    "give a duration: 90 (seconds), 90s, 5m, 1h or 7d",
)
DAYS = Unit(
    "days",
    _scaled({"": 1.0, "d": 1.0, "h": 1 / 24, "m": 1 / 1440, "s": 1 / _DAY}, 100 * 366.0),
    "give a number of days: 7, 7d or 12h",
)
_MIB = {"k": 1 / 1024, "m": 1.0, "g": 1024.0, "t": 1024.0**2}
MEGABYTES = Unit(
    "megabytes",
    _scaled(
        {"": 1.0} | {k + tail: v for k, v in _MIB.items() for tail in ("", "b", "ib")},
        1024.0**3,  # a pebibyte
    ),
    "give a size in megabytes, e.g. 2048 or 2G",
)
SHARE = Unit("share", _share, "give a share of one core, e.g. 2% or 0.02")
HERTZ = Unit("hertz", _hertz, "give samples per second, e.g. 5 or 5Hz, at most 1000")
BOOL = Unit("bool", _bool, "give true or false")
PATH = Unit("path", lambda value: Path(_text(value)), "give a path, e.g. /var/lib/vllm-sidecar")
COMMAND = Unit("command", _text, "give a command on PATH or a path to it, e.g. /usr/bin/py-spy")
PID = Unit("pid", _pid, "give a process ID, e.g. 4242")
URL = Unit("url", _url, "give an http(s) URL, e.g. http://127.0.0.1:8000/metrics")
OBJECT_URL = Unit(
    "object store URL", _object_url, "give s3://bucket/prefix, e.g. s3://profiles/vllm"
)
COUNT = Unit("count", _count, "give a whole number, e.g. 3")
LOG_LEVEL = Unit("log level", _log_level, f"give one of {', '.join(LOG_LEVELS)}")
SAMPLING_MODE = Unit("sampling mode", _sampling_mode, "give continuous or windows")
LISTEN = Unit("listen address", _listen, FORMS)


def moment(value: str, now: float) -> float:
    """A point in time as Unix seconds: a duration back from `now` (90m, 12h, 7d) or an ISO
    date or time (2026-11-20, 2026-11-20T06:00; UTC unless it names a zone)."""
    try:
        return now - float(SECONDS.parse(value))
    except Unfit:
        pass
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise Unfit(
            "is neither a duration nor a time: give e.g. 7d, 12h or 2026-11-20T06:00 (UTC)"
        ) from None
    return (when.replace(tzinfo=UTC) if when.tzinfo is None else when).timestamp()

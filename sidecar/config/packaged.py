"""Where the built-in configs are: package data of `sidecar.configs` (phases.yaml, advice.yaml,
the example sidecar.yaml), read through importlib.resources, so that they are found however the
package is installed (a venv, `pip install --user`, `--target`, an image). One place, so that
moving a module cannot send a lookup elsewhere."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import yaml

from sidecar.errors import ConfigError

PACKAGE = "sidecar.configs"


def packaged_config(filename: str) -> Path:
    """The built-in `FILENAME` (package data of sidecar.configs) as a path on disk.

    pip installs packages as files, so the resource is a file; a package imported from a zip
    archive has no path, and that is said with the fix."""
    resource = resources.files(PACKAGE) / filename
    if isinstance(resource, Path):
        return resource
    raise ConfigError(
        f"the built-in {filename} is inside an archive ({resource}), not a file; install "
        "vllm-sidecar unzipped (pip install vllm-sidecar), or pass the file with --config, "
        "--rules or --advice"
    )


def read_config_text(path: Path, what: str, kind: str, fix: str) -> str:
    """The text of the config file `path` (rules, advice), or a ConfigError: unreadable
    (missing, no permission) naming `what` and `fix`, or not UTF-8 text, not `kind`."""
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror or exc}. {fix}") from exc
    except ValueError as exc:  # UnicodeDecodeError: not a text file
        raise ConfigError(f"{path} is not {kind} ({exc})") from None


# A YAML alias repeats what it points to wherever it is used: 384 bytes of aliases to aliases
# stand for millions of values (a "billion laughs"). Loading shares them, but anything that
# walks or prints the value pays for every repeat (an error message took 10 s and 677 MB:
# issue 26, item 17). Real configs hold a few thousand values.
MAX_YAML_VALUES = 200_000


def load_yaml(text: str, source: str) -> Any:
    """`text` as YAML (libyaml's safe loader when present), refused with a ConfigError when it
    expands, aliases repeated, past MAX_YAML_VALUES values or nests past the interpreter's
    limit. yaml.YAMLError is left to the caller, which names the file's kind."""
    try:
        data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except RecursionError:
        raise ConfigError(f"{source} nests too deep to read; flatten it") from None
    try:
        values = expanded_size(data)
    except CycleError:  # it walked for ever, growing, before (issue 26, item 17)
        raise ConfigError(
            f"{source} holds a value that contains itself (an alias inside its own anchor); "
            "write the value out"
        ) from None
    if values > MAX_YAML_VALUES:
        raise ConfigError(
            f"{source} expands to over {MAX_YAML_VALUES:,} values (YAML aliases repeat what they "
            "point to); write the values out instead of aliasing aliases"
        )
    return data


def expanded_size(data: Any) -> int:
    """The values in `data` with every repeat counted (linear in the distinct objects);
    capped just past MAX_YAML_VALUES."""
    size: dict[int, int] = {}
    for item, kids in distinct_postorder(data, _kids):
        size[id(item)] = min(1 + sum(size[id(k)] for k in kids), MAX_YAML_VALUES + 1)
    return size[id(data)]


T = TypeVar("T")


class CycleError(ValueError):
    """distinct_postorder met an object inside itself (`a: &a [1, *a]` in YAML)."""


def distinct_postorder(
    root: T, children: Callable[[T], Sequence[T]]
) -> Iterator[tuple[T, Sequence[T]]]:
    """Each distinct object under `root` (by identity) once with its children, children before
    their parents: what a size or depth over shared parts (YAML aliases, an advice define used
    twice) is folded over. A loop, not recursion, so that no depth raises RecursionError."""
    done: set[int] = set()
    started: set[int] = set()  # expanded, its children not all done yet
    todo: list[tuple[T, bool]] = [(root, False)]
    while todo:
        item, children_done = todo.pop()
        if id(item) in done:
            continue
        kids = children(item)
        if not children_done:
            if id(item) in started:  # met again under itself
                raise CycleError("a value contains itself")
            started.add(id(item))
            todo.append((item, True))
            todo.extend((k, False) for k in kids if id(k) not in done)
            continue
        done.add(id(item))
        yield item, kids


def _kids(item: Any) -> list[Any]:
    if isinstance(item, dict):
        return [*item.keys(), *item.values()]
    if isinstance(item, list | tuple | set):
        return list(item)
    return []

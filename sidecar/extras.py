"""The optional parts of the install (setup.cfg's extras) and what each brings.

The core install (`pip install vllm-sidecar`) is the daemon, `snapshot`, `report`, `doctor`,
`classify` and `flamegraph`. The libraries only some commands need come with an extra; when one
is missing, the command says which `pip install` brings it, rather than a traceback. The table
is data: setup.cfg's [options.extras_require] lists the same modules (a unit test holds the two
together).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib.util import find_spec

from sidecar.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Extra:
    name: str
    modules: tuple[str, ...]  # top-level import names it brings
    distributions: tuple[str, ...]  # what setup.cfg lists for it
    used_by: str  # the commands that need it


EXTRAS: tuple[Extra, ...] = (
    Extra("analysis", ("scipy", "matplotlib", "duckdb", "fsspec"),
          ("scipy", "matplotlib", "duckdb", "fsspec"),
          "diff, trend's level changes and --plot, aggregate, report --html's comparison with "
          "the baseline"),
    Extra("tensorboard", ("tensorboardX",), ("tensorboardX",), "export tensorboard"),
    Extra("s3", ("s3fs", "botocore", "aiobotocore"), ("s3fs",),
          "upload: to object storage, aggregate over s3://"),
)  # fmt: skip


def extra_of(module: str) -> Extra | None:
    """The extra that brings the import name MODULE (or its top-level package), if any."""
    top = module.partition(".")[0]
    return next((e for e in EXTRAS if top in e.modules), None)


def pip_line(extra: Extra) -> str:
    return f"pip install 'vllm-sidecar[{extra.name}]'"


class MissingExtra(ConfigError):
    """A command needs a library of an extra that is not installed (exit 2, as a bad config:
    the fix is in the install, and the message names it)."""


def missing_extra(error: ModuleNotFoundError, command: str | None = None) -> MissingExtra | None:
    """ERROR as the operator's fix when the missing module comes with one of the extras;
    None when it does not (then it is a broken install or a bug, and stays a traceback)."""
    extra = extra_of(error.name or "")
    if extra is None:
        return None
    who = f"vllm-sidecar {command}" if command else "this command"
    return MissingExtra(
        f"{who} needs {error.name}, which the [{extra.name}] extra installs ({extra.used_by}): "
        f"{pip_line(extra)} in the environment vllm-sidecar runs from"
    )


def missing_modules(extra: Extra) -> tuple[str, ...]:
    """The import names of EXTRA that are not installed here (empty: the extra is)."""
    return tuple(m for m in extra.modules if find_spec(m) is None)

"""The sidecar's one version: the installed distribution's, else the checkout's constant.

Kept apart from the package face (`sidecar/__init__.py`) so that the fingerprint and the exporter
take it without importing the face, whose lazy `__getattr__` reaches the Python interface (and
through it pandas and pydantic) for an import checker."""

from __future__ import annotations

import importlib.metadata
from functools import lru_cache

CHECKOUT_VERSION = "0.1.0"


@lru_cache(maxsize=1)
def sidecar_version() -> str:
    try:
        return importlib.metadata.version("vllm-sidecar")
    except importlib.metadata.PackageNotFoundError:  # run from a checkout, not installed
        return CHECKOUT_VERSION

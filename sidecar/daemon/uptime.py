"""A target's comings and goings, kept one way for the single daemon and each fleet deployment:
the rediscovery's backoff.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
FIRST_WAIT_S = 1.0
BACKOFF_MAX_S = 30.0


def backoff(find: Callable[[], T | None], sleep: Callable[[float], bool]) -> T | None:
    """`find()` at once, then after 1, 2, 4 ... s (at most 30 s) until it finds something;
    None when `sleep(seconds)` says the daemon was asked to stop meanwhile. A wait with a
    deadline is `find`'s to end: it raises the error that names what it waited for."""
    delay = FIRST_WAIT_S
    while (found := find()) is None:
        if sleep(delay):
            return None
        delay = min(delay * 2, BACKOFF_MAX_S)
    return found

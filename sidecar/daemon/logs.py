"""Logging to stderr in a journald-friendly form.

Under systemd (JOURNAL_STREAM set) each line starts with its syslog priority (`<4>`), which
journald turns into the entry's priority, and carries no timestamp (journald adds its own).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

_PRIORITY = {logging.DEBUG: 7, logging.INFO: 6, logging.WARNING: 4, logging.ERROR: 3,
             logging.CRITICAL: 2}  # fmt: skip


class JournalFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return f"<{_PRIORITY.get(record.levelno, 6)}>{super().format(record)}"


def journal_prefix(priority: int, environ: Mapping[str, str] | None = None) -> str:
    """`<priority>` for a line written straight to stderr under systemd (JOURNAL_STREAM set), as
    the log lines carry theirs; nothing elsewhere. Without it journald files the line as info."""
    env = os.environ if environ is None else environ
    return f"<{priority}>" if env.get("JOURNAL_STREAM") else ""


def setup_logging(level: str = "info", environ: Mapping[str, str] | None = None) -> None:
    env = os.environ if environ is None else environ
    handler = logging.StreamHandler(sys.stderr)
    if env.get("JOURNAL_STREAM"):
        handler.setFormatter(JournalFormatter("%(levelname)s %(message)s"))
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("vllm_sidecar")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False

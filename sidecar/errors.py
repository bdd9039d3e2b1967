"""The error hierarchy. Exit codes are decided in exactly one place: `exit_code`.

Every message names the fix, so an operator reading a journal line knows what to do.
"""

from __future__ import annotations

from enum import IntEnum


class ExitStatus(IntEnum):
    """What a command that ended without an error says by its exit code."""

    OK = 0
    CHECKS_FAILED = 1  # `doctor`: a check failed; what to fix is printed beside it
    REGRESSION = 10  # `diff --fail-on`: a significant regression beyond the threshold
    ABORTED = 130  # Ctrl-C: 128 + SIGINT, as a shell reports it


class SidecarError(Exception):
    """An error the operator can act on. The message says how."""

    exit_code = 1


class ConfigError(SidecarError):
    """A bad flag, config file or rules file."""

    exit_code = 2


class InputError(SidecarError):
    """An input file that cannot be read at all."""

    exit_code = 3


class AttachError(SidecarError):
    """The target cannot be found or attached to (missing PID, not Python, ptrace refused)."""

    exit_code = 4


class SamplerError(SidecarError):
    """py-spy is missing or failed in a way that no retry will fix."""

    exit_code = 5


class OutputError(SidecarError):
    """A snapshot could not be written (disk full, permissions)."""

    exit_code = 6


class TriggerError(SidecarError):
    """`vllm-sidecar trigger` could not have a snapshot taken (exit 1)."""


class UploadError(SidecarError):
    """A folder's upload did not complete (the store refused, or the listing did not match):
    counted and retried by the upload thread, never an exit of its own."""


BUG_EXIT = 70  # EX_SOFTWARE: a bug in the sidecar, not an operator error


def exit_code(error: BaseException) -> int:
    if isinstance(error, SidecarError):
        return error.exit_code
    return BUG_EXIT

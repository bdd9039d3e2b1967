"""Byte counts for people, in binary units as nvidia-smi and free(1) count them: an 80 GiB card
(85,899,345,920 bytes) prints as "80.0 GiB", never as "85.9 GB"."""

from __future__ import annotations

_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def format_bytes(n: float | None, unit: str | None = None) -> str:
    """`3145728` -> "3.0 MiB"; `None` -> "n/a". `unit` fixes the unit (for a pair)."""
    if n is None:
        return "n/a"
    power = _UNITS.index(unit) if unit else _power(n)
    value = n / 1024**power
    return f"{value:.0f} B" if power == 0 else f"{value:.1f} {_UNITS[power]}"


def format_bytes_pair(used: float | None, total: float | None) -> str:
    """ "12.4/24.0 GiB": both in the total's unit, so they read as one fraction."""
    if used is None or total is None:
        return f"{format_bytes(used)}/{format_bytes(total)}"
    unit = _UNITS[_power(total)]
    left, right = format_bytes(used, unit), format_bytes(total, unit)
    return f"{left.rsplit(' ', 1)[0]}/{right}"


def _power(n: float) -> int:
    power = 0
    while abs(n) >= 1024 and power < len(_UNITS) - 1:
        n /= 1024
        power += 1
    return power

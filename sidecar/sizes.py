"""Byte counts for people, in binary units labelled as such (KiB, MiB, GiB), as `nvidia-smi` does.

NVML and `nvidia-smi` count memory in powers of two: an "80GB" H100 has 85,520,809,984 bytes,
which `nvidia-smi` prints as 81559MiB. Dividing by 10^9 and writing "GB" turns it into
"85.5 GB", a figure no other tool shows; dividing by 2^30 and writing "GB" mislabels it. Here
it is "79.6 GiB": the unit `nvidia-smi` uses, named correctly.
"""

from __future__ import annotations

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40

_UNITS = ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB"))


def format_bytes(n: float | None, digits: int = 1, missing: str = "n/a") -> str:
    """`85520809984` -> `79.6 GiB`, `3145728` -> `3.0 MiB`, `512` -> `512 B`; None -> `missing`.

    The unit is the largest one the value reaches, so the number is at least 1 and under 1024
    (or, rounded, exactly 1024.0 at the edge: 1023.96 MiB prints as `1024.0 MiB`).
    """
    if n is None:
        return missing
    size = abs(n)
    for factor, unit in _UNITS:
        if size >= factor:
            return f"{n / factor:.{digits}f} {unit}"
    return f"{n:.0f} B"


def format_pair(used: float | None, total: float | None, digits: int = 1) -> str:
    """`72.7/79.6 GiB`: both in the total's unit, so they read as one fraction."""
    if used is None or total is None:
        return f"{format_bytes(used, digits)}/{format_bytes(total, digits)}"
    factor, unit = next(((f, u) for f, u in _UNITS if abs(total) >= f), (1, "B"))
    return f"{used / factor:.{digits}f}/{total / factor:.{digits}f} {unit}"


def format_mib(n: float | None, missing: str = "n/a") -> str:
    """Whole MiB, as `nvidia-smi` prints memory: `85520809984` -> `81559 MiB`."""
    return missing if n is None else f"{int(n // MIB)} MiB"


def format_share(part: float | None, whole: float | None, missing: str = "n/a") -> str:
    """`part / whole` as a percentage with one decimal; `missing` when either is unknown or 0."""
    if part is None or not whole:
        return missing
    return f"{100 * part / whole:.1f}%"

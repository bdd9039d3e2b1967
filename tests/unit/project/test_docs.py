"""The documents a clone relies on are in the clone, and say what the code does.

docs/ holds copies of the development set's contract and notes (../shared, beside a developer's
checkout but not in a clone): PHASES.md (the classifier's contract), STYLE.md, VLLM_CPU.md
verbatim, and excerpts of VLLM_INTERNALS.md as vllm-internals.md. The copies are checked
against the originals whenever ../shared is present; every document the repository names must
exist in it; and the contract's phases, roles and stages are the code's enums.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from sidecar.records import Phase, Role, Stage

THIS_FILE = Path(__file__).resolve()
ROOT = THIS_FILE.parents[3]
DOCS = ROOT / "docs"
SHARED = ROOT.parent / "shared"
VERBATIM = ("PHASES.md", "STYLE.md", "VLLM_CPU.md")
# Where text that names documents lives; fixture data (stacks, scrapes) is not scanned.
SCANNED_SUFFIXES = {".py", ".md", ".yaml", ".yml", ".toml", ".cfg", ".service", ".conf", ".sh"}
SCANNED_NAMES = {"Dockerfile", "Makefile", "docker-compose.yml", ".dockerignore"}
SKIPPED_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}


def repository_texts() -> Iterator[tuple[Path, str]]:
    for path in sorted(ROOT.rglob("*")):
        relative = path.relative_to(ROOT)
        if SKIPPED_DIRS & set(relative.parts) or not path.is_file() or path == THIS_FILE:
            continue  # this file names the patterns it looks for
        if path.suffix in SCANNED_SUFFIXES or path.name in SCANNED_NAMES:
            yield relative, path.read_text(errors="replace")


def mentions(pattern: str) -> list[tuple[str, str]]:
    return [
        (f"{relative}:{text.count(chr(10), 0, m.start()) + 1}", m.group(0))
        for relative, text in repository_texts()
        for m in re.finditer(pattern, text)
    ]


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not beside the checkout")
@pytest.mark.parametrize("name", VERBATIM)
def test_the_copies_equal_shared(name: str) -> None:
    assert (DOCS / name).read_bytes() == (SHARED / name).read_bytes(), (
        f"docs/{name} differs from ../shared/{name}: copy it again"
    )


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared is not beside the checkout")
def test_the_internals_excerpt_is_verbatim() -> None:
    """Every paragraph of docs/vllm-internals.md after its introduction is in the notes,
    except the section headings chosen for the excerpt."""
    notes = (SHARED / "VLLM_INTERNALS.md").read_text()
    text = (DOCS / "vllm-internals.md").read_text()
    body = text[text.index("\n## ") :]
    paragraphs = [p.strip() for p in body.split("\n\n") if p.strip()]
    quoted = [p for p in paragraphs if not p.startswith("## ")]
    missing = [p[:80] for p in quoted if p not in notes]
    assert not missing, f"not in ../shared/VLLM_INTERNALS.md: {missing}"


def test_no_reference_needs_shared() -> None:
    """Only the development stacks are read from ../shared (their copies are in
    tests/fixtures/public); every document is named by its copy in docs/."""
    outside = [
        (where, found)
        for where, found in mentions(r"shared/[\w./-]+")
        if not found.startswith("shared/data/stacks")
    ]
    assert not outside, outside
    assert not [hit for hit in mentions(r"VLLM_INTERNALS\.md") if not hit[0].startswith("docs/")]


def test_named_documents_exist() -> None:
    """`docs/NAME` paths, bare names of the copied documents and relative Markdown links all
    lead to a file of the repository."""
    # not a path inside a URL (https://github.com/o/r/blob/SHA/docs/x.md names another repo)
    missing = [
        hit for hit in mentions(r"(?<![\w/.-])docs/[\w./-]*\w") if not (ROOT / hit[1]).exists()
    ]
    bare = rf"(?<![\w/.-])(?:{'|'.join(re.escape(n) for n in VERBATIM)})"
    missing += [hit for hit in mentions(bare) if not (DOCS / hit[1]).is_file()]
    for relative, text in repository_texts():
        if relative.suffix == ".md":
            for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
                if "://" not in target and not (ROOT / relative.parent / target).exists():
                    missing.append((str(relative), target))
    assert not missing, missing


# `sidecar/x/y.py`, or a dotted module `sidecar.x.y` (as in `python -m`, a monkeypatched name or
# an import-linter contract). Config files named `sidecar.yaml` and the package face's names
# (`sidecar.load`, `sidecar.snapshots`, `sidecar.__file__`) are not modules.
_MODULE_PATH = r"(?<![\w/.-])sidecar/(?:[a-z_]+/)*[a-z_]+\.py\b"
_DOTTED = r"(?<![\w/.-])sidecar(?:\.[a-z_]+)+\b"
_NOT_MODULES = (
    "sidecar.yaml",
    "sidecar.yml",
    "sidecar.load",
    "sidecar.snapshots",
    "sidecar.__file__",
    "sidecar.__all__",
)


def _module_exists(dotted: str) -> bool:
    """`sidecar.a.b` names a module, a package, or an attribute of one (`sidecar.a.b.Name`)."""
    parts = dotted.split(".")
    for end in range(len(parts), 1, -1):
        base = ROOT.joinpath(*parts[:end])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return True
    return False


def test_named_modules_exist() -> None:
    """Every `sidecar/...py` path and every dotted `sidecar.x` module named anywhere in the
    repository (code, docs, configs, deployments) is a module of the package: a move that left
    a name behind fails here."""
    missing = [hit for hit in mentions(_MODULE_PATH) if not (ROOT / hit[1]).is_file()]
    missing += [hit for hit in mentions(_DOTTED)
                if hit[1] not in _NOT_MODULES and not _module_exists(hit[1])]  # fmt: skip
    assert not missing, missing


def _table_names(section: str) -> set[str]:
    """The backticked names in the first column of a section's table in docs/PHASES.md."""
    text = (DOCS / "PHASES.md").read_text()
    body = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `(\w+)` \|", body, flags=re.M))


def test_the_contract_phases_are_the_phase_enum() -> None:
    assert _table_names("Phases") == {p.value for p in Phase}


def test_the_contract_roles_are_the_role_enum() -> None:
    assert _table_names("Roles") == {r.value for r in Role}


def test_the_contract_stages_are_the_stage_enum() -> None:
    text = (DOCS / "PHASES.md").read_text()
    assert "a **stage** (`prefill`, `decode`, or unknown)" in text
    assert {s.value for s in Stage} == {"prefill", "decode", "unknown"}

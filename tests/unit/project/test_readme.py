"""The README is the operators' page (issue 23): short enough to read, and it names the two
commands that set up a fresh machine. Everything longer lives in docs/ (mkdocs.yml)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "README.md"
MAX_WORDS = 3000


def test_the_readme_is_at_most_3000_words() -> None:
    words = len(README.read_text().split())  # as `wc -w` counts them
    assert words <= MAX_WORDS, f"README.md has {words} words; move detail into docs/"


def test_the_readme_names_the_two_commands() -> None:
    text = README.read_text()
    assert "make demo" in text
    assert "make test" in text


def test_the_readme_links_into_the_docs_site() -> None:
    """Every docs/ page the README links to is one the site lists in its nav."""
    nav = (ROOT / "mkdocs.yml").read_text()
    text = README.read_text()
    linked = {part.split(")")[0].split("#")[0] for part in text.split("](docs/")[1:]}
    assert linked
    assert all(page in nav for page in linked), sorted(p for p in linked if p not in nav)

"""Rewrite the checkout's imports when definitions or whole modules move (issue 21, "One house").

Two operations, both driven by data so that a reviewer reads the map, not the diff:

- ``names``: definitions moved by hand from one module to another. Every
  ``from OLD import a, b`` in the checkout is split so that the moved names come from their new
  module (``--names OLD NEW a b ...``).
- ``defs``: the same, with the definitions cut from the old module and appended to the new.
- ``tests``: test files moved into folders that mirror the package (``devtools/tests_map.txt``).
- ``modules``: whole modules renamed (``devtools/relayout_map.txt``, one ``old -> new`` pair of
  dotted names a line). The files are moved with ``git mv`` and every dotted name
  (``pkg.old``, ``pkg.old.attr``) and path (``pkg/old.py``) in the checkout's text
  files is rewritten, longest names first, so that no prefix is rewritten twice.

Afterwards ``ruff check --fix`` and ``ruff format`` sort and wrap the rewritten imports.

    python -m devtools.relayout names pkg.old_module pkg.new_module Config TargetConfig
    python -m devtools.relayout defs pkg.old_module sidecar.records.gpu PidMatch
    python -m devtools.relayout modules devtools/relayout_map.txt
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Where the package is imported or named: code, tests, tools, docs, configs and deployments.
TREES = ("sidecar", "tests", "devtools", "benchmarks", "scripts", "examples", "docs", "configs",
         "deploy", "systemd")  # fmt: skip
TOP_FILES = ("README.md", "pyproject.toml", "setup.cfg", "Makefile", "Dockerfile",
             "docker-compose.yml", ".importlinter")  # fmt: skip
TEXT_SUFFIXES = {".py", ".md", ".toml", ".cfg", ".yaml", ".yml", ".txt", ".sh", ".json", ".ini",
                 ".service", ".html", ".j2", ""}  # fmt: skip


def _recorded(path: Path) -> bool:
    """Recorded data (stacks, scrapes, /proc trees) under fixtures/ is left as it was recorded;
    the fixtures' READMEs and recording scripts are rewritten like any text."""
    return "fixtures" in path.parts and path.suffix not in (".md", ".py")


def python_files() -> Iterator[Path]:
    for tree in TREES:
        yield from (ROOT / tree).rglob("*.py")


def text_files() -> Iterator[Path]:
    for name in TOP_FILES:
        if (ROOT / name).is_file():
            yield ROOT / name
    for tree in TREES:
        for p in (ROOT / tree).rglob("*"):
            if (
                p.is_file()
                and p.suffix in TEXT_SUFFIXES
                and not _recorded(p)
                and not p.name.endswith("_map.txt")
            ):  # the maps say what moved: kept as written
                yield p


# ------------------------------------------------------------------------------ moved names


def _import_text(module: str, aliases: Iterable[ast.alias], indent: str) -> str:
    names = ", ".join(a.name if a.asname is None else f"{a.name} as {a.asname}" for a in aliases)
    return f"{indent}from {module} import {names}"


def split_imports(source: str, old: str, new: str, names: set[str]) -> str:
    """`source` with each `from old import ...` that takes any of `names` split in two."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module == old and node.level == 0):
            continue
        moved = [a for a in node.names if a.name in names]
        if not moved:
            continue
        kept = [a for a in node.names if a.name not in names]
        indent = lines[node.lineno - 1][: node.col_offset]
        parts = [_import_text(new, moved, indent)]
        if kept:
            parts.insert(0, _import_text(old, kept, indent))
        end = lines[node.end_lineno - 1]  # type: ignore[index]
        tail = end[node.end_col_offset :] if node.end_col_offset is not None else "\n"
        edits.append((node.lineno - 1, node.end_lineno or node.lineno, "\n".join(parts) + tail))
    for start, stop, text in sorted(edits, reverse=True):
        lines[start:stop] = [text]
    return "".join(lines)


def move_names(old: str, new: str, names: set[str]) -> list[Path]:
    changed = []
    for path in python_files():
        source = path.read_text(encoding="utf-8")
        if f"from {old} import" not in source:
            continue
        out = split_imports(source, old, new, names)
        if out != source:
            path.write_text(out, encoding="utf-8")
            changed.append(path)
    return changed


def _defined(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return {node.target.id}
    return set()


def cut_definitions(source: str, names: set[str]) -> tuple[str, str]:
    """(`source` without the top-level definitions of `names`, those definitions), each with
    its decorators and the comment lines right above it."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    spans = []
    for node in tree.body:
        if not _defined(node) & names:
            continue
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", ()))]) - 1
        while first > 0 and lines[first - 1].lstrip().startswith("#"):
            first -= 1
        spans.append((first, node.end_lineno or node.lineno))
    cut = ["".join(lines[a:b]).rstrip() + "\n" for a, b in spans]
    for a, b in reversed(spans):
        del lines[a:b]
    return "".join(lines), "\n\n".join(cut)


def move_definitions(old: str, new: str, names: set[str]) -> None:
    """Definitions cut from module `old` and appended to `new` (created when missing); imports
    of them across the checkout split. The modules' own imports are left to the mover."""
    src, dst = module_path(old), module_path(new)
    rest, cut = cut_definitions(src.read_text(encoding="utf-8"), names)
    src.write_text(rest, encoding="utf-8")
    before = dst.read_text(encoding="utf-8") if dst.exists() else ""
    dst.write_text(before.rstrip() + "\n\n\n" + cut if before else cut, encoding="utf-8")
    move_names(old, new, names)


# ---------------------------------------------------------------------------- moved modules


def read_map(path: Path) -> list[tuple[str, str]]:
    pairs = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        old, arrow, new = (s.strip() for s in line.partition("->"))
        if not arrow or not old or not new:
            sys.exit(f"{path}:{n}: expected `old.module -> new.module`, got {line!r}")
        pairs.append((old, new))
    return pairs


def module_path(dotted: str) -> Path:
    """The file of module `dotted`: a package's `__init__.py`, else `name.py`."""
    package = ROOT / dotted.replace(".", "/") / "__init__.py"
    return package if package.is_file() else ROOT / (dotted.replace(".", "/") + ".py")


def rewrite_text(text: str, pairs: list[tuple[str, str]]) -> str:
    """Dotted names and file paths of every moved module, longest first, in one pass each."""
    dotted = {old: new for old, new in pairs}
    paths = {old.replace(".", "/") + ".py": new.replace(".", "/") + ".py" for old, new in pairs}
    for table, boundary in ((dotted, r"(?![\w])"), (paths, r"(?![\w/])")):
        keys = sorted(table, key=len, reverse=True)
        pattern = re.compile(r"(?<![\w./])(" + "|".join(map(re.escape, keys)) + ")" + boundary)
        text = pattern.sub(lambda m, t=table: t[m.group(1)], text)  # type: ignore[misc]
    return text


def submodule_imports(source: str, dotted: dict[str, str]) -> str:
    """`from sidecar import units` names a module as an attribute of its package: rewritten to
    `from sidecar.config import units` (with `as units` kept where the file's name changed)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom) or node.level or node.module is None:
            continue
        if not any(f"{node.module}.{a.name}" in dotted for a in node.names):
            continue
        indent = lines[node.lineno - 1][: node.col_offset]
        parts = []
        for a in node.names:
            new = dotted.get(f"{node.module}.{a.name}")
            if new is None:
                parts.append(_import_text(node.module, [a], indent))
                continue
            parent, _, base = new.rpartition(".")
            alias = a.asname or (a.name if base != a.name else None)
            parts.append(_import_text(parent, [ast.alias(base, alias)], indent))
        stop = node.end_lineno or node.lineno
        edits.append((node.lineno - 1, stop, "\n".join(parts) + "\n"))
    for start, stop, text in sorted(edits, reverse=True):
        lines[start:stop] = [text]
    return "".join(lines)


def move_modules(pairs: list[tuple[str, str]]) -> None:
    for old, new in pairs:
        # A module's own file, never a package's __init__.py: `sidecar.config` (config.py) moves
        # after `sidecar.config.settings` has made the folder sidecar/config/.
        src, dst = ROOT / (old.replace(".", "/") + ".py"), module_path(new)
        if not src.is_file():
            sys.exit(f"{src} does not exist: fix the map")
        dst.parent.mkdir(parents=True, exist_ok=True)
        init = dst.parent / "__init__.py"
        if not init.exists():
            init.write_text(f'"""{dst.parent.name}: see docs/design/layout.md."""\n')
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)
    for path in text_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        out = rewrite_text(text, pairs)
        if out != text:
            path.write_text(out, encoding="utf-8")
    # After the text: `from sidecar.config import units` must not be read again as a module
    # `sidecar.config` that moved.
    dotted = dict(pairs)
    for path in python_files():
        source = path.read_text(encoding="utf-8")
        out = submodule_imports(source, dotted)
        if out != source:
            path.write_text(out, encoding="utf-8")


_PARENTS = re.compile(r"Path\(__file__\)(\.resolve\(\))?\.(parent\.parent|parents\[(\d)\])")
_THIS_FILE_PARENTS = re.compile(r"THIS_FILE\.parents\[(\d)\]")


def _one_level_deeper(text: str) -> str:
    """`Path(__file__)...parents[N]` (or `.parent.parent`) of a file moved one folder down."""

    def deeper(m: re.Match[str]) -> str:
        n = 1 if m.group(2) == "parent.parent" else int(m.group(3))
        return f"Path(__file__){m.group(1) or ''}.parents[{n + 1}]"

    text = _PARENTS.sub(deeper, text)
    return _THIS_FILE_PARENTS.sub(lambda m: f"THIS_FILE.parents[{int(m.group(1)) + 1}]", text)


def move_tests(pairs: list[tuple[str, str]]) -> None:
    """Test files moved one folder down (no `__init__.py`: pytest imports each by its unique
    basename); their paths rewritten wherever named, and their `__file__`-relative paths
    deepened by one."""
    for old, new in pairs:
        src, dst = module_path(old), module_path(new)
        dst.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)
        dst.write_text(_one_level_deeper(dst.read_text(encoding="utf-8")), encoding="utf-8")
    for path in text_files():
        text = path.read_text(encoding="utf-8", errors="surrogateescape")
        out = rewrite_text(text, pairs)
        if out != text:
            path.write_text(out, encoding="utf-8", errors="surrogateescape")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="op", required=True)
    names = sub.add_parser("names", help="split imports of names moved between modules")
    names.add_argument("old")
    names.add_argument("new")
    names.add_argument("names", nargs="+")
    defs = sub.add_parser("defs", help="move top-level definitions to another module")
    defs.add_argument("old")
    defs.add_argument("new")
    defs.add_argument("names", nargs="+")
    modules = sub.add_parser("modules", help="move modules by a map file")
    modules.add_argument("map", type=Path)
    tests = sub.add_parser("tests", help="move test files one folder down by a map file")
    tests.add_argument("map", type=Path)
    args = parser.parse_args(argv)
    if args.op == "names":
        for path in move_names(args.old, args.new, set(args.names)):
            print(path.relative_to(ROOT))
    elif args.op == "tests":
        move_tests(read_map(args.map))
    elif args.op == "defs":
        move_definitions(args.old, args.new, set(args.names))
    else:
        move_modules(read_map(args.map))
    return 0


if __name__ == "__main__":
    sys.exit(main())

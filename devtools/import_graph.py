"""Measure the import graph of the checkout: the figures the layout review quotes, from `ast` alone.

Run it from the checkout (standard library only, no venv needed):

    python devtools/import_graph.py                      # sidecar/ in detail, the checkout in brief
    python devtools/import_graph.py --root /tmp/wt-old   # another checkout or worktree
    python devtools/import_graph.py --scope checkout     # every .py under the root in detail
    python devtools/import_graph.py --closure schedule records.summary
    python devtools/import_graph.py --layers layers.txt  # count upward imports against these layers
    python devtools/import_graph.py --json               # the same figures as one JSON object

What is parsed. Every `.py` file under `--root` (hidden folders, `__pycache__`, `build`, `dist`,
`venv`, `node_modules` and `*.egg-info` are skipped, and so is anything matching `--exclude`). A
file's module name is its path from the root with dots (`sidecar/gpu/reader.py` is
`sidecar.gpu.reader`, `sidecar/gpu/__init__.py` is `sidecar.gpu`). The root should be the folder
that is on `sys.path`; if it is itself a package, the names start from the first folder above it
that is not.

What an edge is. An import statement points at the module that owns the imported name: the
longest prefix of the dotted name that is a module of the checkout. `import pkg.a.b` gives
`pkg.a.b`; `from pkg.a import b` gives `pkg.a.b` when that is a module and `pkg.a`
(its `__init__`) when `b` is a name defined there; `from sidecar import Profiler` gives `sidecar`;
relative imports are resolved against the importing module's package first. Imports of anything
that is not a module of the checkout (the standard library, third-party packages) are left out,
and so are a module's imports of itself. The parent packages that Python runs on the way
(`import pkg.a.b` also runs `pkg/__init__.py` and `pkg/a/__init__.py`) are not edges
unless `--parents` is given (and even then not the importer's own packages, which ran before
it): import-linter does not count them either. `importlib.import_module` calls are not seen.

An edge is one (importer, imported) pair, however many statements make it. Each pair has the
strongest kind among its statements:

- module-level: runs when the importer is imported (at the top, in a class body, under `try` or
  a plain `if`);
- lazy: inside a function or method, so it runs only when that is called;
- TYPE_CHECKING: under `if TYPE_CHECKING:` (or the `else` of `if not TYPE_CHECKING:`), so it never
  runs; only type checkers and import checkers follow it.

"Import sites" count every (statement, imported module) once, for comparison with a line count.

The figures, for the chosen scope (`--scope package`, the default: modules of `--package`,
`sidecar`, and the imports between them; `--scope checkout`: every module under the root):

- modules, lines: the files parsed, and their lines;
- edges by kind: the distinct pairs as above;
- cycles: the strongly connected components of more than one unit, counted three ways: over
  module-level edges only (what can fail at import time), over module-level and lazy edges (what
  runs), and over all kinds including TYPE_CHECKING (what import-linter and a structure map see).
  Each is printed with its members, one shortest cycle through it, and the edges in it that are
  not module-level (the cheap cuts);
- levels: the number of units on the longest chain of module-level imports, A imports B imports
  C ... (a unit that imports nothing of the scope is on level 1). Cycles are first collapsed into
  one unit each (the condensation), so a cycle counts as one level and is printed as {a, b}. The
  chain itself is printed top first; the hops along it are levels - 1;
- the same with packages as units (`--units packages`): every module in a package folder one level
  below a top folder is part of that package's unit (`pkg/x/y.py` and `pkg/x/z/w.py` are
  unit `pkg.x`); a module directly in a top folder is its own unit (`pkg/z.py` is
  `pkg.z`, `sidecar/__init__.py` is `sidecar`). Edges inside a unit disappear; an edge
  between units has the strongest kind of the module edges it stands for;
- upward imports: for each layers contract (`--layers FILE`, or else the `type = layers`
  contracts of import-linter found in the root's `.importlinter`, `setup.cfg` or `pyproject.toml`;
  skipped when there are none), the edges of all kinds from a module of a lower layer to one of a
  higher layer, and between the independent siblings of one layer (`a | b`), by kind. A module
  belongs to the layer whose name is the longest prefix of its own. Only direct imports are
  counted; import-linter also rejects indirect chains, which can pass through modules in no layer
  (their number is printed). Lines of `ignore_imports` are honoured, `*` and `**` included. A
  `--layers` file is either such a config file or plain text, one layer a line from top to bottom,
  siblings separated by `|` (independent) or `:` (not), `#` for comments; a name that is not a
  module of the scope is read as relative to the package (`gpu` is `sidecar.gpu`);
- most imported, most importing: fan-in and fan-out over the edges that run (module-level and
  lazy; TYPE_CHECKING left out);
- closure (`--closure MODULE ...`): the modules that importing MODULE loads through module-level
  imports, transitively. MODULE may be given as `pkg.x.y`, `x.y` or `pkg/x/y.py`.

Exit status: 0, or 2 for a usage error (an unknown module, an unreadable layers file).
"""

from __future__ import annotations

import argparse
import ast
import configparser
import fnmatch
import json
import os
import re
import sys
import tomllib
from collections import Counter, deque
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from itertools import pairwise
from pathlib import Path

DEFAULT_ROOT = Path(__file__).resolve().parents[1]
SKIP_DIRS = frozenset({"__pycache__", "build", "dist", "node_modules", "venv"})
TOP = 5  # how many modules the fan-in and fan-out lists show


class Kind(StrEnum):
    MODULE = "module-level"
    LAZY = "lazy"
    TYPING = "TYPE_CHECKING"


STRENGTH = {Kind.MODULE: 0, Kind.LAZY: 1, Kind.TYPING: 2}  # lower is stronger
RUNS = frozenset({Kind.MODULE, Kind.LAZY})  # the kinds that run
# The three graphs cycles are counted on: the kinds each follows.
CYCLE_GRAPHS: dict[str, frozenset[Kind]] = {
    "module-level": frozenset({Kind.MODULE}),
    "module-level + lazy": RUNS,
    "all kinds": frozenset(Kind),
}


class UsageError(Exception):
    """A bad argument: reported on stderr with exit status 2."""


# --- reading the checkout ----------------------------------------------------------------------


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool


@dataclass(frozen=True)
class Site:
    """One imported module of one import statement."""

    source: str
    target: str
    kind: Kind
    line: int


def _skipped(folder: str) -> bool:
    return folder.startswith(".") or folder in SKIP_DIRS or folder.endswith(".egg-info")


def _prefix(root: Path) -> tuple[str, ...]:
    """The package names above the root when the root is itself inside a package."""
    names: list[str] = []
    folder = root
    while (folder / "__init__.py").is_file() and folder.parent != folder:
        names.insert(0, folder.name)
        folder = folder.parent
    return tuple(names)


def find_modules(root: Path, exclude: Sequence[str]) -> dict[str, Module]:
    prefix = _prefix(root)
    modules: dict[str, Module] = {}
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = sorted(d for d in subfolders if not _skipped(d))
        for file in sorted(files):
            path = Path(folder, file)
            relative = path.relative_to(root)
            if not file.endswith(".py") or any(fnmatch.fnmatch(str(relative), g) for g in exclude):
                continue
            parts = (*prefix, *relative.with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            name = ".".join(parts[:-1] if is_package else parts)
            if name:
                modules[name] = Module(name, path, is_package)
    return modules


def _type_checking_branch(test: ast.expr) -> bool | None:
    """True when the `if` body runs only for type checkers, False when its `else` does."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _type_checking_branch(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return True
    if isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING":
        return True
    return None


ImportNode = ast.Import | ast.ImportFrom


def import_nodes(
    nodes: Iterable[ast.AST], in_function: bool = False, typing_only: bool = False
) -> Iterator[tuple[ImportNode, Kind]]:
    """Every import statement under `nodes`, with the kind it has where it stands."""
    for node in nodes:
        if isinstance(node, ImportNode):
            kind = Kind.TYPING if typing_only else Kind.LAZY if in_function else Kind.MODULE
            yield node, kind
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            yield from import_nodes(ast.iter_child_nodes(node), True, typing_only)
        elif isinstance(node, ast.If) and (body := _type_checking_branch(node.test)) is not None:
            yield from import_nodes(node.body, in_function, typing_only or body)
            yield from import_nodes(node.orelse, in_function, typing_only or not body)
        else:
            yield from import_nodes(ast.iter_child_nodes(node), in_function, typing_only)


def owner(name: str, modules: Collection[str]) -> str | None:
    """The module that defines `name`: the longest dotted prefix that is a module."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _from_base(node: ast.ImportFrom, importer: Module) -> str | None:
    if not node.level:
        return node.module
    package = importer.name if importer.is_package else importer.name.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    if not package:
        return None  # a relative import above the top: Python refuses it too
    return f"{package}.{node.module}" if node.module else package


def targets(node: ImportNode, importer: Module, modules: Collection[str]) -> list[str]:
    """The modules of the checkout that one import statement imports, in statement order."""
    if isinstance(node, ast.Import):
        found = [owner(alias.name, modules) for alias in node.names]
    elif (base := _from_base(node, importer)) is None:
        found = []
    else:
        found = [
            f"{base}.{alias.name}"
            if alias.name != "*" and f"{base}.{alias.name}" in modules
            else owner(base, modules)
            for alias in node.names
        ]
    return list(dict.fromkeys(t for t in found if t and t != importer.name))


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def read_sites(
    modules: Mapping[str, Module], parents: bool
) -> tuple[list[Site], dict[str, int], list[str]]:
    """All import sites, the lines of each module, and the files that could not be parsed."""
    sites: list[Site] = []
    lines: dict[str, int] = {}
    errors: list[str] = []
    for module in modules.values():
        try:
            text = module.path.read_text(encoding="utf-8")
            tree = ast.parse(text, filename=str(module.path))
        except (SyntaxError, UnicodeDecodeError, ValueError) as error:
            errors.append(f"{module.path}: {type(error).__name__}: {error}")
            continue
        lines[module.name] = len(text.splitlines())
        for node, kind in import_nodes(tree.body):
            found = targets(node, module, modules)
            if parents:  # the importer's own packages ran before it: not edges
                own = {module.name, *_parents(module.name)}
                found += [p for t in found for p in _parents(t) if p in modules and p not in own]
            for target in dict.fromkeys(t for t in found if t != module.name):
                sites.append(Site(module.name, target, kind, node.lineno))
    return sites, lines, errors


# --- the graph ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    kind: Kind
    where: str  # "module:line" of the statement that gives the edge its kind


@dataclass
class Graph:
    nodes: list[str]
    edges: dict[tuple[str, str], Edge] = field(default_factory=dict)

    def add(self, edge: Edge) -> None:
        key = (edge.source, edge.target)
        old = self.edges.get(key)
        if old is None or STRENGTH[edge.kind] < STRENGTH[old.kind]:
            self.edges[key] = edge

    def successors(self, kinds: Collection[Kind]) -> dict[str, list[str]]:
        succ: dict[str, list[str]] = {n: [] for n in self.nodes}
        for (source, target), edge in sorted(self.edges.items()):
            if edge.kind in kinds:
                succ[source].append(target)
        return succ

    def count(self) -> dict[str, int]:
        counts = Counter(edge.kind for edge in self.edges.values())
        return {**{kind.value: counts[kind] for kind in Kind}, "total": len(self.edges)}


def module_graph(sites: Iterable[Site], nodes: Collection[str]) -> Graph:
    graph = Graph(sorted(nodes))
    for site in sites:
        if site.source in nodes and site.target in nodes:
            graph.add(Edge(site.source, site.target, site.kind, f"{site.source}:{site.line}"))
    return graph


def unit_of(module: str) -> str:
    """A package folder one level below a top folder is one unit; any other module is its own."""
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def unit_graph(graph: Graph) -> Graph:
    units = Graph(sorted({unit_of(n) for n in graph.nodes}))
    for edge in graph.edges.values():
        source, target = unit_of(edge.source), unit_of(edge.target)
        if source != target:
            units.add(Edge(source, target, edge.kind, edge.where))
    return units


def components(nodes: Sequence[str], succ: Mapping[str, Sequence[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, without recursion), sinks first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)

    for start in nodes:
        if start in index:
            continue
        enter(start)
        work = [(start, iter(succ[start]))]
        while work:
            node, pending = work[-1]
            for nxt in pending:
                if nxt not in index:
                    enter(nxt)
                    work.append((nxt, iter(succ[nxt])))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component: list[str] = []
                    while not component or component[-1] != node:
                        component.append(stack.pop())
                        on_stack.discard(component[-1])
                    found.append(sorted(component))
    return found


def shortest_cycle(members: Sequence[str], succ: Mapping[str, Sequence[str]]) -> list[str]:
    """One shortest cycle through the first member, staying inside the component."""
    start, inside = members[0], set(members)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for nxt in succ[node]:
            if nxt == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if nxt in inside and nxt not in came_from:
                came_from[nxt] = node
                queue.append(nxt)
    return [start]


@dataclass(frozen=True)
class Cycle:
    members: list[str]
    path: list[str]  # one shortest cycle through the first member; it ends where it starts
    via: list[str]  # for each step of the path, the import that makes it ("module:line")
    cuts: list[Edge]  # the edges inside it that are not module-level


@dataclass(frozen=True)
class View:
    """The figures of one graph: modules or packages as units."""

    units: int
    edges: dict[str, int]
    cycles: dict[str, list[Cycle]]  # by CYCLE_GRAPHS name
    levels: int
    chain: list[list[str]]  # top first; a cycle is one step with all its members
    level_of: dict[str, int]


def cycles_of(graph: Graph, kinds: Collection[Kind]) -> list[Cycle]:
    succ = graph.successors(kinds)
    found = []
    for members in components(graph.nodes, succ):
        if len(members) < 2:
            continue
        inside = set(members)
        cuts = [
            e
            for (s, t), e in sorted(graph.edges.items())
            if s in inside and t in inside and e.kind in kinds and e.kind != Kind.MODULE
        ]
        path = shortest_cycle(members, succ)
        via = [graph.edges[step].where for step in pairwise(path)]
        found.append(Cycle(members, path, via, cuts))
    return sorted(found, key=lambda c: (-len(c.members), c.members))


def levels_of(graph: Graph) -> tuple[list[list[str]], dict[str, int]]:
    """The longest chain of module-level imports over the condensation, and each unit's level."""
    succ = graph.successors({Kind.MODULE})
    found = components(graph.nodes, succ)  # sinks first: a component's successors come earlier
    component_of = {node: i for i, members in enumerate(found) for node in members}
    level: list[int] = []
    below: list[int | None] = []
    for i, members in enumerate(found):
        after = {component_of[t] for n in members for t in succ[n]} - {i}
        best = min(after, key=lambda c: (-level[c], found[c]), default=None)
        below.append(best)
        level.append(1 + (level[best] if best is not None else 0))
    chain: list[list[str]] = []
    step = min(range(len(found)), key=lambda c: (-level[c], found[c]), default=None)
    while step is not None:
        chain.append(found[step])
        step = below[step]
    return chain, {node: level[component_of[node]] for node in graph.nodes}


def view(graph: Graph) -> View:
    chain, level_of = levels_of(graph)
    return View(
        units=len(graph.nodes),
        edges=graph.count(),
        cycles={name: cycles_of(graph, kinds) for name, kinds in CYCLE_GRAPHS.items()},
        levels=len(chain),
        chain=chain,
        level_of=level_of,
    )


# --- layers ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Contract:
    name: str
    source: str
    layers: list[list[str]]  # top to bottom; each layer lists its sibling module names
    independent: list[bool]  # per layer: siblings may not import each other (`a | b`)
    ignore: list[tuple[str, str]] = field(default_factory=list)


def _layer_line(line: str) -> tuple[list[str], bool]:
    independent = "|" in line
    names = re.split(r"[|:]", line)
    return [n.strip().strip("()").strip() for n in names if n.strip()], independent


def _contract(
    name: str, source: str, layers: Iterable[str], containers: Iterable[str], ignore: Iterable[str]
) -> Contract:
    parsed = [_layer_line(line) for line in layers if line.strip()]
    roots = list(containers) or [""]
    return Contract(
        name=name,
        source=source,
        layers=[[f"{c}.{n}" if c else n for c in roots for n in names] for names, _ in parsed],
        independent=[independent for _, independent in parsed],
        ignore=[
            (a.strip(), b.strip())
            for a, _, b in (line.partition("->") for line in ignore)
            if a.strip() and b.strip()
        ],
    )


def _lines(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    items = value if isinstance(value, list) else value.splitlines()
    return [s.split("#")[0].strip() for s in items if s.split("#")[0].strip()]


def contracts_from_ini(path: Path) -> list[Contract]:
    config = configparser.ConfigParser(interpolation=None)
    config.read(path, encoding="utf-8")
    found = []
    for section in config.sections():
        if not section.startswith("importlinter:contract:"):
            continue
        entry = config[section]
        if entry.get("type", "").strip() == "layers":
            found.append(
                _contract(
                    entry.get("name", section).strip(),
                    f"{path} [{section}]",
                    _lines(entry.get("layers")),
                    _lines(entry.get("containers")),
                    _lines(entry.get("ignore_imports")),
                )
            )
    return found


def contracts_from_toml(path: Path) -> list[Contract]:
    with path.open("rb") as file:
        data = tomllib.load(file)
    entries = data.get("tool", {}).get("importlinter", {}).get("contracts", [])
    return [
        _contract(
            str(entry.get("name", f"contract {i}")),
            f"{path} [tool.importlinter.contracts #{i}]",
            _lines(entry.get("layers")),
            _lines(entry.get("containers")),
            _lines(entry.get("ignore_imports")),
        )
        for i, entry in enumerate(entries, 1)
        if entry.get("type") == "layers"
    ]


def contracts_from_text(path: Path, package: str, modules: Collection[str]) -> list[Contract]:
    def full(name: str) -> str:
        qualified = f"{package}.{name}"
        known = any(m == qualified or m.startswith(qualified + ".") for m in modules)
        return qualified if known and not name.startswith(package + ".") else name

    layers = _lines(path.read_text(encoding="utf-8"))
    contract = _contract(path.name, str(path), layers, [], [])
    names = [[full(n) for n in layer] for layer in contract.layers]
    return [Contract(contract.name, contract.source, names, contract.independent)]


def load_contracts(
    root: Path, layers_file: Path | None, package: str, modules: Collection[str]
) -> list[Contract]:
    if layers_file is not None:
        if not layers_file.is_file():
            raise UsageError(f"no layers file at {layers_file}")
        if layers_file.suffix == ".toml":
            return contracts_from_toml(layers_file)
        if "[importlinter" in layers_file.read_text(encoding="utf-8"):
            return contracts_from_ini(layers_file)
        return contracts_from_text(layers_file, package, modules)
    found: list[Contract] = []
    for name in (".importlinter", "setup.cfg"):
        if (root / name).is_file():
            found += contracts_from_ini(root / name)
    if (root / "pyproject.toml").is_file():
        found += contracts_from_toml(root / "pyproject.toml")
    return found


def _pattern(glob: str) -> re.Pattern[str]:
    parts = (
        r"[^.]+(\.[^.]+)*" if p == "**" else r"[^.]+" if p == "*" else re.escape(p)
        for p in glob.split(".")
    )
    return re.compile(r"\.".join(parts) + "$")


@dataclass(frozen=True)
class LayerReport:
    contract: str
    source: str
    layers: list[list[str]]
    unlayered: int  # modules of the scope in no layer
    upward: dict[str, int]  # by kind, plus "total"
    sideways: dict[str, int]  # between independent siblings of one layer
    ignored: int
    edges: list[Edge]  # upward first, then sideways


def check_layers(contract: Contract, graph: Graph) -> LayerReport:
    names = {n: i for i, layer in enumerate(contract.layers) for n in layer}

    def layer(module: str) -> tuple[int, str] | None:
        for candidate in [module, *reversed(_parents(module))]:
            if candidate in names:
                return names[candidate], candidate
        return None

    ignore = [(_pattern(a), _pattern(b)) for a, b in contract.ignore]
    upward: list[Edge] = []
    sideways: list[Edge] = []
    ignored = 0
    for (source, target), edge in sorted(graph.edges.items()):
        low, high = layer(source), layer(target)
        if low is None or high is None:
            continue
        sibling = low[0] == high[0] and low[1] != high[1] and contract.independent[low[0]]
        if low[0] <= high[0] and not sibling:
            continue
        if any(a.match(source) and b.match(target) for a, b in ignore):
            ignored += 1
        else:
            (upward if low[0] > high[0] else sideways).append(edge)

    def by_kind(edges: list[Edge]) -> dict[str, int]:
        counts = Counter(e.kind for e in edges)
        return {**{k.value: counts[k] for k in Kind}, "total": len(edges)}

    return LayerReport(
        contract=contract.name,
        source=contract.source,
        layers=contract.layers,
        unlayered=sum(layer(n) is None for n in graph.nodes),
        upward=by_kind(upward),
        sideways=by_kind(sideways),
        ignored=ignored,
        edges=upward + sideways,
    )


# --- the report --------------------------------------------------------------------------------


def closure(graph: Graph, start: str) -> list[str]:
    succ = graph.successors({Kind.MODULE})
    seen: set[str] = set()
    todo = [start]
    while todo:
        for nxt in succ[todo.pop()]:
            if nxt not in seen and nxt != start:
                seen.add(nxt)
                todo.append(nxt)
    return sorted(seen)


def find_module(name: str, package: str, nodes: Collection[str]) -> str:
    dotted = name.removesuffix(".py").removesuffix("/__init__").strip("/").replace("/", ".")
    for candidate in (dotted, f"{package}.{dotted}"):
        if candidate in nodes:
            return candidate
    raise UsageError(f"no module {name!r} in the scope (try a dotted name such as {package}.x)")


@dataclass(frozen=True)
class Fan:
    module: str
    count: int


@dataclass(frozen=True)
class Report:
    root: str
    scope: str
    modules: int
    lines: int
    parse_errors: list[str]
    import_sites: dict[str, int]
    by_module: View | None
    by_package: View | None
    layers: list[LayerReport] | None  # None: no contract found
    most_imported: list[Fan]
    most_importing: list[Fan]
    closure: dict[str, list[str]]
    checkout: dict[str, View] | None  # the whole checkout in brief, when the scope is a package


def _top(counts: Counter[str]) -> list[Fan]:
    return [Fan(m, c) for m, c in sorted(counts.items(), key=lambda mc: (-mc[1], mc[0]))[:TOP]]


def build_report(args: argparse.Namespace) -> Report:
    root: Path = args.root.resolve()
    modules = find_modules(root, args.exclude)
    sites, lines, errors = read_sites(modules, args.parents)
    package: str = args.package
    if args.scope == "package":
        nodes = {n for n in modules if n == package or n.startswith(package + ".")}
        if not nodes:
            raise UsageError(f"no package {package!r} under {root}")
    else:
        nodes = set(modules)
    graph = module_graph(sites, nodes)
    in_scope = [s for s in sites if s.source in nodes and s.target in nodes]
    site_counts = Counter(s.kind for s in in_scope)
    contracts = load_contracts(root, args.layers, package, nodes)
    whole = None
    if args.scope == "package":
        everything = module_graph(sites, set(modules))
        whole = {"modules": view(everything), "packages": view(unit_graph(everything))}
    return Report(
        root=str(root),
        scope=f"{package}/" if args.scope == "package" else "checkout",
        modules=len(nodes),
        lines=sum(lines.get(n, 0) for n in nodes),
        parse_errors=errors,
        import_sites={**{k.value: site_counts[k] for k in Kind}, "total": len(in_scope)},
        by_module=view(graph) if args.units in ("modules", "both") else None,
        by_package=view(unit_graph(graph)) if args.units in ("packages", "both") else None,
        layers=[check_layers(c, graph) for c in contracts] if contracts else None,
        most_imported=_top(Counter(t for (_, t), e in graph.edges.items() if e.kind in RUNS)),
        most_importing=_top(Counter(s for (s, _), e in graph.edges.items() if e.kind in RUNS)),
        closure={
            m: closure(graph, m) for m in (find_module(c, package, nodes) for c in args.closure)
        },
        checkout=whole,
    )


def _counts(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{n} {k}" for k, n in counts.items() if k != "total")


def _edge(edge: Edge) -> str:
    return f"{edge.source} -> {edge.target} ({edge.kind}, {edge.where})"


def _step(members: Sequence[str]) -> str:
    return members[0] if len(members) == 1 else "{" + ", ".join(members) + "}"


def _cycle_text(name: str, cycles: Sequence[Cycle], units: str) -> list[str]:
    out = [f"  {name}: {len(cycles)}"]
    for i, cycle in enumerate(cycles, 1):
        out.append(f"    {i}. {len(cycle.members)} {units}: {', '.join(cycle.members)}")
        out.append(f"       shortest cycle: {' -> '.join(cycle.path)}")
        out.append(f"         its imports: {', '.join(cycle.via)}")
        out += [f"       not module-level: {_edge(edge)}" for edge in cycle.cuts]
    return out


def _view_text(title: str, v: View, units: str, verbose: bool) -> list[str]:
    out = [
        "",
        title,
        f"  {v.units} {units}; {v.edges['total']} edges: {_counts(v.edges)}",
        "cycles (strongly connected components of more than one unit):",
    ]
    for name, cycles in v.cycles.items():
        out += _cycle_text(name, cycles, units)
    out.append(
        f"levels (longest chain of module-level imports, cycles collapsed): {v.levels} "
        f"({v.levels - 1} hops)"
    )
    out += [f"  {i:>2}. {_step(step)}" for i, step in enumerate(v.chain, 1)]
    if verbose:
        out.append(f"level of each of the {units} (1 imports nothing of the scope):")
        for node, level in sorted(v.level_of.items(), key=lambda nl: (-nl[1], nl[0])):
            out.append(f"  {level:>3}  {node}")
    return out


def _layers_text(reports: list[LayerReport] | None) -> list[str]:
    if reports is None:
        return [
            "",
            "upward imports: skipped (no layers contract in the root's .importlinter, setup.cfg or "
            "pyproject.toml; pass --layers FILE)",
        ]
    out = []
    for r in reports:
        out += [
            "",
            f"upward imports against layers contract {r.contract!r} ({r.source})",
            f"  {len(r.layers)} layers, top to bottom; {r.unlayered} modules of the scope in none",
            f"  upward (a lower layer imports a higher one): {r.upward['total']}: "
            + _counts(r.upward),
            f"  sideways (between independent siblings): {r.sideways['total']}: "
            + _counts(r.sideways),
            f"  left out by ignore_imports: {r.ignored}",
        ]
        out += [f"    {_edge(e)}" for e in r.edges]
    return out


def render_text(report: Report, verbose: bool) -> str:
    out = [
        f"import graph of {report.root}, scope {report.scope}",
        f"  {report.modules} modules, {report.lines:,} lines",
        f"  import sites (statement x imported module): {report.import_sites['total']}: "
        + _counts(report.import_sites),
    ]
    out += [f"  could not parse: {error}" for error in report.parse_errors]
    if report.by_module:
        out += _view_text("modules as units", report.by_module, "modules", verbose)
    if report.by_package:
        out += _view_text(
            "packages as units (top/x/** is one unit, top/z.py its own)",
            report.by_package,
            "units",
            verbose,
        )
    out += _layers_text(report.layers)
    for title, fans in (
        ("most imported (importers, module-level or lazy)", report.most_imported),
        ("most importing (modules imported, module-level or lazy)", report.most_importing),
    ):
        out += ["", title + ": " + ", ".join(f"{f.module} {f.count}" for f in fans)]
    for module, pulled in report.closure.items():
        out += ["", f"closure of {module} (module-level imports): {len(pulled)} modules"]
        out += [f"  {m}" for m in pulled]
    if report.checkout:
        out += ["", "whole checkout (every module under the root, in brief):"]
        for units, v in report.checkout.items():
            cycles = ", ".join(f"{len(c)} {name}" for name, c in v.cycles.items())
            out.append(
                f"  {units} as units: {v.units} units, {v.levels} levels, {v.edges['total']} "
                f"edges ({_counts(v.edges)}); cycles: {cycles}"
            )
    return "\n".join(out) + "\n"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python devtools/import_graph.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, help="default: %(default)s")
    parser.add_argument("--package", default="sidecar", help="default: %(default)s")
    parser.add_argument("--scope", choices=("package", "checkout"), default="package")
    parser.add_argument("--units", choices=("modules", "packages", "both"), default="both")
    parser.add_argument("--layers", type=Path, metavar="FILE", help="layers, top to bottom")
    parser.add_argument("--closure", nargs="+", default=[], metavar="MODULE")
    parser.add_argument("--parents", action="store_true", help="count parent packages as edges")
    parser.add_argument(
        "--exclude", action="append", default=[], metavar="GLOB", help="path from the root"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every unit's level")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        report = build_report(args)
    except UsageError as error:
        print(f"import_graph: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        sys.stdout.write(render_text(report, args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The advice rules: `configs/advice.yaml` parsed and validated once into frozen rules.

Rules are data (docs/STYLE.md, point 3), as the phase rules are: each names a condition over
the snapshot's figures (sidecar/advice/figures.py) in a small expression language
(sidecar/advice/expr.py, no `eval`), a severity, evidence lines that print the measured numbers,
the knob and its exact vLLM flags, why, and a docs.vllm.ai link. Every error names the rule and
the key at fault.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from sidecar.advice.expr import (
    Arith,
    Bounds,
    Compare,
    ExprError,
    Logic,
    Name,
    Neg,
    Node,
    Not,
    check_bounds,
    is_condition,
    names,
    parse,
)
from sidecar.advice.figures import ROLES, known
from sidecar.config.packaged import load_yaml, packaged_config, read_config_text
from sidecar.errors import ConfigError

ADVICE_FILENAME = "advice.yaml"
DOCS_PREFIX = "https://docs.vllm.ai/"
FORMATS = ("num", "pct", "pct1", "s", "int", "bytes", "cores", "x")
_ID = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_DEFINE = re.compile(r"^[a-z][a-z0-9_]*$")
_FLAG = re.compile(r"^--[a-z][a-z0-9-]*$")
_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")
_CALL = re.compile(r"^(busiest|flag)\(([^()]*)\)$")
_RULE_KEYS = frozenset({"id", "severity", "title", "when", "evidence", "knob", "flags", "why",
                        "docs"})  # fmt: skip
_TOP_KEYS = frozenset({"version", "define", "rules"})


class Severity(StrEnum):
    INFO = "info"
    WARNING = "warning"
    CRITICAL = "critical"


@dataclass(frozen=True, slots=True)
class Placeholder:
    """`{expr}` or `{expr:fmt}` (a number), `{flag(name)}` (a serving flag as given, or vLLM's
    default), `{busiest(main.role)}` (the role's largest phases other than idle)."""

    kind: str  # "expr" | "flag" | "busiest"
    text: str
    node: Node | None = None
    fmt: str = "num"
    arg: str = ""


@dataclass(frozen=True, slots=True)
class Template:
    parts: tuple[str | Placeholder, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(n for p in self.parts if isinstance(p, Placeholder) and p.node
                     for n in names(p.node))  # fmt: skip


@dataclass(frozen=True, slots=True)
class AdviceRule:
    id: str
    severity: Severity
    title: str
    when: Node
    when_text: str
    evidence: tuple[Template, ...]
    knob: str
    flags: tuple[str, ...]
    why: str
    docs: str


@dataclass(frozen=True, slots=True)
class AdviceRules:
    rules: tuple[AdviceRule, ...]
    source: str
    version: str | None = None
    digest: str | None = None

    @property
    def fingerprint(self) -> str:
        short = f"sha256:{self.digest[:12]}" if self.digest else "no digest"
        return f"{self.version or 'unversioned'} {short}"


def default_advice_path() -> Path:
    """The built-in advice.yaml (package data in sidecar/configs/, linked as configs/)."""
    return packaged_config(ADVICE_FILENAME)


def load_advice(path: Path | None = None) -> AdviceRules:
    path = path or default_advice_path()
    fix = "Pass --advice with a readable file, or omit it to use the built-in configs/advice.yaml."
    return parse_advice(
        read_config_text(path, "advice rules", "an advice rules file", fix), source=str(path)
    )


def parse_advice(text: str, source: str = "<advice>") -> AdviceRules:
    try:
        data = load_yaml(text, source)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source} is not valid YAML: {exc}. Fix the syntax and retry.") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("rules"), list):
        raise ConfigError(f"{source}: expected a mapping with a `rules:` list at the top level")
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ConfigError(f"{source}: unknown top-level keys {sorted(unknown)}; "
                          f"allowed: {sorted(_TOP_KEYS)}")  # fmt: skip
    defines = _defines(data.get("define") or {}, source)
    rules = tuple(_rule(raw, i, source, defines) for i, raw in enumerate(data["rules"]))
    ids = [r.id for r in rules]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"{source}: rule ids must be unique; repeated: {dupes}")
    version = data.get("version")
    return AdviceRules(rules, source, None if version is None else str(version),
                       hashlib.sha256(text.encode("utf-8")).hexdigest())  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Defined:
    """A define's expression, the defines it uses inlined, and its depth and size as inlined:
    measured once, so that a use costs the same whatever the define holds."""

    node: Node
    bounds: Bounds


_Defines = Mapping[str, _Defined]


def _defines(raw: Any, source: str) -> dict[str, _Defined]:
    """`define: {name: expression}`: shorthands, each usable by the ones after it."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{source}: `define:` must map names to expressions")
    out: dict[str, _Defined] = {}
    for name, text in raw.items():
        where = f"{source}: define {name!r}"
        if not isinstance(name, str) or not _DEFINE.match(name):
            raise ConfigError(f"{where}: a name is lowercase letters, digits and _ (no dots)")
        out[name] = _measured(text, where, out)
    return out


def _rule(raw: Any, index: int, source: str, defines: _Defines) -> AdviceRule:
    if not isinstance(raw, Mapping) or not raw.get("id"):
        raise ConfigError(f"{source}: rule #{index + 1} needs a mapping with an `id:`")
    where = f"{source}: rule {raw['id']!r}"
    unknown, missing = set(raw) - _RULE_KEYS, _RULE_KEYS - set(raw)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_RULE_KEYS)}")
    if missing:
        raise ConfigError(f"{where}: missing keys {sorted(missing)}: every rule says when it "
                          "fires, its evidence, the knob and flags, why, and where vLLM's docs "
                          "explain it")  # fmt: skip
    if not _ID.match(str(raw["id"])):
        raise ConfigError(f"{where}: an id is lowercase words joined by dashes (kv-cache-full)")
    try:
        severity = Severity(raw["severity"])
    except ValueError:
        raise ConfigError(f"{where}: severity {raw['severity']!r} is not one of "
                          f"{[s.value for s in Severity]}") from None  # fmt: skip
    when = _expression(raw["when"], f"{where}: when", defines)
    if not is_condition(when):
        raise ConfigError(f"{where}: `when:` must be a condition (a comparison), got a number")
    flags = raw["flags"]
    if not isinstance(flags, list) or not all(isinstance(f, str) and _FLAG.match(f) for f in flags):
        raise ConfigError(f"{where}: `flags:` must list vLLM flags as typed (--max-num-seqs)")
    docs = str(raw["docs"])
    if not docs.startswith(DOCS_PREFIX):
        raise ConfigError(f"{where}: `docs:` must link into vLLM's documentation ({DOCS_PREFIX})")
    evidence = raw["evidence"]
    if not isinstance(evidence, list) or not evidence:
        raise ConfigError(f"{where}: `evidence:` must be a non-empty list of lines")
    return AdviceRule(
        id=str(raw["id"]), severity=severity, title=_text(raw, "title", where), when=when,
        when_text=str(raw["when"]).strip(),
        evidence=tuple(_template(line, f"{where}: evidence", defines) for line in evidence),
        knob=_text(raw, "knob", where), flags=tuple(flags), why=_text(raw, "why", where),
        docs=docs,
    )  # fmt: skip


def _text(raw: Mapping[str, Any], key: str, where: str) -> str:
    value = raw[key]
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: `{key}:` must be text")
    return " ".join(value.split())


def _expression(text: Any, where: str, defines: _Defines) -> Node:
    return _measured(text, where, defines).node


def _measured(text: Any, where: str, defines: _Defines) -> _Defined:
    """TEXT's tree with the defines inlined, and its depth and size. Both are read off the tree
    as written, each define counted as what it stands for (a chain of them can multiply the
    size): walking the inlined tree cost each use of a define its whole size, so a file of
    `eN: big + 1` lines took seconds per kilobyte (issue 26)."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ConfigError(f"{where}: expected an expression, got {text!r}")

    def defined(name: str) -> Bounds | None:
        found = defines.get(name)
        return found.bounds if found is not None else None

    try:
        parsed = parse(str(text))
        bounds = check_bounds(parsed, defined)
    except ExprError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    node = _inline(parsed, defines)
    # A define's own figures were checked where it was defined.
    bad = sorted({n for n in names(parsed) if n not in defines and not known(n)})
    if bad:
        raise ConfigError(
            f"{where}: unknown figures {bad}; see sidecar/advice/figures.py for the names "
            "(share.<role>.<phase>, main.<role>.<phase>, cpu.<role>, thread.<role>.main_cpu, "
            "serving.*, kv.*, gpu.*, "
            "flag.*) or define them under `define:`"
        )
    return _Defined(node, bounds)


def _inline(node: Node, defines: _Defines) -> Node:
    """NODE with every defined name replaced by its expression."""
    if isinstance(node, Name):
        found = defines.get(node.name)
        return found.node if found is not None else node
    if isinstance(node, Neg):
        return Neg(_inline(node.operand, defines))
    if isinstance(node, Not):
        return Not(_inline(node.operand, defines))
    if isinstance(node, Arith):
        return Arith(node.op, _inline(node.left, defines), _inline(node.right, defines))
    if isinstance(node, Compare):
        return Compare(node.op, _inline(node.left, defines), _inline(node.right, defines))
    if isinstance(node, Logic):
        return Logic(node.op, tuple(_inline(n, defines) for n in node.operands))
    return node


def _template(line: Any, where: str, defines: _Defines) -> Template:
    if not isinstance(line, str):
        raise ConfigError(f"{where}: each evidence line is text, got {line!r}")
    parts: list[str | Placeholder] = []
    pos = 0
    for match in _PLACEHOLDER.finditer(line):
        parts.append(line[pos : match.start()])
        parts.append(_placeholder(match.group(1).strip(), f"{where} {line!r}", defines))
        pos = match.end()
    parts.append(line[pos:])
    return Template(tuple(p for p in parts if p != ""))


def _placeholder(text: str, where: str, defines: _Defines) -> Placeholder:
    call = _CALL.match(text)
    if call:
        kind, arg = call.group(1), call.group(2).strip()
        if kind == "busiest":
            prefix, _, role = arg.partition(".")
            if prefix not in ("share", "main") or role not in ROLES:
                raise ConfigError(f"{where}: busiest() takes share.<role> or main.<role>")
        elif not re.match(r"^[a-z][a-z0-9-]*$", arg):
            raise ConfigError(f"{where}: flag() takes a vLLM flag name without dashes in front")
        return Placeholder(kind, text, arg=arg)
    expr, _, fmt = text.partition(":")
    fmt = fmt.strip() or "num"
    if fmt not in FORMATS:
        raise ConfigError(f"{where}: unknown format {fmt!r}; one of {list(FORMATS)}")
    node = _expression(expr, where, defines)
    if is_condition(node):
        raise ConfigError(f"{where}: {{{text}}} prints a number, not a condition")
    return Placeholder("expr", text, node=node, fmt=fmt)

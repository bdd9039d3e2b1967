"""The small expression language of `configs/advice.yaml`: conditions over named figures.

Conditions are data, never Python: a hand-written parser (no `eval`) turns
`serving.preemptions > 0 or (kv.usage >= 90% and serving.requests_waiting >= 1)` into a tree of
frozen nodes once, when the rules load, and checks the names and the types there (a number is
compared, a comparison is combined), so a typo fails the load naming the rule, not a report.

    expr  := or ;  or := and ("or" and)* ;  and := not ("and" not)* ;  not := "not" not | cmp
    cmp   := sum (("<" | "<=" | ">" | ">=" | "==" | "!=") sum)?
    sum   := prod (("+" | "-") prod)* ;  prod := unary (("*" | "/") unary)*
    unary := "-" unary | NUMBER ["%"] | NAME | "(" expr ")"

A figure that was not measured is None, and None propagates: arithmetic and comparisons with it
are None ("unknown"), `and` is False if any side is False, `or` True if any side is True (Kleene's
three-valued logic). A rule whose condition is unknown does not fire; the engine says which
figures it lacked.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from sidecar.config.packaged import distinct_postorder

Value = float | bool | None
Bounds = tuple[int, int]  # a tree's depth and size (check_bounds)
Lookup = Callable[[str], float | None]

_TOKEN = re.compile(
    r"\s*(?:(?P<num>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?%?|\.\d+%?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z0-9_]+)*)"
    r"|(?P<op><=|>=|==|!=|[<>+\-*/()]))"
)
_BLANK_REST = re.compile(r"\s*\Z")
_KEYWORDS = frozenset({"and", "or", "not"})
_COMPARE: Mapping[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne,
}  # fmt: skip
_ARITH: Mapping[str, Callable[[float, float], float]] = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
}  # fmt: skip


class ExprError(ValueError):
    """A condition that cannot be parsed or does not type-check; the message says where."""


# Bounds (issue 26, item 13): the parser and the evaluator recurse, and a `define:` may use the
# ones before it, so an expression nested 2,000 deep raised RecursionError and a chain of
# defines that each doubles the one before took exponential time. Real conditions are a few
# dozen nodes deep and big; these limits are far above them and far below trouble.
MAX_TOKENS = 2_000
MAX_NESTING = 50  # parentheses, `not` and unary `-` inside each other
MAX_DEPTH = 200  # the tree once defines are inlined
MAX_SIZE = 20_000  # its nodes, a shared define counted at every use


@dataclass(frozen=True, slots=True)
class Num:
    value: float


@dataclass(frozen=True, slots=True)
class Name:
    name: str


@dataclass(frozen=True, slots=True)
class Neg:
    operand: Node


@dataclass(frozen=True, slots=True)
class Arith:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Not:
    operand: Node


@dataclass(frozen=True, slots=True)
class Logic:
    op: str  # "and" | "or"
    operands: tuple[Node, ...]


Node = Num | Name | Neg | Arith | Compare | Not | Logic


def parse(text: str) -> Node:
    """The expression tree of TEXT; ExprError names the token at fault."""
    tokens = _tokens(text)
    if len(tokens) > MAX_TOKENS:
        raise ExprError(f"too many tokens, over the {MAX_TOKENS} an expression may hold")
    parser = _Parser(tokens, text)
    node = parser.expr()
    if parser.peek() is not None:
        raise ExprError(f"unexpected {parser.peek()!r} in {_shown(text)}")
    check_bounds(node)
    return node


def _children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Neg | Not):
        return (node.operand,)
    if isinstance(node, Arith | Compare):
        return (node.left, node.right)
    if isinstance(node, Logic):
        return node.operands
    return ()


def check_bounds(node: Node, defined: Callable[[str], Bounds | None] | None = None) -> Bounds:
    """NODE's depth and size; ExprError when it is deeper than MAX_DEPTH or bigger than
    MAX_SIZE, counting a node shared by several uses of a define at each use. DEFINED gives the
    depth and size of a name that stands for a define (None for a figure): the tree is measured
    as if the defines were inlined, each measured once where it is defined rather than walked
    again at every use. Loops, memoised per node: linear in the distinct nodes, whatever the
    expansion."""
    depth: dict[int, int] = {}
    size: dict[int, int] = {}
    for current, kids in distinct_postorder(node, _children):
        inlined = defined(current.name) if defined and isinstance(current, Name) else None
        if inlined is not None:
            depth[id(current)], size[id(current)] = inlined
        else:
            depth[id(current)] = 1 + max((depth[id(k)] for k in kids), default=0)
            size[id(current)] = 1 + sum(size[id(k)] for k in kids)
        if depth[id(current)] > MAX_DEPTH:
            raise ExprError(f"nested over {MAX_DEPTH} deep; split it into `define:` entries")
        if size[id(current)] > MAX_SIZE:
            raise ExprError(
                f"expands to over {MAX_SIZE} terms (defines used inside defines multiply); "
                "simplify the defines it uses"
            )
    return depth[id(node)], size[id(node)]


def is_condition(node: Node) -> bool:
    """Whether NODE is true or false (a comparison, or `and`/`or`/`not` of them)."""
    return isinstance(node, Compare | Not | Logic)


def names(node: Node) -> Iterator[str]:
    """Every figure name NODE reads."""
    if isinstance(node, Name):
        yield node.name
    elif isinstance(node, Neg | Not):
        yield from names(node.operand)
    elif isinstance(node, Arith | Compare):
        yield from names(node.left)
        yield from names(node.right)
    elif isinstance(node, Logic):
        for operand in node.operands:
            yield from names(operand)


def evaluate(node: Node, lookup: Lookup) -> Value:
    """NODE's value with figures from LOOKUP (None: unknown)."""
    if isinstance(node, Num):
        return node.value
    if isinstance(node, Name):
        return lookup(node.name)
    if isinstance(node, Neg):
        value = evaluate(node.operand, lookup)
        return None if value is None else -float(value)
    if isinstance(node, Arith):
        left, right = evaluate(node.left, lookup), evaluate(node.right, lookup)
        if left is None or right is None or (node.op == "/" and right == 0):
            return None
        return _ARITH[node.op](float(left), float(right))
    if isinstance(node, Compare):
        left, right = evaluate(node.left, lookup), evaluate(node.right, lookup)
        if left is None or right is None:
            return None
        return _COMPARE[node.op](float(left), float(right))
    if isinstance(node, Not):
        value = evaluate(node.operand, lookup)
        return None if value is None else not value
    values = [evaluate(n, lookup) for n in node.operands]
    decisive = node.op == "or"  # `or`: one True decides; `and`: one False decides
    if decisive in values:
        return decisive
    return None if None in values else not decisive


# ---------------------------------------------------------------------------------- parsing


def _tokens(text: str) -> list[str]:
    """TEXT's tokens, at most MAX_TOKENS + 1: reading stops past the bound, and each step looks
    at the next token only. (It read every token first, and copied the rest of the text after
    each to see whether only blanks were left: 800 kB of `a a a ...` took 30 s.)"""
    out: list[str] = []
    pos = 0
    while pos < len(text) and len(out) <= MAX_TOKENS:
        if _BLANK_REST.match(text, pos):
            break
        match = _TOKEN.match(text, pos)
        if match is None or match.end() == pos:
            raise ExprError(f"cannot read {text[pos:].strip()[:20]!r} in {_shown(text)}")
        out.append(match.group(match.lastgroup or "op"))
        pos = match.end()
    return out


def _shown(text: str) -> str:
    """TEXT as an error quotes it: whole when short, else its start (every message quoted the
    whole expression, so a refused 1 MB condition made a 1 MB message)."""
    return repr(text if len(text) <= _SHOWN else text[: _SHOWN - 3] + "...")


_SHOWN = 80


class _Parser:
    def __init__(self, tokens: list[str], text: str) -> None:
        self.tokens, self.text, self.pos = tokens, text, 0
        self.nesting = 0

    def peek(self) -> str | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def take(self) -> str:
        token = self.peek()
        if token is None:
            raise ExprError(f"{_shown(self.text)} ends too early")
        self.pos += 1
        return token

    def expr(self) -> Node:
        return self._logic("or", self._and)

    def _and(self) -> Node:
        return self._logic("and", self._not)

    def _logic(self, op: str, operand: Callable[[], Node]) -> Node:
        parts = [operand()]
        while self.peek() == op:
            self.take()
            parts.append(operand())
        if len(parts) == 1:
            return parts[0]
        for part in parts:
            self._want(part, condition=True, where=f"`{op}`")
        return Logic(op, tuple(parts))

    def _nest(self) -> None:
        self.nesting += 1
        if self.nesting > MAX_NESTING:
            raise ExprError(f"nested over {MAX_NESTING} deep in {_shown(self.text)}")

    def _not(self) -> Node:
        if self.peek() == "not":
            self.take()
            self._nest()
            operand = self._not()
            self.nesting -= 1
            self._want(operand, condition=True, where="`not`")
            return Not(operand)
        return self._compare()

    def _compare(self) -> Node:
        left = self._sum()
        if self.peek() in _COMPARE:
            op = self.take()
            right = self._sum()
            for side in (left, right):
                self._want(side, condition=False, where=f"`{op}`")
            return Compare(op, left, right)
        return left

    def _sum(self) -> Node:
        return self._arith(("+", "-"), self._prod)

    def _prod(self) -> Node:
        return self._arith(("*", "/"), self._unary)

    def _arith(self, ops: tuple[str, ...], operand: Callable[[], Node]) -> Node:
        node = operand()
        while self.peek() in ops:
            op = self.take()
            right = operand()
            for side in (node, right):
                self._want(side, condition=False, where=f"`{op}`")
            node = Arith(op, node, right)
        return node

    def _unary(self) -> Node:
        token = self.take()
        if token == "-":
            self._nest()
            operand = self._unary()
            self.nesting -= 1
            self._want(operand, condition=False, where="`-`")
            return Neg(operand)
        if token == "(":
            self._nest()
            node = self.expr()
            self.nesting -= 1
            if self.peek() != ")":
                raise ExprError(f"a `(` is not closed in {_shown(self.text)}")
            self.take()
            return node
        if token[0].isdigit() or token[0] == ".":
            return Num(float(token[:-1]) / 100 if token.endswith("%") else float(token))
        if token in _KEYWORDS or not (token[0].isalpha() or token[0] == "_"):
            raise ExprError(f"unexpected {token!r} in {_shown(self.text)}")
        return Name(token)

    def _want(self, node: Node, *, condition: bool, where: str) -> None:
        if is_condition(node) != condition:
            what = "a condition (a comparison)" if condition else "a number"
            raise ExprError(f"{where} takes {what} in {_shown(self.text)}")

"""The SQL92 compiler and evaluator: parse-tree reductions become nested closures.

:mod:`.sql92` owns the grammar, the parser and the public API; this module owns what an
expression *means*.  :class:`Compiler` is lark's inline transformer: each reduction of the LALR
parser calls one of its methods, which checks what RocketMQ checks at parse time and returns a
node (:class:`_Const`, :class:`_Prop`, :class:`_Bool`, :class:`_Value`, :class:`_Chain`) holding
a closure over a message's properties.  The closures keep RocketMQ's three-valued logic and its
type conversions (``Long.valueOf`` / ``Double.valueOf`` of a property compared with a number); a
conversion that fails raises :class:`EvaluationError`, which :class:`.sql92.SqlFilter` turns into
"no match".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from lark import Token, Transformer, v_args

from .sql92 import EvaluationError, Fn

_LONG_RE = re.compile(r"[+-]?[0-9]+")
_DOUBLE_RE = re.compile(r"\s*[+-]?(NaN|Infinity|([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)[fFdD]?\s*")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


class _Const:
    """A literal known at compile time (kept apart so compile-time checks can see it)."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value


class _Prop:
    __slots__ = ("name",)

    def __init__(self, name: str):
        self.name = name


class _Bool:
    """Marks a compiled sub-expression whose value is boolean (comparison, logic)."""

    __slots__ = ("fn", "depth")

    def __init__(self, fn: Fn, *operands: Any):
        self.fn = fn
        self.depth = _depth_over(operands)


class _Value:
    """A compiled non-boolean sub-expression (negation of a property...)."""

    __slots__ = ("fn", "depth")

    def __init__(self, fn: Fn, *operands: Any):
        self.fn = fn
        self.depth = _depth_over(operands)


class _Chain:
    """``a AND b AND c...`` (or ``OR``) as one n-ary node: its closure is built when first used.

    A left-deep tree of two-term closures would cost one Python frame per term when evaluated;
    one loop over the terms costs one, whatever the length of the chain.
    """

    __slots__ = ("op", "fns", "depth", "_fn")

    def __init__(self, op: str, fns: list[Fn], depth: int):
        self.op = op
        self.fns = fns
        self.depth = depth
        self._fn: Fn | None = None

    @property
    def fn(self) -> Fn:
        if self._fn is None:
            self._fn = (_all if self.op == "AND" else _any)(tuple(self.fns))
        return self._fn


def _depth_over(operands: tuple[Any, ...]) -> int:
    return 1 + max((getattr(o, "depth", 0) for o in operands), default=0)


def _to_long(s: str) -> int:
    if not (s.isascii() and s.isdigit()) and not _LONG_RE.fullmatch(s):  # plain digits skip the regex
        raise EvaluationError(f"{s!r} is not a long")
    v = int(s)
    if not _LONG_MIN <= v <= _LONG_MAX:
        raise EvaluationError(f"{s!r} is out of the long range")
    return v


def _to_double(s: str) -> float:
    if not _DOUBLE_RE.fullmatch(s):
        raise EvaluationError(f"{s!r} is not a double")
    return float(s.strip().rstrip("fFdD"))


def _compare(lv: Any, rv: Any) -> int | None:
    """Java's ``compareTo`` after RocketMQ's type conversions; ``None`` when the types never compare."""
    lt, rt = type(lv), type(rv)
    if lt is not rt:
        if lt is str:
            if rt is int:
                lv = _to_long(lv)
            elif rt is float:
                lv = _to_double(lv)
            elif rt is bool:
                lv = lv.lower() == "true"
            else:
                return None
        elif rt is str:
            if lt is int:
                rv = _to_long(rv)
            elif lt is float:
                rv = _to_double(rv)
            elif lt is bool:
                rv = rv.lower() == "true"
            else:
                return None
        elif lt is bool or rt is bool:
            return None
        # int against float compares numerically, as Java widens the long to a double.
    return (lv > rv) - (lv < rv)


def _order_values(lv: Any, rv: Any) -> int | None:
    """Comparison for ``>``/``<``...: two strings are compared as doubles (else it fails)."""
    if type(lv) is str and type(rv) is str:
        return _compare(_to_double(lv), _to_double(rv))
    return _compare(lv, rv)


def _truth(fn_or_node: Any) -> Fn:
    """A node used where a boolean is needed (RocketMQ's ``asBooleanExpression``)."""
    if isinstance(fn_or_node, (_Bool, _Chain)):
        return fn_or_node.fn
    if isinstance(fn_or_node, _Const):
        v = fn_or_node.value
        if type(v) is bool:
            return lambda p: v
        raise ValueError(f"{_describe(fn_or_node)} will not result in a boolean value")
    if isinstance(fn_or_node, _Prop):
        name = fn_or_node.name

        # A property used as a condition: null when absent, otherwise never a Java Boolean -> false.
        def cast(p: Mapping[str, str]) -> bool | None:
            return None if p.get(name) is None else False

        return cast
    raise ValueError(f"{_describe(fn_or_node)} will not result in a boolean value")


def _value(node: Any) -> Fn:
    if isinstance(node, _Const):
        v = node.value
        return lambda p: v
    if isinstance(node, _Prop):
        name = node.name
        return lambda p: p.get(name)
    return node.fn


def _describe(node: Any) -> str:
    if isinstance(node, _Const):
        v = node.value
        if v is None:
            return "NULL"
        if type(v) is bool:
            return "TRUE" if v else "FALSE"
        if type(v) is str:
            return "'" + v.replace("'", "''") + "'"
        return repr(v)
    if isinstance(node, _Prop):
        return node.name
    return "a boolean expression" if isinstance(node, (_Bool, _Chain)) else "an expression"


def _check_orderable(node: Any, op: str) -> None:
    if isinstance(node, _Const) and type(node.value) not in (int, float):
        raise ValueError(f"value {_describe(node)} cannot be compared with {op!r}")
    if isinstance(node, (_Bool, _Chain)):
        raise ValueError(f"a boolean expression cannot be compared with {op!r}")


def _check_equal_operand(node: Any) -> None:
    if isinstance(node, _Const) and node.value is None:
        raise ValueError("NULL cannot be compared with '=' or '<>'; use IS NULL / IS NOT NULL")


def _not(fn: Fn) -> Fn:
    def f(p: Mapping[str, str]) -> bool | None:
        v = fn(p)
        return None if v is None else not v

    return f


def _equal(left: Any, right: Any) -> Fn:
    lf, rf = _value(left), _value(right)
    # Fast path for the usual ``prop = 'literal'`` / ``prop = 3``.
    if isinstance(left, _Prop) and isinstance(right, _Const) and right.value is not None:
        name, c = left.name, right.value
        if type(c) is str:

            def eq_str(p: Mapping[str, str]) -> bool | None:
                v = p.get(name)
                return None if v is None else v == c

            return eq_str

        if type(c) is int or type(c) is float:
            convert = _to_long if type(c) is int else _to_double

            def eq_number(p: Mapping[str, str]) -> bool | None:
                v = p.get(name)
                return None if v is None else convert(v) == c

            return eq_number

        def eq_const(p: Mapping[str, str]) -> bool | None:
            v = p.get(name)
            if v is None:
                return None
            return _compare(v, c) == 0

        return eq_const

    def eq(p: Mapping[str, str]) -> bool | None:
        lv, rv = lf(p), rf(p)
        if lv is None or rv is None:
            if lv is None and rv is None:
                return True
            return None if lv is None else False
        if type(lv) is type(rv):
            return lv == rv
        return _compare(lv, rv) == 0

    return eq


def _ordering(left: Any, right: Any, op: str, test: Callable[[int], bool]) -> Fn:
    _check_orderable(left, op)
    _check_orderable(right, op)
    if isinstance(left, _Prop) and isinstance(right, _Const):
        name, c = left.name, right.value
        convert = _to_long if type(c) is int else _to_double
        if op == ">":
            return lambda p: None if (v := p.get(name)) is None else convert(v) > c
        if op == ">=":
            return lambda p: None if (v := p.get(name)) is None else convert(v) >= c
        if op == "<":
            return lambda p: None if (v := p.get(name)) is None else convert(v) < c
        return lambda p: None if (v := p.get(name)) is None else convert(v) <= c
    lf, rf = _value(left), _value(right)

    def cmp(p: Mapping[str, str]) -> bool | None:
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        r = _order_values(lv, rv)
        # Types Java cannot compare give -1 there: mirror it rather than inventing an answer.
        return test(-1 if r is None else r)

    return cmp


def _and(lf: Fn, rf: Fn) -> Fn:
    def f(p: Mapping[str, str]) -> bool | None:
        lv = lf(p)
        if lv is False:
            return False
        rv = rf(p)
        if rv is False:
            return False
        if lv is None or rv is None:
            return None
        return True

    return f


def _or(lf: Fn, rf: Fn) -> Fn:
    def f(p: Mapping[str, str]) -> bool | None:
        lv = lf(p)
        if lv is True:
            return True
        rv = rf(p)
        if rv is True:
            return True
        if lv is None or rv is None:
            return None
        return False

    return f


def _all(fns: tuple[Fn, ...]) -> Fn:
    """Three-valued AND of the terms, left to right, stopping at the first false one."""
    if len(fns) == 2:
        return _and(*fns)

    def f(p: Mapping[str, str]) -> bool | None:
        unknown = False
        for fn in fns:
            v = fn(p)
            if v is False:
                return False
            if v is None:
                unknown = True
        return None if unknown else True

    return f


def _any(fns: tuple[Fn, ...]) -> Fn:
    """Three-valued OR of the terms, left to right, stopping at the first true one."""
    if len(fns) == 2:
        return _or(*fns)

    def f(p: Mapping[str, str]) -> bool | None:
        unknown = False
        for fn in fns:
            v = fn(p)
            if v is True:
                return True
            if v is None:
                unknown = True
        return None if unknown else False

    return f


def _chain(op: str, left: Any, right: Any) -> _Chain:
    """Extend a chain of the same operator in place (each operand node is used once, so its list
    can be taken over: a long chain costs linear time, not quadratic)."""
    if isinstance(left, _Chain) and left.op == op:
        fns, depth = left.fns, left.depth
    else:
        fns, depth = [_truth(left)], getattr(left, "depth", 0) + 1
    if isinstance(right, _Chain) and right.op == op:
        fns.extend(right.fns)
        depth = max(depth, right.depth)
    else:
        fns.append(_truth(right))
        depth = max(depth, getattr(right, "depth", 0) + 1)
    return _Chain(op, fns, depth)


def _string_literal(tok: Token) -> str:
    return str(tok)[1:-1].replace("''", "'")


def _require_prop(node: Any, what: str) -> str:
    if not isinstance(node, _Prop):
        raise ValueError(f"expected a property name before {what}, got {_describe(node)}")
    return node.name


def _string_test(
    node: Any, literal: Token, what: str, test: Callable[[str, str], bool], negate: bool
) -> _Bool:
    name = _require_prop(node, what)
    s = _string_literal(literal)

    def f(p: Mapping[str, str]) -> bool | None:
        v = p.get(name)
        if v is None:
            return None
        return test(v, s) != negate

    return _Bool(f, node)


@v_args(inline=True)
class Compiler(Transformer):
    """Turns the parse tree into closures, checking what RocketMQ checks at parse time."""

    def start(self, node: Any) -> _Bool:
        """The root, with its depth for :func:`.sql92.compile_expression` to check."""
        root = _Bool(_truth(node))
        root.depth = getattr(node, "depth", 0)
        return root

    # literals and properties
    def string(self, tok: Token) -> _Const:
        return _Const(_string_literal(tok))

    def decimal(self, tok: Token) -> _Const:
        v = int(str(tok).rstrip("lL"))
        if v > _LONG_MAX + 1:
            raise ValueError(f"number {tok} is out of the long range")
        return _Const(v)

    def float_(self, tok: Token) -> _Const:
        return _Const(float(str(tok)))

    def true(self, _tok: Token) -> _Const:
        return _Const(True)

    def false(self, _tok: Token) -> _Const:
        return _Const(False)

    def null(self, _tok: Token) -> _Const:
        return _Const(None)

    def var(self, tok: Token) -> _Prop:
        return _Prop(str(tok))

    # unary
    def pos(self, node: Any) -> Any:
        return node

    def neg(self, node: Any) -> Any:
        if isinstance(node, _Const) and type(node.value) in (int, float):
            return _Const(-node.value)
        fn = _value(node)

        def negate(p: Mapping[str, str]) -> Any:
            v = fn(p)
            if v is None or type(v) is bool:
                return None
            if type(v) is str:
                try:
                    return -_to_long(v)
                except EvaluationError:
                    return -_to_double(v)
            return -v

        return _Value(negate, node)

    def not_(self, _kw: Token, node: Any) -> _Bool:
        return _Bool(_not(_truth(node)), node)

    # logic
    def and_(self, left: Any, _kw: Token, right: Any) -> _Chain:
        return _chain("AND", left, right)

    def or_(self, left: Any, _kw: Token, right: Any) -> _Chain:
        return _chain("OR", left, right)

    # equality
    def eq(self, left: Any, right: Any) -> _Bool:
        _check_equal_operand(left)
        _check_equal_operand(right)
        if isinstance(left, _Const) and isinstance(right, _Const):
            if type(left.value) is bool and type(right.value) is not bool:
                raise ValueError(f"{_describe(left)} cannot be compared with {_describe(right)}")
        return _Bool(_equal(left, right), left, right)

    def ne(self, left: Any, right: Any) -> _Bool:
        equal = self.eq(left, right)
        return _Bool(_not(equal.fn), equal)

    def is_null(self, node: Any, _is: Token, _null: Token) -> _Bool:
        fn = _value(node)
        return _Bool(lambda p: fn(p) is None, node)

    def is_not_null(self, node: Any, _is: Token, _not_kw: Token, _null: Token) -> _Bool:
        fn = _value(node)
        return _Bool(lambda p: fn(p) is not None, node)

    # ordering
    def gt(self, left: Any, right: Any) -> _Bool:
        return _Bool(_ordering(left, right, ">", lambda r: r > 0), left, right)

    def ge(self, left: Any, right: Any) -> _Bool:
        return _Bool(_ordering(left, right, ">=", lambda r: r >= 0), left, right)

    def lt(self, left: Any, right: Any) -> _Bool:
        return _Bool(_ordering(left, right, "<", lambda r: r < 0), left, right)

    def le(self, left: Any, right: Any) -> _Bool:
        return _Bool(_ordering(left, right, "<=", lambda r: r <= 0), left, right)

    def between(self, value: Any, _kw: Token, low: Any, _and_kw: Token, high: Any) -> _Bool:
        if isinstance(low, _Const) and isinstance(high, _Const):
            if low.value is None or high.value is None:
                raise ValueError("the bounds of BETWEEN can not be NULL")
            r = _compare(low.value, high.value) if type(low.value) is not str else None
            if r is not None and r > 0:
                raise ValueError(
                    f"the low bound of BETWEEN ({_describe(low)}) must be less than or equal to the high bound ({_describe(high)})"
                )
        return _Bool(
            _and(
                _ordering(value, low, ">=", lambda r: r >= 0),
                _ordering(value, high, "<=", lambda r: r <= 0),
            ),
            value,
            low,
            high,
        )

    def not_between(
        self, value: Any, _not_kw: Token, _kw: Token, low: Any, _and_kw: Token, high: Any
    ) -> _Bool:
        return _Bool(
            _or(
                _ordering(value, low, "<", lambda r: r < 0),
                _ordering(value, high, ">", lambda r: r > 0),
            ),
            value,
            low,
            high,
        )

    def string_list(self, *items: Token) -> frozenset[str]:
        return frozenset(_string_literal(t) for t in items)

    def in_(self, node: Any, _kw: Token, values: frozenset[str]) -> _Bool:
        name = _require_prop(node, "IN")
        return _Bool(lambda p: None if (v := p.get(name)) is None else v in values, node)

    def not_in(self, node: Any, _not_kw: Token, _kw: Token, values: frozenset[str]) -> _Bool:
        name = _require_prop(node, "NOT IN")
        return _Bool(lambda p: None if (v := p.get(name)) is None else v not in values, node)

    def contains(self, node: Any, _kw: Token, s: Token) -> _Bool:
        return _string_test(node, s, "CONTAINS", lambda v, x: x in v, False)

    def not_contains(self, node: Any, _n: Token, _kw: Token, s: Token) -> _Bool:
        return _string_test(node, s, "NOT CONTAINS", lambda v, x: x in v, True)

    def startswith(self, node: Any, _kw: Token, s: Token) -> _Bool:
        return _string_test(node, s, "STARTSWITH", str.startswith, False)

    def not_startswith(self, node: Any, _n: Token, _kw: Token, s: Token) -> _Bool:
        return _string_test(node, s, "NOT STARTSWITH", str.startswith, True)

    def endswith(self, node: Any, _kw: Token, s: Token) -> _Bool:
        return _string_test(node, s, "ENDSWITH", str.endswith, False)

    def not_endswith(self, node: Any, _n: Token, _kw: Token, s: Token) -> _Bool:
        return _string_test(node, s, "NOT ENDSWITH", str.endswith, True)

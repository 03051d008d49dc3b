"""The ``SQL92`` expression type: RocketMQ's message selector over message properties.

The grammar follows RocketMQ's ``SelectorParser.jj`` (itself ActiveMQ's JMS selector without LIKE
and arithmetic): ``AND`` / ``OR`` / ``NOT``, ``=``, ``<>``, ``>``, ``>=``, ``<``, ``<=``,
``[NOT] BETWEEN x AND y``, ``[NOT] IN ('a', 'b')``, ``IS [NOT] NULL``, ``[NOT] CONTAINS``,
``[NOT] STARTSWITH``, ``[NOT] ENDSWITH`` (string literal on the right), ``TRUE`` / ``FALSE``,
string literals in single quotes (``''`` escapes a quote), long and double literals.  Keywords are
case-insensitive, property names are not; ``TAGS`` is a property like any other.

Evaluation keeps RocketMQ's three-valued logic: a comparison with a missing property is *null*,
``NOT null`` is null, ``null AND false`` is false, ``null OR true`` is true, and a message matches
only when the whole expression is exactly true.  Property values are strings; compared with a
numeric literal they are converted (``Long.valueOf`` for a long literal, ``Double.valueOf`` for a
double) and a value that does not convert makes the evaluation fail, which RocketMQ treats as
"does not match" for the whole expression.  Ordering two strings converts both to double.

Each expression is parsed once by a lark LALR parser and compiled into nested closures, so
matching a message runs no tree walk and no parser.  The closures are built while parsing (lark's
inline transformer: no tree, no recursion), ``AND`` / ``OR`` chains become one n-ary closure, and
:class:`Sql92Limits` bounds the size and the nesting depth, so compiling never stalls the caller
and evaluating never nears Python's recursion limit.  Every failure is an :class:`ExpressionError`
(a :class:`ValueError`) with a one-line message.

This module holds the grammar, the parser, the limits and the public API; the compiler (lark's
transformer) and the closures it builds, which give an expression its meaning, are in
:mod:`.sql92_eval`.  lark, the compiler and the parser's tables are loaded at the first expression
compiled (:func:`_parser`), not with the plugin: every broker builds this factory, few ever see a
SQL92 subscription, and they hold ~3 MB of its anonymous memory (docs/operations.md, "Memory").
"""

from __future__ import annotations

import itertools
import logging
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from tidemq.errors import TidemqError

if TYPE_CHECKING:
    from lark import Lark
    from lark.exceptions import UnexpectedInput

log = logging.getLogger(__name__)

#: What a sub-expression evaluates to: True / False / None (SQL null), or a value (str, int, float).
Fn = Callable[[Mapping[str, str]], Any]


class EvaluationError(TidemqError):
    """A comparison RocketMQ cannot make (a non-numeric string against a number): no match."""


__all__ = [
    "DEFAULT_LIMITS",
    "GRAMMAR",
    "EvaluationError",
    "ExpressionError",
    "Fn",
    "Sql92FilterFactory",
    "Sql92Limits",
    "SqlFilter",
    "compile_expression",
]

GRAMMAR = r"""
start: or_expr

?or_expr: and_expr
        | or_expr OR and_expr                         -> or_

?and_expr: eq_expr
         | and_expr AND eq_expr                       -> and_

?eq_expr: cmp_expr
        | eq_expr "=" cmp_expr                        -> eq
        | eq_expr "<>" cmp_expr                       -> ne
        | eq_expr IS NULL                             -> is_null
        | eq_expr IS NOT NULL                         -> is_not_null

?cmp_expr: unary
         | cmp_expr ">" unary                         -> gt
         | cmp_expr ">=" unary                        -> ge
         | cmp_expr "<" unary                         -> lt
         | cmp_expr "<=" unary                        -> le
         | cmp_expr BETWEEN unary AND unary           -> between
         | cmp_expr NOT BETWEEN unary AND unary       -> not_between
         | cmp_expr IN "(" string_list ")"            -> in_
         | cmp_expr NOT IN "(" string_list ")"        -> not_in
         | cmp_expr CONTAINS STRING                   -> contains
         | cmp_expr NOT CONTAINS STRING               -> not_contains
         | cmp_expr STARTSWITH STRING                 -> startswith
         | cmp_expr NOT STARTSWITH STRING             -> not_startswith
         | cmp_expr ENDSWITH STRING                   -> endswith
         | cmp_expr NOT ENDSWITH STRING               -> not_endswith

?unary: "+" unary                                     -> pos
      | "-" unary                                     -> neg
      | NOT unary                                     -> not_
      | primary

?primary: STRING                                      -> string
        | DECIMAL                                     -> decimal
        | FLOAT                                       -> float_
        | TRUE                                        -> true
        | FALSE                                       -> false
        | NULL                                        -> null
        | ID                                          -> var
        | "(" or_expr ")"

string_list: STRING ("," STRING)*

NOT: "NOT"i
AND: "AND"i
OR: "OR"i
BETWEEN: "BETWEEN"i
IN: "IN"i
TRUE: "TRUE"i
FALSE: "FALSE"i
NULL: "NULL"i
IS: "IS"i
CONTAINS: "CONTAINS"i
STARTSWITH: "STARTSWITH"i
ENDSWITH: "ENDSWITH"i

FLOAT.2: /([0-9]+\.[0-9]*|\.[0-9]+)(E[+-]?[0-9]+)?/i | /[0-9]+E[+-]?[0-9]+/i
DECIMAL: /(0|[1-9][0-9]*)L?/i
STRING: /'([^']|'')*'/
ID: /[a-z_$][a-z0-9_$]*/i

LINE_COMMENT: /--[^\n\r]*/
BLOCK_COMMENT: /\/\*(.|\n)*?\*\//
%import common.WS
%ignore WS
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
"""

_TERMINAL_NAMES = {
    "LPAR": "'('",
    "RPAR": "')'",
    "EQUAL": "'='",
    "MORETHAN": "'>'",
    "LESSTHAN": "'<'",
    "COMMA": "','",
    "PLUS": "'+'",
    "MINUS": "'-'",
    "$END": "end of expression",
    "STRING": "a string literal",
    "DECIMAL": "a number",
    "FLOAT": "a number",
    "ID": "a property name",
}


class ExpressionError(TidemqError, ValueError):
    """An expression that does not compile (syntax, types, or over a :class:`Sql92Limits` bound).

    A :class:`ValueError` too: filter factories report invalid expressions that way (see
    :class:`tidemq.filter.FilterFactory`), and the broker answers SUBSCRIPTION_PARSE_FAILED.
    """


def _in_range(name: str, low: int, high: int) -> Callable[[Any, Any, int], None]:
    def check(_inst: Any, _attr: Any, value: int) -> None:
        if not low <= value <= high:
            raise ValueError(f"{name} = {value} must be within {low}..{high}")

    return check


@attrs.frozen
class Sql92Limits:
    """Bounds on one expression, checked before (size) and while (depth) it is compiled.

    Measured on this project's 2-core machine (best of 20): lark costs 15-20 us per token, an IN
    list ~15 us per value (string and comma).  Commas are not counted and string literals count
    half, so the default 200 tokens admit ~50 ``a = 1`` terms (4 ms) or an IN list of ~390 values
    (6 ms); nothing accepted takes much more.  Depth counts nested operators (parentheses alone add
    nothing); evaluating costs about one Python frame per level, so 200 stays far below the
    recursion limit wherever the store evaluates.
    """

    #: characters, checked first (refusing a megabyte costs nothing)
    max_length: int = attrs.field(default=16384, validator=_in_range("max_length", 16, 1 << 20))
    #: lexical tokens, commas not counted and string literals counting half
    max_tokens: int = attrs.field(default=200, validator=_in_range("max_tokens", 8, 10_000))
    #: nested operators: NOT, unary minus, comparisons, AND / OR chains
    max_depth: int = attrs.field(default=64, validator=_in_range("max_depth", 4, 200))


DEFAULT_LIMITS = Sql92Limits()


def _expected(names: set[str] | frozenset[str]) -> str:
    shown = sorted({_TERMINAL_NAMES.get(n, n) for n in names if not n.startswith("__")})
    return ", ".join(shown[:12]) + (", ..." if len(shown) > 12 else "")


def _shown(expression: str) -> str:
    """The expression as error messages quote it: one line, at most ~100 characters."""
    text = repr(expression[:100])
    return text + f" (+{len(expression) - 100} characters)" if len(expression) > 100 else text


def _syntax_message(expression: str, exc: UnexpectedInput) -> str:
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken

    col = getattr(exc, "column", None)
    if isinstance(exc, UnexpectedEOF) or (isinstance(exc, UnexpectedToken) and exc.token.type == "$END"):
        where = "at the end of the expression"
        found = ""
    else:
        where = f"at column {col}" if col not in (None, -1) else "in the expression"
        if isinstance(exc, UnexpectedToken):
            found = f": unexpected {str(exc.token)[:40]!r}"
        elif isinstance(exc, UnexpectedCharacters):
            found = f": unexpected character {exc.char!r}"
        else:
            found = ""
    expected = getattr(exc, "expected", None) or getattr(exc, "allowed", None) or set()
    tail = f"; expected {_expected(expected)}" if expected else ""
    return f"invalid SQL92 expression {_shown(expression)} {where}{found}{tail}"


# The basic lexer keeps keywords reserved everywhere, as JavaCC does (a contextual lexer would
# read `a > AND` as a property named AND).  The compiler runs as lark's inline transformer: the
# closures are built at each reduction, with no parse tree and no recursive tree walk.
_PARSER: Lark | None = None


def _parser() -> Lark:
    """The parser, made (lark and the compiler imported) at the first expression: that one compile
    takes ~0.1 s more (the LALR tables: 126 ms at load 16 on 2 cores), once per process."""
    global _PARSER
    if _PARSER is None:
        from lark import Lark

        from .sql92_eval import Compiler

        _PARSER = Lark(
            GRAMMAR, parser="lalr", lexer="basic", maybe_placeholders=False, transformer=Compiler()
        )
    return _PARSER


# An upper bound of lark's tokens, counted without lark (10-30x cheaper): string literals (even
# unterminated), comments, words and numbers, two-character operators, then any other character.
# Commas are left out: they only parse inside IN lists, one per string literal.
_TOKEN_SCAN = re.compile(r"'(?:[^']|'')*'?|--[^\n\r]*|/\*.*?(?:\*/|\Z)|[A-Za-z0-9_$.]+|<>|>=|<=|[^\s,]", re.S)


def _check_size(expression: str, limits: Sql92Limits) -> None:
    if len(expression) > limits.max_length:
        raise ExpressionError(
            f"SQL92 expression is too long: {len(expression)} characters, longer than "
            f"{limits.max_length} characters"
        )
    # A string literal costs lark about half what an operator does (no reduction follows it in an
    # IN list), so it counts half: IN lists of some hundreds fit where 400 operators would not.
    budget = 2 * limits.max_tokens
    for m in itertools.islice(_TOKEN_SCAN.finditer(expression), budget + 1):
        budget -= 1 if expression[m.start()] == "'" else 2
        if budget < 0:
            break
    if budget < 0:
        raise ExpressionError(
            f"SQL92 expression is too long: more than {limits.max_tokens} tokens ({_shown(expression)})"
        )


def compile_expression(expression: str, limits: Sql92Limits = DEFAULT_LIMITS) -> Fn:
    """Parse and compile ``expression``; :class:`ExpressionError` (one line) when it is invalid."""
    if expression is None or not expression.strip():
        raise ExpressionError("SQL92 expression is empty")
    _check_size(expression, limits)
    parser = _parser()
    from lark.exceptions import UnexpectedInput  # loaded with the parser

    try:
        root = parser.parse(expression)
    except UnexpectedInput as exc:
        raise ExpressionError(_syntax_message(expression, exc)) from None
    except (ValueError, EvaluationError) as exc:  # a check of the compiler (types, BETWEEN bounds...)
        raise ExpressionError(f"invalid SQL92 expression {_shown(expression)}: {exc}") from None
    except Exception as exc:  # never expected within the limits (RecursionError, a lark error...)
        log.warning("SQL92 expression %s failed to compile: %r", _shown(expression), exc)
        raise ExpressionError(
            f"invalid SQL92 expression {_shown(expression)}: {type(exc).__name__}"
        ) from None
    if root.depth > limits.max_depth:  # type: ignore[attr-defined]  # the inline transformer's node
        raise ExpressionError(
            f"SQL92 expression {_shown(expression)} is nested deeper than {limits.max_depth} levels"
        )
    return root.fn  # type: ignore[attr-defined]


class SqlFilter:
    """A compiled SQL92 subscription (a :class:`tidemq.filter.MessageFilter`)."""

    __slots__ = ("expression", "_fn", "_precheck", "__weakref__")

    def __init__(self, expression: str, fn: Fn, precheck: Any = None):
        self.expression = expression
        self._fn = fn
        self._precheck = precheck

    def evaluate(self, properties: Mapping[str, str]) -> bool:
        """True only when the expression is exactly true (null and failed conversions are no match)."""
        try:
            return self._fn(properties) is True
        except EvaluationError:
            return False
        except (TypeError, ValueError, OverflowError):
            log.debug("SQL92 %r failed on %r", self.expression, properties, exc_info=True)
            return False

    def matches_tags_code(self, tags_code: int) -> bool:
        return True  # SQL92 decides on properties; the tag code alone never excludes

    def matches_message(self, properties: Mapping[str, str]) -> bool:
        return self.evaluate(properties)

    def matches_queue_entry(self, topic: str, queue_id: int, queue_offset: int) -> bool:
        """The bit-map pre-check (see :mod:`.bitmap`): ``False`` only when the entry surely fails."""
        pre = self._precheck
        if pre is None:
            return True
        return pre.maybe_matches(self, topic, queue_id, queue_offset)

    def __repr__(self) -> str:
        return f"SqlFilter({self.expression!r})"


class Sql92FilterFactory:
    """Compiles SQL92 expressions (a :class:`tidemq.filter.FilterFactory`).

    With a :class:`~.bitmap.FilterBitMap` (the broker's store dispatches to it), compiled filters
    answer :meth:`SqlFilter.matches_queue_entry` from the bits written at dispatch time.
    """

    def __init__(self, precheck: Any = None, limits: Sql92Limits = DEFAULT_LIMITS):
        self.precheck = precheck
        self.limits = limits

    def dispatchers(self) -> tuple[Any, ...]:
        """The bit map the broker attaches to its store (a DispatchingFilterFactory)."""
        return (self.precheck,) if self.precheck is not None else ()

    def close(self) -> None:
        """Stop the pre-check's worker thread (the broker calls this when it stops)."""
        if self.precheck is not None:
            self.precheck.close()

    def compile(self, expression: str) -> SqlFilter:
        expression = (expression or "").strip()
        return SqlFilter(expression, compile_expression(expression, self.limits), self.precheck)

"""The SQL92 expression type: RocketMQ's selector grammar, null semantics and error messages."""

from __future__ import annotations

import pytest

from tidemq.filter import FilterFactory, MessageFilter
from tidemq.plugins import get_plugin_manager
from tidemq.store import DispatchRequest
from tidemq_filter_server.bitmap import FilterBitMap
from tidemq_filter_server.sql92 import Sql92FilterFactory


@pytest.fixture(scope="module")
def factory() -> FilterFactory:
    f = get_plugin_manager().create("filter", "SQL92")
    assert isinstance(f, FilterFactory)
    return f


P = {"a": "3", "b": "x", "f": "2.5", "TAGS": "TagA", "s": "hello world", "t": "true", "neg": "-7"}
EMPTY: dict[str, str] = {}

# expression, properties, expected truth
TRUTH_TABLE: list[tuple[str, dict[str, str], bool]] = [
    # numeric comparisons: string properties convert to the literal's type
    ("a = 3", P, True),
    ("a = 3.0", P, True),
    ("a <> 3", P, False),
    ("a <> 4", P, True),
    ("a > 2", P, True),
    ("a > 3", P, False),
    ("a >= 3", P, True),
    ("a < 3.5", P, True),
    ("a <= 2", P, False),
    ("f > 2", P, False),  # '2.5' does not convert with Long.valueOf: the evaluation fails
    ("f > 2.0", P, True),
    ("f < 3.0E0", P, True),
    ("neg < -5", P, True),
    ("neg = -7L", P, True),
    ("-a = -3", P, True),
    ("a > 1 AND f > .5", P, True),
    # strings
    ("b = 'x'", P, True),
    ("b = 'X'", P, False),
    ("b <> 'y'", P, True),
    ("s = 'hello world'", P, True),
    ("q = 'it''s'", {"q": "it's"}, True),
    ("b = 3", P, False),  # 'x' is no long: no match (RocketMQ fails the whole evaluation)
    ("b = 3 OR a = 3", P, False),
    ("a > b", {"a": "2", "b": "1"}, True),  # two strings ordered as doubles
    # BETWEEN / NOT BETWEEN
    ("a BETWEEN 1 AND 3", P, True),
    ("a BETWEEN 4 AND 9", P, False),
    ("a NOT BETWEEN 4 AND 9", P, True),
    ("a NOT BETWEEN 1 AND 3", P, False),
    ("f between 2.0 and 2.5", P, True),
    # IN / NOT IN
    ("TAGS IN ('TagA', 'TagB')", P, True),
    ("TAGS IN ('TagB')", P, False),
    ("TAGS NOT IN ('TagB', 'TagC')", P, True),
    ("a IN ('3')", P, True),
    # IS NULL / IS NOT NULL
    ("zz IS NULL", P, True),
    ("a IS NULL", P, False),
    ("a IS NOT NULL", P, True),
    ("zz IS NOT NULL", P, False),
    ("b IS NOT NULL AND b = 'x'", P, True),
    # a missing property makes every comparison null, and null never matches
    ("zz = 1", P, False),
    ("zz <> 1", P, False),
    ("zz > 1", P, False),
    ("zz BETWEEN 1 AND 2", P, False),
    ("zz NOT BETWEEN 1 AND 2", P, False),
    ("zz IN ('a')", P, False),
    ("zz NOT IN ('a')", P, False),
    ("NOT (zz = 1)", P, False),
    ("NOT zz = 1", P, False),
    # three-valued AND / OR
    ("zz = 1 OR a = 3", P, True),
    ("zz = 1 AND a = 3", P, False),
    ("NOT (zz = 1 AND a = 4)", P, True),  # null AND false = false
    ("NOT (zz = 1 OR a = 4)", P, False),  # null OR false = null
    ("NOT (zz = 1 AND a = 3)", P, False),  # null AND true = null
    # boolean literals and properties
    ("TRUE", EMPTY, True),
    ("FALSE", EMPTY, False),
    ("NOT FALSE", EMPTY, True),
    ("true AND NOT false", EMPTY, True),
    ("t = TRUE", P, True),
    ("b = TRUE", P, False),
    # precedence: NOT > comparison > AND > OR, parentheses
    ("a = 3 OR b = 'y' AND TAGS = 'TagB'", P, True),
    ("(a = 3 OR b = 'y') AND TAGS = 'TagB'", P, False),
    ("NOT (a = 4) AND b = 'x'", P, True),
    # RocketMQ's NOT is unary and binds tighter than '=': (NOT a) = 4 compares a boolean with 4
    ("NOT a = 4 AND b = 'x'", P, False),
    # keywords are case-insensitive, names that start with keywords are properties
    ("a between 1 and 3 and b in ('x') or false", P, True),
    ("ANDROID = 'yes' AND notable IS NULL", {"ANDROID": "yes"}, True),
    ("INSIDE = 1", {"INSIDE": "1"}, True),
    # string tests (RocketMQ 4.9's CONTAINS; STARTSWITH / ENDSWITH)
    ("s CONTAINS 'lo wo'", P, True),
    ("s NOT CONTAINS 'xyz'", P, True),
    ("s STARTSWITH 'hell'", P, True),
    ("s NOT STARTSWITH 'hell'", P, False),
    ("s ENDSWITH 'world'", P, True),
    ("s NOT ENDSWITH 'world'", P, False),
    ("zz CONTAINS 'a'", P, False),
    ("zz NOT CONTAINS 'a'", P, False),
    # comments and whitespace
    ("a = 3 -- trailing comment\n", P, True),
    ("a /* inline */ = 3", P, True),
    # TAGS is a property: the typical RocketMQ example
    ("(TAGS is not null and TAGS in ('TagA', 'TagB')) and (a is not null and a between 0 and 3)", P, True),
]


@pytest.mark.parametrize(("expression", "properties", "expected"), TRUTH_TABLE)
def test_truth_table(
    factory: FilterFactory, expression: str, properties: dict[str, str], expected: bool
) -> None:
    flt = factory.compile(expression)
    assert isinstance(flt, MessageFilter)
    assert flt.matches_message(properties) is expected
    assert flt.matches_tags_code(12345)  # SQL92 never excludes by tag code alone


INVALID: list[tuple[str, str]] = [
    ("", "empty"),
    ("   ", "empty"),
    ("a >", "at the end of the expression; expected"),
    ("a = 1 AND", "at the end of the expression"),
    ("(a = 1", "expected ')'"),
    ("a = 1)", "column 6: unexpected ')'"),
    ("a @ 1", "column 3: unexpected character '@'"),
    ("a == 1", "column 4: unexpected '='"),
    ('a = "x"', "unexpected character '\"'"),
    ("a = 'unterminated", "unexpected character"),
    ("a > 'x'", "'x' cannot be compared with '>'"),
    ("a BETWEEN 'a' AND 'b'", "cannot be compared"),
    ("a BETWEEN 3 AND 1", "low bound of BETWEEN (3) must be less than or equal"),
    ("a = NULL", "use IS NULL"),
    ("a IN (1, 2)", "expected a string literal"),
    ("'x' IN ('x')", "expected a property name before IN"),
    ("3", "will not result in a boolean value"),
    ("TRUE = 1", "cannot be compared"),
    ("a > TRUE", "cannot be compared"),
    ("a LIKE 'x%'", "unexpected 'LIKE'"),
]


@pytest.mark.parametrize(("expression", "message"), INVALID)
def test_invalid_expressions_give_one_line_errors(
    factory: FilterFactory, expression: str, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        factory.compile(expression)
    text = str(info.value)
    assert message in text
    assert "\n" not in text


def test_sql92_is_registered_next_to_tag() -> None:
    filters = get_plugin_manager().available("filter")
    assert {"TAG", "SQL92"} <= set(filters)
    assert filters["SQL92"].distribution == "tidemq"


def _request(topic: str, qid: int, offset: int, props: dict[str, str], sys_flag: int = 0) -> DispatchRequest:
    return DispatchRequest(topic, qid, offset * 100, 100, 0, 0, offset, sys_flag=sys_flag, properties=props)


def test_bit_map_skips_only_entries_the_filter_rules_out() -> None:
    bitmap = FilterBitMap()
    factory = Sql92FilterFactory(bitmap)
    flt = factory.compile("a > 5")
    other = factory.compile("b = 'x'")
    # Entries dispatched before the filter registered are unknown: always "maybe".
    bitmap.dispatch(_request("T", 0, 0, {"a": "1"}))
    assert flt.matches_queue_entry("T", 0, 0)  # registers the filter for topic T
    assert other.matches_queue_entry("T", 0, 0)
    for off, props in enumerate([{"a": "9"}, {"a": "2"}, {"b": "x"}, {"a": "7", "b": "x"}], start=1):
        bitmap.dispatch(_request("T", 0, off, props))
    seen = [flt.matches_queue_entry("T", 0, off) for off in range(5)]
    assert seen == [True, True, False, False, True]
    assert [other.matches_queue_entry("T", 0, off) for off in range(1, 5)] == [False, False, True, True]
    # Unknown queues, topics and offsets past the bits are "maybe", never a skip.
    assert flt.matches_queue_entry("T", 1, 0) and flt.matches_queue_entry("U", 0, 3)
    assert flt.matches_queue_entry("T", 0, 99)
    # A prepared transaction message never reaches a queue: it gets no word.
    bitmap.dispatch(_request("T", 0, 5, {"a": "1"}, sys_flag=0x4))
    assert flt.matches_queue_entry("T", 0, 5)
    assert bitmap.skipped >= 4


def test_bit_map_gap_forgets_older_words() -> None:
    bitmap = FilterBitMap()
    flt = Sql92FilterFactory(bitmap).compile("a = 1")
    flt.matches_queue_entry("T", 0, 0)
    bitmap.dispatch(_request("T", 0, 0, {"a": "2"}))
    assert not flt.matches_queue_entry("T", 0, 0)
    bitmap.dispatch(_request("T", 0, 10, {"a": "2"}))  # e.g. a restart recovered from offset 10
    assert flt.matches_queue_entry("T", 0, 0)
    assert not flt.matches_queue_entry("T", 0, 10)


def test_bit_map_options_are_checked() -> None:
    with pytest.raises(ValueError, match="bloom bits"):
        FilterBitMap(bits=128)

"""The TAG expression type registered by the filter_server plugin."""

from __future__ import annotations

import pytest

from tidemq.filter import FilterFactory, MessageFilter
from tidemq.message import java_string_hash
from tidemq.plugins import get_plugin_manager


@pytest.fixture
def factory() -> FilterFactory:
    f = get_plugin_manager().create("filter", "TAG")
    assert isinstance(f, FilterFactory)
    return f


def test_star_and_blank_match_everything(factory: FilterFactory) -> None:
    for expression in ("*", "", "  * "):
        flt = factory.compile(expression)
        assert isinstance(flt, MessageFilter)
        assert flt.matches_tags_code(0) and flt.matches_tags_code(12345)
        assert flt.matches_message({}) and flt.matches_message({"TAGS": "x"})


def test_tags_match_by_code_then_exact_tag(factory: FilterFactory) -> None:
    flt = factory.compile(" TagA || TagB ||")
    assert flt.matches_tags_code(java_string_hash("TagA")) and flt.matches_tags_code(java_string_hash("TagB"))
    assert not flt.matches_tags_code(java_string_hash("TagC")) and not flt.matches_tags_code(0)
    # "Aa" and "BB" share a Java hash code: the ConsumeQueue pass keeps both, the exact pass decides.
    collide = factory.compile("Aa")
    assert java_string_hash("Aa") == java_string_hash("BB") and collide.matches_tags_code(
        java_string_hash("BB")
    )
    assert collide.matches_message({"TAGS": "Aa"}) and not collide.matches_message({"TAGS": "BB"})
    assert not flt.matches_message({}) and not flt.matches_message({"TAGS": "TagA || TagB"})


def test_an_expression_without_tags_is_refused(factory: FilterFactory) -> None:
    with pytest.raises(ValueError, match="names no tag"):
        factory.compile("|| ||")

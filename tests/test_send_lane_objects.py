"""The send lane's objects (issue 38): the ``Send`` and ``MessageInner`` objects the compiled
prepare step builds slot by slot, without the classes' ``__init__``, are what the classes make
of the Python handler's reading of the same request: every slot of the same type and value,
properties in the same order (the record stores them in it).

``tests/fuzz/fuzz_send_lane.py`` checks each send it serves so (``same_objects``); here its
checks run over hypothesis' property texts and headers, and the class probe that decides whether
a ``Send`` can be built without its ``__init__`` is tested on classes it must refuse.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.broker.services.put import Send
from tidemq.message import BatchItem, encode_batch, properties_to_string
from tidemq.remoting import RemotingCommand
from tidemq.remoting.codes import RequestCode
from tidemq_store_mmap.lane import compiled_send_lane

lane_module = pytest.importorskip("tidemq._native._send_lane")
if compiled_send_lane() is None:  # TIDEMQ_NO_EXTENSIONS=1: every send is the Python handler's
    pytest.skip("the compiled send lane is switched off", allow_module_level=True)

_spec = importlib.util.spec_from_file_location(
    "fuzz_send_lane", Path(__file__).parent / "fuzz" / "fuzz_send_lane.py"
)
assert _spec is not None and _spec.loader is not None
fuzz = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fuzz)


def test_the_lane_builds_sends_and_messages_without_their_init() -> None:
    assert lane_module.uses_direct_objects() == {"Send": True, "MessageInner": True}
    recipe = dict(lane_module.send_recipe(Send))
    assert set(recipe) == set(Send.__slots__)
    assert recipe["producer_group"] == ("arg", 0) and recipe["nbytes"] == ("arg", 5)
    assert recipe["status"] == ("unset",)  # set when settled, never before


class _FreshList:
    __slots__ = ("a", "b")

    def __init__(self, a: Any, *rest: Any) -> None:
        self.a = a
        self.b: list[Any] = []  # a new object per instance: only __init__ can make it


class _WithDict:
    def __init__(self, *args: Any) -> None:
        self.args = args


class _Computed:
    __slots__ = ("a",)

    def __init__(self, *args: Any) -> None:
        self.a = id(args)  # a value of its own each call


class _Plain:
    __slots__ = ("a", "b", "c")

    def __init__(self, a: Any, b: Any, *rest: Any) -> None:
        self.a = b
        self.b = 7


@pytest.mark.parametrize("cls", [_FreshList, _WithDict, _Computed])
def test_a_class_whose_init_does_more_than_store_is_called(cls: type) -> None:
    assert lane_module.send_recipe(cls) is None


def test_a_plain_slotted_class_is_read_as_stores() -> None:
    assert lane_module.send_recipe(_Plain) == [
        ("a", ("arg", 1)),
        ("b", ("const", 7)),
        ("c", ("unset",)),
    ]


PARTS = st.sampled_from(
    [
        "\x01",
        "\x02",
        "TAGS",
        "UNIQ_KEY",
        "KEYS",
        "CLUSTER",
        "DELAY",
        "TIMER_OUT_MS",
        "T",
        "D",
        "a",
        "é",
        "日",
        "\x00",
    ]
)
TEXTS = st.one_of(
    st.lists(PARTS, max_size=14).map("".join),
    st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=5).map(properties_to_string),
    st.text(max_size=20),
)


def _header(text: str | None, **more: str) -> dict[str, str]:
    header = {
        "a": "PG",
        "b": "LaneTopic",
        "c": "TBW102",
        "d": "4",
        "e": "1",
        "f": "0",
        "g": "1700000000000",
        "h": "3",
        "j": "2",
        "k": "false",
        "m": "false",
    }
    if text is not None:
        header["i"] = text
    header.update(more)
    return header


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.one_of(TEXTS, st.none()), min_size=1, max_size=4), st.binary(max_size=20))
def test_single_sends_carry_the_handlers_properties_in_its_order(
    texts: list[str | None], body: bytes
) -> None:
    run = [
        RemotingCommand(RequestCode.SEND_MESSAGE_V2, opaque=1, ext_fields=_header(t), body=body)
        for t in texts
    ]
    stats = {"served": 0, "refused": 0, "refused_though_plain": 0}
    fuzz.check(lane_module, run, stats)  # raises on any difference
    plain = [fuzz.reference(r, "DefaultCluster", ("10.0.0.1", 4000), ("127.0.0.1", 10911)) for r in run]
    if all(type(p) is tuple for p in plain):  # no rewritten property: the lane serves the run
        assert stats["served"] == 1


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    st.lists(
        st.dictionaries(
            st.sampled_from(["TAGS", "UNIQ_KEY", "KEYS", "N", "é"]), st.text(max_size=5), max_size=3
        ),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(["0", "2", "3"]),
)
def test_batched_sends_are_the_classes_objects(props: list[dict[str, str]], queue: str) -> None:
    body = encode_batch([BatchItem(b"m%d" % i, i, p) for i, p in enumerate(props)])
    run = [
        RemotingCommand(RequestCode.SEND_BATCH_MESSAGE, opaque=1, ext_fields=_header("", e=queue), body=body)
    ]
    stats = {"served": 0, "refused": 0, "refused_though_plain": 0}
    fuzz.check(lane_module, run, stats)
    assert stats["served"] == 1

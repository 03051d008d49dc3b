"""TAG-filtered pulls on the mmap store: one pass per record, and what a colliding tag gets.

RocketMQ's broker filters a TAG subscription on the ConsumeQueue entry's tag code only and leaves
hash collisions to the client, which compares the tag string.  tidemq's broker also compares the
stored TAGS, so a tag whose Java hash equals a subscribed tag's ("BB" for "Aa") is never served;
the client's own check would drop it too.  The mmap store does the TAG filtering inside its pull
walk (compiled when built): the same records as the careful per-entry loop, without asking the
filter, or decoding a record, per entry.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from tidemq import _native
from tidemq.client.subscription import Subscription
from tidemq.filter import MessageFilter, tag_selection
from tidemq.message import MessageInner, iter_messages, java_string_hash
from tidemq.testing.store_contract import build_store
from tidemq_filter_server.tag import TagFilterFactory

TOPIC = "TagPull"
# "Aa" and "BB" have the same Java hash; "é" and "\u00e9x" are not ASCII; None: no TAGS property.
TAGS = ["Aa", "BB", "C", None, "é", "Aa", "BB", "C", "éx", "Aa"]


class CarefulOnly:
    """The same subscription without :class:`tidemq.SelectsByTag`: the store's per-entry loop."""

    def __init__(self, inner: MessageFilter) -> None:
        self.inner = inner

    def matches_tags_code(self, tags_code: int) -> bool:
        return self.inner.matches_tags_code(tags_code)

    def matches_message(self, properties: Mapping[str, str]) -> bool:
        return self.inner.matches_message(properties)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Any]:
    s = build_store("mmap", tmp_path, flush="async", store_options={"check_crc_on_read": True})
    assert s.load()
    s.start()
    futures = []
    for i in range(200):
        tag = TAGS[i % len(TAGS)]
        props = {"KEYS": f"k{i}"} if tag is None else {"TAGS": tag, "KEYS": f"k{i}"}
        futures.append(
            s.put_message(MessageInner(topic=TOPIC, body=b"b%d" % i, queue_id=0, properties=props))
        )
    for f in futures:
        f.result(30)
    yield s
    s.shutdown()


def pull_all(store: Any, flt: MessageFilter | None, max_count: int) -> list[tuple]:
    out, offset = [], 0
    while offset < store.get_max_offset_in_queue(TOPIC, 0):
        r = store.get_message("CG", TOPIC, 0, offset, max_count, flt)
        out.append(
            (
                r.status,
                r.next_begin_offset,
                r.queue_offsets,
                b"".join(r.buffers),
                b"".join(r.wire),
                r.message_count,
            )
        )
        assert r.next_begin_offset > offset
        offset = r.next_begin_offset
    return out


@pytest.mark.parametrize("expression", ["Aa", "BB", "Aa||C", "é||éx", "C||nothing", "Aa||BB"])
@pytest.mark.parametrize("max_count", [1, 3, 32])
def test_the_walk_serves_what_the_careful_loop_serves(store: Any, expression: str, max_count: int) -> None:
    flt = TagFilterFactory().compile(expression)
    assert tag_selection(flt) is not None and tag_selection(CarefulOnly(flt)) is None
    assert pull_all(store, flt, max_count) == pull_all(store, CarefulOnly(flt), max_count)


def test_a_colliding_tag_is_not_served_and_the_client_would_drop_it(store: Any) -> None:
    assert java_string_hash("Aa") == java_string_hash("BB")
    flt = TagFilterFactory().compile("Aa")
    served = [m for *_, body, _wire, _n in pull_all(store, flt, 32) for m in iter_messages(body)]
    assert [m.tags for m in served] == ["Aa"] * 60
    assert [m.queue_offset % len(TAGS) for m in served] == [0, 5, 9] * 20
    # What RocketMQ's broker would have sent (the code matches), its client drops by the tag string.
    client = Subscription.build(TOPIC, "Aa")
    colliding = [
        m for _, _, _, body, _, _ in pull_all(store, None, 32) for m in iter_messages(body) if m.tags == "BB"
    ]
    assert len(colliding) == 40 and not any(client.accepts(m) for m in colliding)
    assert all(client.accepts(m) for m in served)


def test_a_tag_pull_asks_the_filter_nothing_per_record(store: Any) -> None:
    """With the compiled walk, a TAG pull runs no Python per record: a fixed number of Python
    calls, whatever the batch (the careful loop asks the filter about every entry)."""
    if not _native.ACTIVE:
        pytest.skip("the compiled codec is not in use (TIDEMQ_NO_EXTENSIONS=1 or not built)")
    flt = TagFilterFactory().compile("Aa||BB||C")

    def calls(f: MessageFilter, max_count: int) -> int:
        count = 0

        def profile(frame: FrameType, event: str, arg: object) -> None:
            nonlocal count
            if event == "call":
                count += 1

        sys.setprofile(profile)
        try:
            r = store.get_message("CG", TOPIC, 0, 0, max_count, f)
        finally:
            sys.setprofile(None)
        assert r.message_count == max_count
        return count

    calls(flt, 4)  # first use: caches
    assert calls(flt, 64) == calls(flt, 4)
    assert calls(CarefulOnly(flt), 64) > calls(CarefulOnly(flt), 4) + 2 * 60

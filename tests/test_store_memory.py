"""What the memory store adds to the contract: a memory bound that ages messages out."""

from __future__ import annotations

from pathlib import Path

from tidemq.message import decode_message
from tidemq.store import GetStatus
from tidemq.testing.store_contract import build_store, message


def test_memory_bound_drops_the_oldest_and_reports_offset_too_small(tmp_path: Path) -> None:
    store = build_store("memory", tmp_path, store_options={"max_bytes": 10_000})
    assert store.load()
    store.start()
    try:
        results = [store.put_message(message(body=b"%03d" % i + bytes(500))).result(10) for i in range(40)]
        assert all(r.ok for r in results)
        low = store.get_min_offset_in_queue("TopicA", 0)
        assert 0 < low < 40 and store.get_max_offset_in_queue("TopicA", 0) == 40
        assert (40 - low) * results[0].wrote_bytes <= 10_000
        got = store.get_message("g", "TopicA", 0, 0, 32)
        assert got.status is GetStatus.OFFSET_TOO_SMALL and got.next_begin_offset == low
        got = store.get_message("g", "TopicA", 0, low, 1)
        assert decode_message(got.buffers[0]).body[:3] == b"%03d" % low
        assert store.get_min_phy_offset() == results[low].wrote_offset
        assert store.look_message_by_offset(results[0].wrote_offset) is None
    finally:
        store.shutdown()


def test_memory_store_starts_empty_every_time(tmp_path: Path) -> None:
    store = build_store("memory", tmp_path)
    assert store.load()
    store.start()
    store.put_message(message()).result(10)
    store.shutdown()
    again = build_store("memory", tmp_path)
    assert again.load()
    again.start()
    try:
        assert again.topics() == {} and again.get_max_phy_offset() == 0
    finally:
        again.shutdown()

"""The store contract as a reusable pytest suite.

Every store plugin (built-in or third-party) runs the same tests.  Subclass
:class:`StoreContract` in a test module and provide a ``make_store`` fixture returning a factory
that builds a new store, not yet loaded::

    import pytest
    from tidemq.testing.store_contract import StoreContract, build_store

    @pytest.fixture
    def make_store(tmp_path):
        return lambda: build_store("mystore", tmp_path / "data")

    class TestMyStore(StoreContract):
        pass

The suite loads and starts the store itself and shuts it down after each test.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tidemq.message import (
    TRANSACTION_PREPARED_TYPE,
    MessageInner,
    Prop,
    decode_message,
    decode_message_id,
    tags_hash_code,
)
from tidemq.plugins import PluginManager, get_plugin_manager
from tidemq.store import DispatchRequest, GetStatus, MessageStore, PutResult, PutStatus


def build_store(
    name: str,
    data_dir: Path | str,
    *,
    flush: str = "sync",
    store_options: Mapping[str, Any] | None = None,
    flush_options: Mapping[str, Any] | None = None,
    index: Any | None = None,
    settings: Mapping[str, Any] | None = None,
    manager: PluginManager | None = None,
) -> MessageStore:
    """Build store ``name`` through the plugin manager (default: the process-wide one), the way
    the broker composes it."""
    pm = manager or get_plugin_manager()
    components: dict[str, Any] = {
        "flush": pm.create("flush", flush, options=flush_options, data_dir=data_dir)
    }
    if index is not None:
        components["index"] = index
    return pm.create(
        "store", name, options=store_options, data_dir=data_dir, components=components, settings=settings
    )


class TagFilter:
    """A minimal TAG-expression filter (``"a || b"``) implementing :class:`tidemq.filter.MessageFilter`."""

    def __init__(self, expression: str):
        self.tags = {t.strip() for t in expression.split("||") if t.strip()}
        self.codes = {tags_hash_code(t) for t in self.tags}

    def matches_tags_code(self, tags_code: int) -> bool:
        return "*" in self.tags or tags_code in self.codes

    def matches_message(self, properties: Mapping[str, str]) -> bool:
        return "*" in self.tags or properties.get(Prop.TAGS) in self.tags


def message(topic: str = "TopicA", body: bytes = b"hello", queue_id: int = 0, **props: str) -> MessageInner:
    return MessageInner(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties=dict(props),
        born_timestamp=int(time.time() * 1000),
        born_host=("10.0.0.7", 52000),
    )


def put(store: MessageStore, msg: MessageInner, timeout: float = 10) -> PutResult:
    return store.put_message(msg).result(timeout)


class StoreContract:
    """What every :class:`tidemq.store.MessageStore` must do; needs a ``make_store`` fixture."""

    @pytest.fixture
    def store(self, make_store: Callable[[], MessageStore]) -> Iterator[MessageStore]:
        s = make_store()
        assert s.load()
        s.start()
        try:
            yield s
        finally:
            s.shutdown()

    # ------------------------------------------------------------------ put / get
    def test_round_trip_keeps_every_field(self, store: MessageStore) -> None:
        msg = message(body=b"payload-1", queue_id=2, TAGS="tagA", KEYS="k1 k2", UNIQ_KEY="U1")
        msg.flag = 7
        res = put(store, msg)
        assert res.status is PutStatus.PUT_OK and res.ok
        assert res.queue_offset == 0 and res.message_count == 1 and res.wrote_bytes > 0
        got = store.get_message("g", "TopicA", 2, 0, 32)
        assert got.status is GetStatus.FOUND
        assert got.message_count == 1 and got.queue_offsets == (0,)
        assert got.next_begin_offset == 1
        raw = bytes(got.buffers[0])
        assert len(raw) == res.wrote_bytes
        m = decode_message(raw, check_crc=True)
        assert (m.topic, m.body, m.queue_id, m.flag, m.queue_offset) == ("TopicA", b"payload-1", 2, 7, 0)
        assert m.commit_log_offset == res.wrote_offset
        assert m.store_timestamp == res.store_timestamp > 0
        assert m.born_host == ("10.0.0.7", 52000)
        assert m.properties["TAGS"] == "tagA" and m.keys == ["k1", "k2"] and m.uniq_key == "U1"
        assert m.msg_id == res.msg_id
        assert decode_message_id(res.msg_id)[1] == res.wrote_offset
        assert store.look_message_by_offset(res.wrote_offset) == raw
        assert store.look_message_by_offset(res.wrote_offset, len(raw)) == raw
        assert store.get_commit_log_offset("TopicA", 2, 0) == res.wrote_offset
        assert store.get_store_time("TopicA", 2, 0) == res.store_timestamp
        assert store.get_store_time("TopicA", 2, 5) == -1

    def test_queue_offsets_are_consecutive_per_queue(self, store: MessageStore) -> None:
        for i in range(10):
            assert put(store, message(body=b"a%d" % i, queue_id=0)).queue_offset == i
            assert put(store, message(body=b"b%d" % i, queue_id=1)).queue_offset == i
        assert store.get_max_offset_in_queue("TopicA", 0) == 10
        assert store.get_min_offset_in_queue("TopicA", 0) == 0
        got = store.get_message("g", "TopicA", 1, 3, 4)
        assert got.status is GetStatus.FOUND
        assert [decode_message(b).body for b in got.buffers] == [b"b3", b"b4", b"b5", b"b6"]
        assert got.queue_offsets == (3, 4, 5, 6) and got.next_begin_offset == 7
        assert (got.min_offset, got.max_offset) == (0, 10)
        assert store.get_max_phy_offset() > store.get_min_phy_offset() >= 0

    def test_statuses_at_the_edges_of_a_queue(self, store: MessageStore) -> None:
        unknown = store.get_message("g", "Nope", 0, 0, 32)
        assert unknown.status is GetStatus.NO_MATCHED_LOGIC_QUEUE and unknown.next_begin_offset == 0
        assert store.get_max_offset_in_queue("Nope", 0) == 0
        for i in range(3):
            put(store, message(body=b"%d" % i))
        one = store.get_message("g", "TopicA", 0, 3, 32)
        assert one.status is GetStatus.OFFSET_OVERFLOW_ONE and one.next_begin_offset == 3
        assert one.message_count == 0
        badly = store.get_message("g", "TopicA", 0, 50, 32)
        # Past the end: to the end (RocketMQ 4.9.4+), not back to the minimum 0 (a whole queue again).
        assert badly.status is GetStatus.OFFSET_OVERFLOW_BADLY and badly.next_begin_offset == 3

    def test_max_count_and_max_bytes_bound_a_pull(self, store: MessageStore) -> None:
        results = [put(store, message(body=bytes(300))) for _ in range(20)]
        size = results[0].wrote_bytes
        got = store.get_message("g", "TopicA", 0, 0, 5)
        assert got.message_count == 5 and got.next_begin_offset == 5
        got = store.get_message("g", "TopicA", 0, 0, 32, max_bytes=size * 3 + 10)
        assert got.message_count == 3 and got.next_begin_offset == 3 and got.total_size == size * 3
        # A single message over max_bytes is still served, or a consumer could never pass it.
        got = store.get_message("g", "TopicA", 0, 4, 32, max_bytes=10)
        assert got.message_count == 1 and got.next_begin_offset == 5

    def test_batch_is_atomic_with_consecutive_offsets(self, store: MessageStore) -> None:
        put(store, message(body=b"first"))
        batch = [message(body=b"m%d" % i, KEYS=f"key{i}") for i in range(5)]
        res = store.put_messages(batch).result(10)
        assert res.ok and res.message_count == 5 and res.queue_offset == 1 and len(res.msg_ids) == 5
        got = store.get_message("g", "TopicA", 0, 1, 32)
        msgs = [decode_message(b) for b in got.buffers]
        assert [m.body for m in msgs] == [b"m%d" % i for i in range(5)]
        assert [m.queue_offset for m in msgs] == [1, 2, 3, 4, 5]
        assert [m.msg_id for m in msgs] == list(res.msg_ids)
        mixed = store.put_messages([message(queue_id=0), message(queue_id=1)]).result(10)
        assert mixed.status is PutStatus.MESSAGE_ILLEGAL and mixed.error
        assert store.get_max_offset_in_queue("TopicA", 0) == 6

    def test_oversized_message_is_refused_and_the_store_stays_usable(self, store: MessageStore) -> None:
        put(store, message(body=b"before"))
        res = store.put_message(message(body=bytes(8 * 1024 * 1024 + 1))).result(10)
        assert res.status is PutStatus.MESSAGE_ILLEGAL
        assert "limit" in res.error or "does not fit" in res.error
        res = store.put_message(message(body=b"x", **{"P": "v" * 40000})).result(10)  # type: ignore[arg-type]
        assert res.status in (PutStatus.PROPERTIES_SIZE_EXCEEDED, PutStatus.MESSAGE_ILLEGAL) and res.error
        assert put(store, message(body=b"after")).queue_offset == 1
        got = store.get_message("g", "TopicA", 0, 0, 32)
        assert [decode_message(b).body for b in got.buffers] == [b"before", b"after"]

    # ------------------------------------------------------------------ filters
    def test_filter_checks_tag_code_then_properties(self, store: MessageStore) -> None:
        for i in range(12):
            put(store, message(body=b"%d" % i, TAGS="odd" if i % 2 else "even"))
        # "Aa" and "BB" share Java's String.hashCode: the code passes, the properties decide.
        put(store, message(body=b"Aa", TAGS="Aa"))
        put(store, message(body=b"BB", TAGS="BB"))
        got = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("odd"))
        assert got.status is GetStatus.FOUND
        assert [decode_message(b).body for b in got.buffers] == [b"%d" % i for i in range(1, 12, 2)]
        assert got.next_begin_offset == 14
        got = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("BB"))
        assert [decode_message(b).body for b in got.buffers] == [b"BB"]
        none = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("missing"))
        # Nothing matched, but the consumer moves past what was scanned.
        assert none.status is GetStatus.NO_MATCHED_MESSAGE and none.next_begin_offset == 14

    def test_filter_selects_by_tag_within_a_batch(self, store: MessageStore) -> None:
        # A batch put writes its queue entries in one go: each entry keeps its own message's tag.
        batch = [message(body=b"%d" % i, TAGS="odd" if i % 2 else "even") for i in range(8)]
        assert store.put_messages(batch).result(10).ok
        got = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("odd"))
        assert got.status is GetStatus.FOUND
        assert [decode_message(b).body for b in got.buffers] == [b"%d" % i for i in range(1, 8, 2)]
        got = store.get_message("g", "TopicA", 0, 0, 32, TagFilter("even"))
        assert [decode_message(b).body for b in got.buffers] == [b"%d" % i for i in range(0, 8, 2)]
        assert got.next_begin_offset == 8

    # ------------------------------------------------------------------ time search
    def test_offset_by_time_finds_the_first_message_at_or_after(self, store: MessageStore) -> None:
        stamps = []
        for i in range(9):
            stamps.append(put(store, message(body=b"%d" % i)).store_timestamp)
            time.sleep(0.003)
        assert store.get_offset_by_time("TopicA", 0, 0) == 0
        for i, ts in enumerate(stamps):
            assert store.get_offset_by_time("TopicA", 0, ts) == stamps.index(ts)
            assert store.get_offset_by_time("TopicA", 0, ts + 1) == i + 1
        assert store.get_offset_by_time("TopicA", 0, stamps[-1] + 10_000) == 9

    # ------------------------------------------------------------------ notification
    def test_future_resolves_only_when_readable(self, store: MessageStore) -> None:
        seen: list[GetStatus] = []
        done = threading.Event()

        def check(_fut: Any) -> None:
            seen.append(store.get_message("g", "TopicA", 3, 0, 1).status)
            done.set()

        store.put_message(message(queue_id=3)).add_done_callback(check)
        assert done.wait(10)
        assert seen == [GetStatus.FOUND]

    def test_dispatchers_and_arrival_listeners_see_each_message(
        self, make_store: Callable[[], MessageStore]
    ) -> None:
        store = make_store()
        requests: list[DispatchRequest] = []
        arrivals: list[tuple[str, int, int]] = []
        got_all = threading.Event()

        class Recorder:
            def dispatch(self, request: DispatchRequest) -> None:
                requests.append(request)

        def on_arrival(topic: str, queue_id: int, max_offset: int) -> None:
            # Arrival means readable: the message at max_offset - 1 must be there.
            status = store.get_message("g", topic, queue_id, max_offset - 1, 1).status
            arrivals.append((topic, queue_id, max_offset if status is GetStatus.FOUND else -1))
            if max_offset == 3:
                got_all.set()

        store.add_dispatcher(Recorder())
        store.add_arrival_listener(on_arrival)
        assert store.load()
        store.start()
        try:
            results = [
                put(store, message(queue_id=1, TAGS="t", KEYS="a b", UNIQ_KEY=f"u{i}")) for i in range(3)
            ]
            assert got_all.wait(10)
            deadline = time.monotonic() + 10
            while len(requests) < 3 and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            store.shutdown()
        assert [r.commit_log_offset for r in requests] == [r.wrote_offset for r in results]
        assert [r.queue_offset for r in requests] == [0, 1, 2]
        assert all(r.tags_code == tags_hash_code("t") and r.keys == "a b" for r in requests)
        assert [r.uniq_key for r in requests] == ["u0", "u1", "u2"]
        assert requests[0].msg_size == results[0].wrote_bytes
        assert arrivals and arrivals[-1] == ("TopicA", 1, 3)
        assert all(a[2] > 0 for a in arrivals)

    def test_arrival_listener_hears_only_the_queues_it_is_interested_in(
        self, make_store: Callable[[], MessageStore]
    ) -> None:
        # The broker's long polling asks only for queues a pull waits on: a producer writing
        # elsewhere must not wake the store's notifier (nor reach the listener) at all.
        store = make_store()
        heard: list[tuple[str, int, int]] = []
        asked: list[tuple[str, int]] = []
        got = threading.Event()

        def interested(topic: str, queue_id: int) -> bool:
            asked.append((topic, queue_id))
            return queue_id == 2

        def on_arrival(topic: str, queue_id: int, max_offset: int) -> None:
            heard.append((topic, queue_id, max_offset))
            got.set()

        store.add_arrival_listener(on_arrival, interested)
        assert store.load()
        store.start()
        try:
            for _ in range(3):
                put(store, message(queue_id=1))
            put(store, message(queue_id=2))
            assert got.wait(10)
            time.sleep(0.05)  # a stray delivery for queue 1 would come within a round
        finally:
            store.shutdown()
        assert ("TopicA", 1) in asked and ("TopicA", 2) in asked
        assert heard == [("TopicA", 2, 1)]

    # ------------------------------------------------------------------ concurrency
    def test_concurrent_writers_get_unique_offsets(self, store: MessageStore) -> None:
        n_threads, per_thread = 8, 40
        results: list[PutResult] = []
        lock = threading.Lock()

        def writer(t: int) -> None:
            futs = [
                store.put_message(message(body=b"%d-%d" % (t, i), queue_id=t % 2)) for i in range(per_thread)
            ]
            out = [f.result(30) for f in futs]
            with lock:
                results.extend(out)

        threads = [threading.Thread(target=writer, args=(t,)) for t in range(n_threads)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert all(r.ok for r in results)
        for qid in (0, 1):
            offsets = sorted(
                r.queue_offset
                for r in results
                if r.msg_ids
                and decode_message(
                    store.look_message_by_offset(decode_message_id(r.msg_id)[1]) or b""
                ).queue_id
                == qid
            )
            assert offsets == list(range(n_threads * per_thread // 2))
        bodies: set[bytes] = set()
        for qid in (0, 1):
            offset = 0
            while True:
                got = store.get_message("g", "TopicA", qid, offset, 32)
                if got.status is not GetStatus.FOUND:
                    break
                bodies.update(decode_message(b).body for b in got.buffers)
                offset = got.next_begin_offset
        assert len(bodies) == n_threads * per_thread

    # ------------------------------------------------------------------ topics
    def test_topics_and_delete_topics(self, store: MessageStore) -> None:
        put(store, message(topic="T1", queue_id=0))
        put(store, message(topic="T1", queue_id=3))
        put(store, message(topic="T2", queue_id=1))
        assert store.topics() == {"T1": [0, 3], "T2": [1]}
        store.delete_topics(["T1"])
        assert store.topics() == {"T2": [1]}
        assert store.get_message("g", "T1", 0, 0, 32).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert put(store, message(topic="T1", queue_id=0)).queue_offset == 0

    def test_prepared_transaction_half_is_stored_but_not_queued(self, store: MessageStore) -> None:
        half = message(body=b"half", queue_id=0)
        half.sys_flag = TRANSACTION_PREPARED_TYPE
        res = put(store, half)
        assert res.ok
        assert decode_message(store.look_message_by_offset(res.wrote_offset) or b"").body == b"half"
        assert store.get_max_offset_in_queue("TopicA", 0) == 0
        assert put(store, message(body=b"normal")).queue_offset == 0

"""The batch dispatch contract and the ``hash`` index off the put path.

:class:`tidemq.store.BatchDispatcher`: one call per put with the records as columns, per-request
dispatchers unchanged beside it.  The hash index queues a put's keys and indexes them on its own
thread; a query finds every key whose put was acknowledged, however far behind that thread is;
the queue is bounded (a put indexes a chunk itself); ``flush`` covers only what is written;
shutdown indexes what is queued; a process killed with keys still queued loses none of them
(the store re-dispatches from the checkpoint).
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

import tidemq.store
import tidemq_index_hash.service as service
from tidemq.errors import StoreError
from tidemq.index import IndexFileEntry, query_messages
from tidemq.message import TRANSACTION_ROLLBACK_TYPE, MessageInner, Prop
from tidemq.plugins import get_plugin_manager
from tidemq.store import BatchDispatcher, Dispatcher, DispatchRequest, dispatch_messages
from tidemq.testing.index_contract import T0
from tidemq.testing.store_contract import build_store
from tidemq_index_hash.none import NoIndex
from tidemq_index_hash.service import HashIndex, HashIndexOptions

TOPIC = "TopicTest"
FOREVER = 2**62


def keyed(i: int, topic: str = TOPIC, sys_flag: int = 0) -> MessageInner:
    props = {Prop.KEYS: f"k{i} shared", Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"U{i:08d}"}
    return MessageInner(topic=topic, body=b"m%d" % i, queue_id=1, properties=props, sys_flag=sys_flag)


class Columns:
    """A BatchDispatcher that records its calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def dispatch(self, request: DispatchRequest) -> None:
        raise AssertionError("a batch dispatcher gets no per-request call")

    def dispatch_batch(
        self,
        topic: str,
        queue_id: int,
        properties: Sequence[Mapping[str, str]],
        commit_log_offsets: Sequence[int],
        sizes: Sequence[int],
        tags_codes: Sequence[int],
        store_timestamp: int,
        queue_offset: int,
        sys_flags: Sequence[int],
    ) -> None:
        self.calls.append(
            (topic, queue_id, list(properties), list(commit_log_offsets), list(sizes), list(tags_codes))
            + (store_timestamp, queue_offset, list(sys_flags))
        )


class Requests:
    """A per-request dispatcher (third-party style)."""

    def __init__(self) -> None:
        self.requests: list[DispatchRequest] = []

    def dispatch(self, request: DispatchRequest) -> None:
        self.requests.append(request)


# ---------------------------------------------------------------------------- the contract
def test_protocols() -> None:
    assert isinstance(Columns(), BatchDispatcher)
    assert not isinstance(Requests(), BatchDispatcher) and isinstance(Requests(), Dispatcher)
    for index in (HashIndex(Path("/nonexistent"), HashIndexOptions()), NoIndex()):
        assert isinstance(index, BatchDispatcher) and isinstance(index, Dispatcher)


def test_batch_and_per_request_dispatchers_side_by_side(caplog: pytest.LogCaptureFixture) -> None:
    batch, requests = Columns(), Requests()

    class Broken(Columns):
        def dispatch_batch(self, *args: Any) -> None:
            raise RuntimeError("broken dispatcher")

    msgs = [keyed(i) for i in range(3)]
    with caplog.at_level(logging.ERROR):
        dispatch_messages([Broken(), batch, requests], msgs, [100, 200, 300], [10, 11, 12], [7, 8, 9], T0, 40)
    assert "broken dispatcher" in caplog.text  # logged; the others still got the records
    ((topic, qid, props, offsets, sizes, tags, ts, qoff, flags),) = batch.calls
    assert (topic, qid, offsets, sizes, tags, ts, qoff, flags) == (
        TOPIC,
        1,
        [100, 200, 300],
        [10, 11, 12],
        [7, 8, 9],
        T0,
        40,
        [0, 0, 0],
    )
    assert props == [m.properties for m in msgs] and props[0] is msgs[0].properties
    assert [(r.commit_log_offset, r.queue_offset, r.keys, r.uniq_key) for r in requests.requests] == [
        (100, 40, "k0 shared", "U00000000"),
        (200, 41, "k1 shared", "U00000001"),
        (300, 42, "k2 shared", "U00000002"),
    ]


def test_no_request_objects_when_every_dispatcher_takes_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_requests(**_kw: Any) -> None:
        raise AssertionError("a DispatchRequest was built")

    monkeypatch.setattr(tidemq.store, "DispatchRequest", no_requests)
    batch = Columns()
    dispatch_messages([batch, NoIndex()], [keyed(1)], [5], [1], [0], T0, -1)
    assert batch.calls[0][7] == -1  # no queue entry: -1 passed through


# ---------------------------------------------------------------------------- the hash index
@pytest.fixture
def slow_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """The index thread waits an hour between rounds: only readers and back-pressure index."""
    monkeypatch.setattr(service, "ROUND_S", 3600.0)


def open_index(path: Path, **options: int) -> HashIndex:
    index = HashIndex(path, HashIndexOptions(**options))
    index.load(True, 0)
    return index


def dispatch(index: HashIndex, msgs: list[MessageInner], first_offset: int, ts: int) -> list[int]:
    offsets = [first_offset + 100 * i for i in range(len(msgs))]
    dispatch_messages([index], msgs, offsets, [100] * len(msgs), [0] * len(msgs), ts, 0)
    return offsets


def test_the_put_path_only_queues(tmp_path: Path, slow_thread: None) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=64, max_index_num=64)
    try:
        dispatch(index, [keyed(i) for i in range(5)], 0, T0)  # one put: the thread starts, waits
        dispatch(index, [keyed(i) for i in range(5, 8)], 500, T0 + 1)
        queued, age = index.pending()
        assert queued == 8 and age >= 0
        time.sleep(0.3)  # time enough for a round the thread should not start yet
        assert not list((tmp_path / "index").iterdir())  # nothing written yet
        # A query indexes what is queued first: every acknowledged put is found.
        assert index.query(TOPIC, "k7", 4, 0, FOREVER).phy_offsets == (700,)
        assert index.query(TOPIC, "U00000003", 4, 0, FOREVER).phy_offsets == (300,)
        assert index.pending() == (0, 0.0)
        assert index.query(TOPIC, "shared", 64, 0, FOREVER).phy_offsets == tuple(range(700, -1, -100))
    finally:
        index.shutdown()


def test_the_index_thread_catches_up_alone(tmp_path: Path) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=64, max_index_num=64)
    try:
        dispatch(index, [keyed(i) for i in range(10)], 0, T0)
        deadline = threading.Event()
        for _ in range(200):
            if index.pending()[0] == 0 and list((tmp_path / "index").iterdir()):
                break
            deadline.wait(0.01)
        assert index.pending() == (0, 0.0), "the index thread never indexed the queue"
        assert index.stats()["entries"] == 30  # UNIQ_KEY and two KEYS each
    finally:
        index.shutdown()


def test_back_pressure_bounds_the_queue(
    tmp_path: Path, slow_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(service, "MAX_QUEUED", 64)
    monkeypatch.setattr(service, "DRAIN_CHUNK", 32)
    index = open_index(tmp_path / "index", max_hash_slot_num=64, max_index_num=4096)
    try:
        for b in range(40):
            dispatch(index, [keyed(b * 8 + i) for i in range(8)], b * 800, T0 + b)
            assert index.pending()[0] <= 64 + 8
        assert index.stats()["put_drains"] > 0
        assert index.stats()["entries"] == 40 * 8 * 3
    finally:
        index.shutdown()


def test_a_put_indexes_the_queue_itself_past_inline_keys(tmp_path: Path, slow_thread: None) -> None:
    """Past ``inline_keys`` queued messages the put indexes the queue on its own thread (the index
    thread never runs a round here): the same files, answers and checkpoint as the thread's."""
    inline = open_index(tmp_path / "inline", max_hash_slot_num=64, max_index_num=4096, inline_keys=16)
    thread = open_index(tmp_path / "thread", max_hash_slot_num=64, max_index_num=4096, inline_keys=0)
    try:
        for index in (inline, thread):
            for b in range(5):
                dispatch(index, [keyed(b * 8 + i) for i in range(8)], b * 800, T0 + b)
                if index is inline:  # 8 queued, then 16: indexed by this put, and so on
                    assert index.pending()[0] == (8 if b % 2 == 0 else 0)
        assert inline.stats()["inline_drains"] == 2
        assert thread.pending()[0] == 40 and thread.stats()["inline_drains"] == 0  # stats indexes
        for index in (inline, thread):
            assert index.query(TOPIC, "k33", 4, 0, FOREVER).phy_offsets == (3300,)
        assert inline.flush() == thread.flush()
        assert inline.stats()["covered_timestamp"] == thread.stats()["covered_timestamp"] == T0 + 4
        files = [sorted(p.read_bytes() for p in (tmp_path / name).iterdir()) for name in ("inline", "thread")]
        assert files[0] == files[1]
    finally:
        inline.shutdown()
        thread.shutdown()


def test_inline_indexing_keeps_the_gil(tmp_path: Path) -> None:
    """Indexed inline, the compiled calls do not release the GIL (a hand-over to another thread
    and back per call); the index thread alone releases it from 64 keys on.  Each index passes
    its figure with each call (tests/test_index_gil_per_call.py)."""
    for inline, keys in ((256, 0), (0, 64)):
        index = open_index(
            tmp_path / f"i{inline}", max_hash_slot_num=64, max_index_num=64, inline_keys=inline
        )
        index.shutdown()
        assert index._gil_keys == keys
        assert index._release_gil() == service.THREAD_GIL_RELEASE_KEYS


def test_flush_covers_only_what_is_written_and_keeps_order(tmp_path: Path, slow_thread: None) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=8, max_index_num=9)  # rolls every 8
    try:
        for b in range(6):
            dispatch(index, [keyed(b * 4 + i) for i in range(4)], b * 400, T0 + b * 1000)
        assert index.flush() == T0 + 5000  # what was dispatched before it: indexed, then durable
        offsets = [e.phy_offset for e in index.walk_files() if isinstance(e, IndexFileEntry)]
        assert offsets == sorted(offsets) and len(offsets) == 6 * 4 * 3  # commit-log order
    finally:
        index.shutdown()


def test_rolled_back_halves_and_redispatched_records_are_skipped(tmp_path: Path, slow_thread: None) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=16, max_index_num=64)
    try:
        msgs = [keyed(0), keyed(1, sys_flag=TRANSACTION_ROLLBACK_TYPE), keyed(2)]
        dispatch(index, msgs, 0, T0)
        dispatch(index, [keyed(i) for i in range(3)], 0, T0)  # recovery re-dispatch: skipped
        assert index.query(TOPIC, "k1", 4, 0, FOREVER).phy_offsets == ()
        assert index.query(TOPIC, "shared", 8, 0, FOREVER).phy_offsets == (200, 0)
        assert index.stats()["entries"] == 6
    finally:
        index.shutdown()


def test_a_batch_that_cannot_be_indexed_is_logged_and_the_thread_goes_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=16, max_index_num=64)
    try:
        with caplog.at_level(logging.ERROR):
            index.dispatch_batch(TOPIC, 0, [{Prop.KEYS: 5}], [0], [1], [0], T0, 0, [0])  # type: ignore[dict-item]
            dispatch(index, [keyed(1)], 100, T0)
            assert index.query(TOPIC, "k1", 4, 0, FOREVER).phy_offsets == (100,)
        assert "cannot index 1 messages of TopicTest at offset 0" in caplog.text
    finally:
        index.shutdown()


def test_misuse_is_a_clear_error(tmp_path: Path) -> None:
    index = HashIndex(tmp_path / "index", HashIndexOptions(max_hash_slot_num=8, max_index_num=8))
    with pytest.raises(StoreError, match="before load"):
        index.dispatch_batch(TOPIC, 0, [{}], [0], [1], [0], T0, 0, [0])
    index.load(True, 0)
    index.shutdown()
    with pytest.raises(StoreError, match="shut down"):
        index.dispatch_batch(TOPIC, 0, [{}], [0], [1], [0], T0, 0, [0])


def test_shutdown_indexes_what_is_queued(tmp_path: Path, slow_thread: None) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=16, max_index_num=64)
    dispatch(index, [keyed(i) for i in range(6)], 0, T0)
    assert index.pending()[0] == 6
    index.shutdown()
    again = open_index(tmp_path / "index", max_hash_slot_num=16, max_index_num=64)
    try:
        assert again.query(TOPIC, "k5", 4, 0, FOREVER).phy_offsets == (500,)
    finally:
        again.shutdown()


def test_queries_and_puts_from_many_threads(tmp_path: Path) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=97, max_index_num=500)
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                index.query(TOPIC, "shared", 4, 0, FOREVER)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        for b in range(100):
            offsets = dispatch(index, [keyed(b * 4 + i) for i in range(4)], b * 400, T0 + b)
            if b % 10 == 0:  # found as soon as the put returned, whatever the thread is doing
                assert index.query(TOPIC, f"k{b * 4 + 3}", 4, 0, FOREVER).phy_offsets == (offsets[-1],)
    finally:
        done.set()
        for t in readers:
            t.join()
    assert not errors
    try:
        index.flush()
        # Files roll every 499 entries: across them the entries stay in commit-log order.
        offsets_seen = [e.phy_offset for e in index.walk_files() if isinstance(e, IndexFileEntry)]
        assert offsets_seen == sorted(offsets_seen) and len(offsets_seen) == 100 * 4 * 3
    finally:
        index.shutdown()


# ---------------------------------------------------------------------------- composed with stores
@pytest.fixture(params=["mmap", "memory"])
def store_and_index(request: pytest.FixtureRequest, tmp_path: Path, slow_thread: None) -> Iterator[Any]:
    pm = get_plugin_manager()
    if request.param not in pm.available("store"):
        pytest.skip(f"the {request.param} store is not installed")
    index = pm.create(
        "index", "hash", options={"max_hash_slot_num": 97, "max_index_num": 400}, data_dir=tmp_path
    )
    store = build_store(request.param, tmp_path, flush="async", index=index)
    assert store.load()
    store.start()
    try:
        yield store, index
    finally:
        store.shutdown()


def test_a_key_is_found_as_soon_as_its_put_is_acknowledged(store_and_index: Any) -> None:
    store, index = store_and_index
    for b in range(30):
        res = store.put_messages([keyed(b * 4 + i) for i in range(4)]).result(30)
        assert res.ok
        assert index.pending()[0] > 0  # the index thread has not run (ROUND_S is an hour)
        found, _ = query_messages(index, store, TOPIC, f"k{b * 4 + 3}", 4, 0, FOREVER)
        assert [m.body for m in found] == [b"m%d" % (b * 4 + 3)]
        assert index.pending() == (0, 0.0)
    single = store.put_message(keyed(999)).result(30)
    assert single.ok
    found, _ = query_messages(index, store, TOPIC, "U00000999", 4, 0, FOREVER)
    assert [m.body for m in found] == [b"m999"]


_CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    from pathlib import Path
    import tidemq_index_hash.service as service
    from tidemq.message import MessageInner
    from tidemq.plugins import get_plugin_manager
    from tidemq.testing.store_contract import build_store

    service.ROUND_S = 3600.0  # the index thread never runs: keys stay queued
    data = Path(sys.argv[1])
    pm = get_plugin_manager()
    index = pm.create("index", "hash", options={"max_hash_slot_num": 97, "max_index_num": 400}, data_dir=data)
    store = build_store("mmap", data, flush="sync", index=index, store_options={"cq_flush_interval_ms": 50})
    assert store.load()
    store.start()
    acked = []
    for b in range(40):
        msgs = [
            MessageInner(topic="T", body=b"m%d" % (b * 5 + i), properties={"KEYS": "k%d" % (b * 5 + i)})
            for i in range(5)
        ]
        res = store.put_messages(msgs).result(30)
        assert res.ok
        acked.append(b * 5 + 4)
        # A record with no key between them (as POP revive records): not queued, and the index
        # checkpoint may cover it only once the keys before it are indexed.
        assert store.put_message(MessageInner(topic="R", body=b"r%d" % b, properties={"TAGS": "x"})).result(30).ok
    queued = index.pending()[0]
    print(json.dumps({"queued": queued, "acked": acked[-1]}), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_keys_still_queued_at_a_crash_are_indexed_after_recovery(tmp_path: Path) -> None:
    if "mmap" not in get_plugin_manager().available("store"):
        pytest.skip("the mmap store plugin is not installed")
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path)], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-3000:]
    child = json.loads(proc.stdout)
    assert child["queued"] > 0  # the kill found keys not yet indexed
    pm = get_plugin_manager()
    index = pm.create(
        "index", "hash", options={"max_hash_slot_num": 97, "max_index_num": 400}, data_dir=tmp_path
    )
    store = build_store("mmap", tmp_path, flush="sync", index=index)
    assert store.load()  # abnormal: re-dispatch from the index checkpoint
    store.start()
    try:
        for i in range(child["acked"] + 1):
            found, _ = query_messages(index, store, "T", f"k{i}", 4, 0, FOREVER)
            assert [m.body for m in found] == [b"m%d" % i], i
    finally:
        store.shutdown()


# ---------------------------------------------------------------------------- wake-ups (issue 38)
def keyless(i: int, topic: str = TOPIC) -> MessageInner:
    """A record with no key, as a POP revive or checkpoint record."""
    return MessageInner(topic=topic, body=b"r%d" % i, queue_id=1, properties={"TAGS": "revive"})


def test_keyless_puts_are_not_queued_and_every_keyed_one_is_indexed(
    tmp_path: Path, slow_thread: None
) -> None:
    index = open_index(tmp_path / "index", max_hash_slot_num=64, max_index_num=256)
    try:
        dispatch(index, [keyed(i) for i in range(5)], 0, T0)
        dispatch(index, [keyless(i) for i in range(3)], 500, T0 + 10)
        dispatch(index, [keyed(5), keyless(9), keyed(6)], 800, T0 + 20)  # mixed: queued whole
        dispatch(index, [keyless(10)], 1100, T0 + 30)
        assert index.pending()[0] == 8  # the keyless puts are not queued
        stats = index.stats()  # indexes what is queued first
        assert stats["keyless_puts"] == 2 and stats["entries"] == 7 * 3
        for i, offset in enumerate([0, 100, 200, 300, 400, 800, 1000]):
            assert index.query(TOPIC, f"k{i}", 4, 0, FOREVER).phy_offsets == (offset,), i
            assert index.query(TOPIC, f"U{i:08d}", 4, 0, FOREVER).phy_offsets == (offset,), i
        # The checkpoint covers the last keyless put: everything queued before it is indexed.
        assert index.flush() == T0 + 30
    finally:
        index.shutdown()


def test_a_keyless_put_is_not_covered_before_the_keys_queued_ahead_of_it(
    tmp_path: Path, slow_thread: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Back-pressure indexes a chunk at a time: the checkpoint may not pass a queued key."""
    monkeypatch.setattr(service, "MAX_QUEUED", 4)
    monkeypatch.setattr(service, "DRAIN_CHUNK", 2)
    index = open_index(tmp_path / "index", max_hash_slot_num=64, max_index_num=256)
    try:
        for b in range(4):  # each put indexes two messages of the queue (back-pressure)
            dispatch(index, [keyed(b * 2 + i) for i in range(2)], b * 200, T0 + b)
        dispatch(index, [keyless(0)], 900, T0 + 100)
        assert index.pending()[0] > 0
        assert index.stats()["covered_timestamp"] == T0 + 100  # stats indexes the queue first
        assert index.flush() == T0 + 100
    finally:
        index.shutdown()


def test_the_index_thread_is_not_woken_per_put(tmp_path: Path) -> None:
    """While puts keep coming the thread runs a round every ROUND_S, woken once from idle."""
    index = open_index(tmp_path / "index", max_hash_slot_num=4096, max_index_num=8192)
    try:
        puts = 0
        paused = 0  # gaps between puts of a whole round or more: the thread may idle in each
        t0 = last = time.perf_counter()
        # A put every 0.5 ms for >= 0.25 s (~50 of the thread's rounds) and >= 200 puts: a loaded
        # host that starves this thread makes the run longer, not the check weaker.
        while (time.perf_counter() - t0 < 0.25 or puts < 200) and time.perf_counter() - t0 < 20:
            dispatch(index, [keyed(puts)], puts * 100, T0 + puts)
            puts += 1
            pace = max(t0 + puts * 0.0005, time.perf_counter())
            while time.perf_counter() < pace:
                pass
            now = time.perf_counter()
            if now - last >= service.ROUND_S:
                paused += 1
            last = now
        keyed_puts = puts
        for _ in range(200):  # keyless puts never wake it
            dispatch(index, [keyless(puts)], puts * 100, T0 + puts)
            puts += 1
        stats = index.stats()
        assert stats["entries"] == keyed_puts * 3 and keyed_puts >= 200
        # One wake-up from idle, and at most one more per pause of a whole round (a loaded host);
        # a wake-up per round would be ~50 and more.
        assert stats["wakeups"] <= 3 + paused, (stats, paused)
    finally:
        index.shutdown()


def test_the_index_thread_leaves_its_rounds_to_puts_that_index_inline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While puts keep coming and index the queue themselves (``inline_keys``), the index thread
    runs no round (each took the GIL from the event loop for part of a queue the puts index
    anyway); once they stop, it indexes what they left within two of its paces."""
    monkeypatch.setattr(service, "ROUND_S", 0.002)  # a round per 20 ms (INLINE_ROUNDS of them)
    index = open_index(tmp_path / "index", max_hash_slot_num=4096, max_index_num=8192, inline_keys=8)
    on_thread: list[int] = []
    drain = index._drain

    def counted(limit: int | None = None, gil_keys: int | None = None) -> bool:
        if threading.current_thread() is index._worker and index._queue:  # a round that indexes
            on_thread.append(len(index._queue))
        return drain(limit, gil_keys)

    monkeypatch.setattr(index, "_drain", counted)
    try:
        puts = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 0.3:  # a put every 0.5 ms: 15 of the thread's paces
            dispatch(index, [keyed(puts)], puts * 100, T0 + puts)
            puts += 1
            while time.perf_counter() < t0 + puts * 0.0005:
                pass
        during = len(on_thread)
        left = index.pending()[0]
        assert left < 8
        # None while the puts came (a round more only if a loaded host paused them for a pace).
        assert during <= 2, on_thread
        for _ in range(100):  # then the thread indexes the rest by itself (no query, no stats)
            if index.pending()[0] == 0:
                break
            time.sleep(0.01)
        assert index.pending() == (0, 0.0), "the index thread never indexed what the puts left"
        stats = index.stats()
        assert stats["entries"] == puts * 3 and stats["inline_drains"] >= puts // 8 - 2
        assert len(on_thread) > during or not left
    finally:
        index.shutdown()

"""A store call's dispatch and arrivals done for the call (issue 38, groupdispatch).

The mmap store's ``put_message_groups`` hands a call's puts to each dispatcher at once when every
dispatcher takes them (:class:`tidemq.store.GroupDispatcher`: the hash index, the SQL92 bit map),
and looks each group's arrival up in the store's one map of waited-on queues
(:class:`tidemq.store.ArrivalInterest`, where the broker's long polling, POP, schedule and timer
services register) instead of asking four filters per group.

Store level (hypothesis): two mmap stores with the hash index, a recording dispatcher and an
arrival listener on the map, on one fixed clock: one puts through ``put_message_groups`` (the
call's effects), the other one ``put_messages`` per group (``dispatch_batch`` and ``arrived`` per
put, as before).  The recorder must see the same puts in the same (commit-log) order, the notifier
the same arrivals noted in the same order, the index the same answers, the files the same bytes.
A dispatcher with only ``dispatch_batch`` (a third-party one) and a listener with a callable
filter still get their per-group calls.  Broker level: the default broker takes the call's path,
and a held pull, a POP long poll, the schedule's and the timer's queues are woken by a call.
"""

from __future__ import annotations

import asyncio
import contextlib
import types
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_support import files_of as _files_of

import tidemq_store_mmap.group_put as group_put_module
import tidemq_store_mmap.store as store_module
from tidemq.broker.timer.properties import TIMER_TOPIC
from tidemq.delay import SCHEDULE_TOPIC
from tidemq.message import TRANSACTION_PREPARED_TYPE, MessageInner
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.protocol import TopicConfig
from tidemq.store import ArrivalInterest, GroupDispatcher, PutResult, arrival_interest, takes_groups
from tidemq.testing.pytest_plugin import running_broker
from tidemq.testing.store_contract import build_store

pytestmark = pytest.mark.timeout(300)

T0 = 1_764_300_000_123
TOPICS = ("DispatchTopicA", "DispatchTopicB", "DispatchTopicC")
HOST = ("10.0.0.7", 52000)
FILE_SIZE = 32 * 1024


@contextlib.contextmanager
def fixed_clock() -> Iterator[None]:
    clock = types.SimpleNamespace(time_ns=lambda: T0 * 1_000_000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(store_module, "time", clock)
        mp.setattr(group_put_module, "time", clock)
        yield


def files_of(root: Path) -> dict[str, bytes]:
    """The files' contents up to their trailing zeros (a next file made ahead by a thread is left out)."""
    stripped = {name: data.rstrip(b"\0") for name, data in _files_of(root).items()}
    return {name: data for name, data in stripped.items() if data}


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, list | tuple) else value


def _put_record(topic: str, queue_id: int, properties: Any, *rest: Any) -> tuple[Any, ...]:
    return (topic, queue_id, [dict(p) for p in properties], *map(_plain, rest))


class BatchRecorder:
    """A third-party dispatcher: only the per-put method."""

    def __init__(self) -> None:
        self.puts: list[tuple[Any, ...]] = []

    def dispatch_batch(self, topic: str, queue_id: int, properties: Any, *rest: Any) -> None:
        self.puts.append(_put_record(topic, queue_id, properties, *rest))


class GroupRecorder(BatchRecorder):
    """A dispatcher that takes a call's puts at once; notes each put as dispatch_batch would."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def dispatch_groups(self, puts: Sequence[Any]) -> None:
        self.calls += 1
        for put in puts:
            self.puts.append(_put_record(*put))


class Noted(dict[tuple[str, int], int]):
    """The notifier's pending arrivals, noting each one written (the writer's side, in order)."""

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, int, int]] = []

    def __setitem__(self, key: tuple[str, int], value: int) -> None:
        self.log.append((*key, value))
        super().__setitem__(key, value)


class Side:
    """One mmap store with the hash index, recorders and an arrival listener on the store's map."""

    def __init__(
        self, root: Path, name: str, old_dispatcher: bool = False, filter_listener: bool = False
    ) -> None:
        self.root = root / name
        self.index = get_plugin_manager().create("index", "hash", data_dir=self.root)
        self.store: Any = build_store(
            "mmap",
            self.root,
            flush="async",
            store_options={
                "store_host": "10.1.2.3:10911",
                "commitlog_file_size": FILE_SIZE,
                "consumequeue_entries": 10_000,
            },
            index=self.index,
        )
        self.recorder = BatchRecorder() if old_dispatcher else GroupRecorder()
        self.store.add_dispatcher(self.recorder)
        self.interest = arrival_interest(self.store)
        assert self.interest is not None
        self.store.add_arrival_listener(lambda *_: None, self.interest)
        self.asked: list[tuple[str, int]] = []
        if filter_listener:
            self.store.add_arrival_listener(lambda *_: None, self._filter)
        assert self.store.load()
        self.store.start()
        # The writer's notes, kept: the notifier's thread would take them in rounds.
        self.store.notifier.stop()
        self.noted = Noted()
        self.store.notifier._arrivals = self.noted

    def _filter(self, topic: str, queue_id: int) -> bool:
        self.asked.append((topic, queue_id))
        return queue_id == 3

    def put_all(self, groups: Sequence[Sequence[MessageInner]], one_call: bool) -> list[PutResult]:
        if not one_call:
            return [self.store.put_messages(g).result(10) for g in groups]
        out: list[PutResult] = []
        while len(out) < len(groups):
            futures = self.store.put_message_groups(groups[len(out) :])
            out.extend(f.result(10) for f in futures)
        return out

    def close(self) -> None:
        self.store.shutdown()


def message(topic: str, queue_id: int, body: bytes, key: str | None, sys_flag: int = 0) -> MessageInner:
    properties = {"TAGS": f"t{len(body) % 3}"}
    if key is not None:
        properties |= {"KEYS": key, "UNIQ_KEY": f"U-{key}"}
    return MessageInner(
        topic=topic,
        body=body,
        queue_id=queue_id,
        properties=properties,
        sys_flag=sys_flag,
        born_timestamp=T0 - 5,
        born_host=HOST,
    )


def make_pair(root: Path, **kw: Any) -> dict[str, Side]:
    with fixed_clock():
        return {"call": Side(root, "call", **kw), "groups": Side(root, "groups", **kw)}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Side]]:
    sides = make_pair(tmp_path_factory.mktemp("dispatch"))
    try:
        yield sides
    finally:
        for side in sides.values():
            side.close()


def compare(sides: dict[str, Side], groups: list[list[MessageInner]]) -> list[PutResult]:
    with fixed_clock():
        got = {name: side.put_all(groups, name == "call") for name, side in sides.items()}
    assert got["call"] == got["groups"]
    a, b = sides["call"], sides["groups"]
    assert a.recorder.puts == b.recorder.puts
    assert a.noted.log == b.noted.log
    assert a.asked == b.asked
    assert files_of(a.root) == files_of(b.root)
    for group in groups:
        for m in group:
            key = m.properties.get("KEYS")
            if key:
                assert a.index.query(m.topic, key, 4, 0, T0 + 1) == b.index.query(m.topic, key, 4, 0, T0 + 1)
    return got["call"]


def test_the_interest_map_counts_registrations() -> None:
    interest = ArrivalInterest()
    assert not interest.wants("T", 0) and interest.waited == {}
    interest.watch_queue("T", 1)
    interest.watch_queue("T", 1)
    interest.watch_queue("T", 2)
    assert interest.waited == {"T": frozenset({1, 2})}
    assert interest("T", 1) and not interest("T", 0) and not interest("U", 1)
    interest.unwatch_queue("T", 1)
    assert interest.wants("T", 1)  # one registration left
    interest.watch_topic("T")
    assert interest.waited["T"] is True and interest.wants("T", 7)
    interest.unwatch_topic("T")
    interest.unwatch_queue("T", 1)
    assert interest.waited == {"T": frozenset({2})}
    interest.unwatch_queue("T", 2)
    interest.unwatch_queue("T", 2)  # one too many: nothing to take back
    assert interest.waited == {}


def test_the_stores_and_dispatchers_offer_the_capabilities(tmp_path: Path) -> None:
    memory = build_store("memory", tmp_path / "mem")
    assert arrival_interest(memory) is None  # the memory store keeps the callable filters
    index = get_plugin_manager().create("index", "hash", data_dir=tmp_path / "i")
    assert takes_groups(index) and isinstance(index, GroupDispatcher)
    assert takes_groups(GroupRecorder()) and not takes_groups(BatchRecorder())


def test_a_call_is_dispatched_once_with_its_puts_in_order(pair: dict[str, Side]) -> None:
    a = pair["call"]
    for q in (1, 2):
        a.interest.watch_queue(TOPICS[0], q)  # type: ignore[union-attr]
        pair["groups"].interest.watch_queue(TOPICS[0], q)  # type: ignore[union-attr]
    calls = a.recorder.calls  # type: ignore[attr-defined]
    groups = [[message(TOPICS[0], q, b"%d" % q * 50, f"one-{q}-{i}") for i in range(3)] for q in range(8)]
    results = compare(pair, groups)
    assert all(r.ok for r in results)
    assert a.recorder.calls == calls + 1  # type: ignore[attr-defined]
    assert [(t, q) for t, q, _ in a.noted.log[-2:]] == [(TOPICS[0], 1), (TOPICS[0], 2)]


group_runs = st.lists(
    st.lists(
        st.tuples(
            st.sampled_from(TOPICS),
            st.integers(0, 3),
            st.integers(1, 4),
            st.sampled_from((0, 1, 100, 1024, 9000)),
            st.sampled_from(("keyed", "keyed", "keyless", "prepared")),
        ),
        min_size=1,
        max_size=10,
    ),
    min_size=1,
    max_size=3,
)
watches = st.lists(
    st.one_of(st.tuples(st.sampled_from(TOPICS)), st.tuples(st.sampled_from(TOPICS), st.integers(0, 3))),
    max_size=4,
)


def _watch(sides: dict[str, Side], watch: list[tuple[Any, ...]], on: bool) -> None:
    for side in sides.values():
        interest = side.interest
        assert interest is not None
        for w in watch:
            if len(w) == 1:
                (interest.watch_topic if on else interest.unwatch_topic)(w[0])
            else:
                (interest.watch_queue if on else interest.unwatch_queue)(*w)


def _groups(calls: list[Any], seq: int) -> Iterator[list[list[MessageInner]]]:
    for c, call in enumerate(calls):
        yield [
            [
                message(
                    topic,
                    queue,
                    bytes([65 + i]) * size,
                    None if kind == "keyless" else f"h{seq}-{c}-{g}-{i}",
                    TRANSACTION_PREPARED_TYPE if kind == "prepared" else 0,
                )
                for i in range(count)
            ]
            for g, (topic, queue, count, size, kind) in enumerate(call)
        ]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(calls=group_runs, watch=watches)
def test_random_calls_dispatch_and_arrive_as_one_put_per_group(
    pair: dict[str, Side], calls: list[Any], watch: list[tuple[Any, ...]]
) -> None:
    _watch(pair, watch, True)
    try:
        for groups in _groups(calls, len(pair["call"].recorder.puts)):
            compare(pair, groups)
    finally:
        _watch(pair, watch, False)


@pytest.mark.parametrize("kind", ["old-dispatcher", "filter-listener"])
def test_old_dispatchers_and_filters_still_get_their_calls_per_group(tmp_path: Path, kind: str) -> None:
    sides = make_pair(
        tmp_path, **{"old_dispatcher": kind == "old-dispatcher", "filter_listener": kind != "old-dispatcher"}
    )
    try:
        _watch(sides, [(TOPICS[1],), (TOPICS[0], 2)], True)
        for groups in _groups(
            [
                [(t, q, 2, 100, "keyed") for t in TOPICS for q in range(4)],
                [(TOPICS[0], 3, 1, 10, "prepared")],
            ],
            0,
        ):
            compare(sides, groups)
        a = sides["call"]
        assert len(a.recorder.puts) == 3 * 4 + 1  # one per group, as dispatch_batch
        if kind == "filter-listener":
            # asked per group that the map does not cover (each group of topics A and C but A-2)
            assert len(a.asked) == 4 + 4 - 1
            assert {(t, q) for t, q, _ in a.noted.log} == {(TOPICS[1], q) for q in range(4)} | {
                (TOPICS[0], 2),
                (TOPICS[0], 3),
                (TOPICS[2], 3),
            }
    finally:
        for side in sides.values():
            side.close()


# --------------------------------------------------------------------------- broker level
TOPIC = "GroupDispatchBroker"


def on_broker(body: Any) -> Any:
    """Run ``body(broker)`` on a running broker (mmap store, async flush, default plugins)."""

    def test(tmp_path: Path) -> None:
        async def main() -> None:
            async with running_broker(tmp_path, {"flush": "async"}, auto_create_topic=True) as b:
                b.topics.update(TopicConfig(TOPIC, read_queue_nums=4, write_queue_nums=4))
                await body(b)

        asyncio.run(main())

    test.__name__ = body.__name__
    test.__doc__ = body.__doc__
    return test


def _groups_to(targets: list[tuple[str, int]], tag: str) -> list[list[MessageInner]]:
    return [[message(t, q, b"x" * 20, f"{tag}-{t}-{q}-{i}") for i in range(2)] for t, q in targets]


def _delivered(broker: Any) -> list[tuple[str, int]]:
    """Wrap the store's arrival listeners: what reaches each of the broker's services."""
    got: list[tuple[str, int]] = []
    listeners = broker.store.notifier.listeners

    def wrap(listener: Any) -> Any:
        def on(topic: str, queue_id: int, max_offset: int) -> None:
            got.append((topic, queue_id))
            listener(topic, queue_id, max_offset)

        return on

    listeners[:] = [wrap(li) for li in listeners]
    return got


@on_broker
async def test_the_default_broker_takes_the_calls_path(broker: Any) -> None:
    store = broker.store
    assert store.notifier.waited() is not None  # the four services registered in the map
    effects = group_put_module._effects(store)
    assert effects is not None and len(effects.calls) == len(store.reput.dispatchers)
    # the schedule's and the timer's topics are waited on from the start, nothing else
    assert store.arrival_interest().waited == {SCHEDULE_TOPIC: True, TIMER_TOPIC: True}


@on_broker
async def test_a_call_wakes_a_held_pull_and_a_pop_long_poll(broker: Any) -> None:
    store = broker.store
    interest = store.arrival_interest()
    delivered = _delivered(broker)
    max_offset = store.get_max_offset_in_queue(TOPIC, 2)
    pull = asyncio.ensure_future(broker.hold.wait(TOPIC, 2, max_offset, 10.0))
    pop = asyncio.ensure_future(broker.pop.waiters.wait([TOPIC], 10.0))
    await asyncio.sleep(0.01)
    assert interest.waited == {SCHEDULE_TOPIC: True, TIMER_TOPIC: True, TOPIC: True}
    # a call whose groups go to other queues first: the pull stays held, the pop is woken
    store.put_message_groups(_groups_to([("OtherTopic", 0), (TOPIC, 0)], "a"))
    assert await asyncio.wait_for(pop, 5) is True
    await asyncio.sleep(0.05)
    assert not pull.done()
    assert interest.waited == {SCHEDULE_TOPIC: True, TIMER_TOPIC: True, TOPIC: frozenset({2})}
    store.put_message_groups(_groups_to([(TOPIC, 1), (TOPIC, 2), (TOPIC, 3)], "b"))
    assert await asyncio.wait_for(pull, 5) is True
    await asyncio.sleep(0.05)
    assert interest.waited == {SCHEDULE_TOPIC: True, TIMER_TOPIC: True}
    # only the waited-on queues were delivered to the listeners
    assert sorted(set(delivered)) == [(TOPIC, 0), (TOPIC, 2)]


@on_broker
async def test_a_call_wakes_the_schedule_and_the_timer(broker: Any) -> None:
    store = broker.store
    delivered = _delivered(broker)
    groups = _groups_to([(TOPIC, 0), (SCHEDULE_TOPIC, 1), (TIMER_TOPIC, 0)], "s")
    for m in groups[1]:
        m.properties["DELAY"] = "2"
        m.properties["REAL_TOPIC"] = TOPIC
        m.properties["REAL_QID"] = "0"
    store.put_message_groups(groups)
    for _ in range(100):
        if (SCHEDULE_TOPIC, 1) in delivered and (TIMER_TOPIC, 0) in delivered:
            break
        await asyncio.sleep(0.01)
    assert (SCHEDULE_TOPIC, 1) in delivered and (TIMER_TOPIC, 0) in delivered
    assert (TOPIC, 0) not in delivered


def test_a_store_without_the_map_still_wakes_held_pulls_and_pops(tmp_path: Path) -> None:
    """The memory store has no ArrivalInterests: the services pass their own filters, as before."""

    async def main() -> None:
        async with running_broker(tmp_path, {"store": "memory"}, auto_create_topic=True) as broker:
            store = broker.store
            assert arrival_interest(store) is None
            max_offset = store.get_max_offset_in_queue(TOPIC, 1)
            pull = asyncio.ensure_future(broker.hold.wait(TOPIC, 1, max_offset, 10.0))
            pop = asyncio.ensure_future(broker.pop.waiters.wait([TOPIC], 10.0))
            await asyncio.sleep(0.01)
            assert broker.hold.is_waited_on(TOPIC, 1) and broker.pop.waiters.is_waited_on(TOPIC, 0)
            for group in _groups_to([(TOPIC, 0), (TOPIC, 1)], "m"):
                store.put_messages(group)
            assert await asyncio.wait_for(pull, 5) is True
            assert await asyncio.wait_for(pop, 5) is True

    asyncio.run(main())


class Failing(GroupRecorder):
    def dispatch_groups(self, puts: Sequence[Any]) -> None:
        raise RuntimeError("injected")


def test_a_failing_group_dispatcher_is_logged_and_the_puts_stand(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    side = Side(tmp_path, "failing")
    try:
        after = GroupRecorder()
        side.store.reput.dispatchers.insert(0, Failing())
        side.store.add_dispatcher(after)
        groups = _groups_to([(TOPICS[0], 0), (TOPICS[0], 1)], "f")
        results = [f.result(10) for f in side.store.put_message_groups(groups)]
        assert all(r.ok for r in results)
        assert "dispatcher" in caplog.text and "injected" in caplog.text
        assert [p[:2] for p in after.puts] == [(TOPICS[0], 0), (TOPICS[0], 1)]  # the next one still called
        assert after.calls == 1
    finally:
        side.close()

"""``timerOffsetBehind`` (and ``rocketmq_timer_enqueue_lag``) under a confirm offset.

In controller mode the timer's enqueue reads rmq_sys_wheel_timer only up to the confirm offset
(:class:`tidemq.broker.confirmed.ReadBound`).  RocketMQ 5 reports the consume queue's max offset,
which its reput fills only up to the confirm offset, minus the timer's read offset: a parked
message the in-sync set has not acknowledged is not behind.  A real mmap store, the real
``ReadBound``, over a replication that holds a confirm offset where the test puts it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tidemq.broker.confirmed import ReadBound
from tidemq.broker.timer import TIMER_TOPIC
from tidemq.broker.timer.figures import TimerFiguresOf
from tidemq.broker.timer.schedule import TimerSchedule
from tidemq.store import MessageStore
from tidemq.testing.store_contract import build_store, message, put

pytestmark = pytest.mark.timeout(60)


class HeldConfirm:
    """A replication that confirms reads up to :attr:`offset` (None: no bound), as the controller's."""

    def __init__(self) -> None:
        self.offset: int | None = None
        self.listeners: list[Callable[[], None]] = []

    def confirm_offset(self) -> int | None:
        return self.offset

    def bind_confirm_listener(self, listener: Callable[[], None]) -> None:
        self.listeners.append(listener)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[MessageStore]:
    s = build_store("mmap", tmp_path / "store", flush="async")
    assert s.load()
    s.start()
    try:
        yield s
    finally:
        s.shutdown()


def test_parked_messages_past_the_confirm_offset_are_not_behind(store: MessageStore) -> None:
    ends = [put(store, message(topic=TIMER_TOPIC, body=b"parked %d" % i)) for i in range(5)]
    assert all(r.ok for r in ends)
    replication = HeldConfirm()
    bound = ReadBound(store, replication)
    schedule = TimerSchedule(1000, 64, 30, 0)
    schedule.queue_offset = 1  # the enqueue read the first one
    figures = TimerFiguresOf(schedule, store, bound)

    # The in-sync set holds the first three: the enqueue can read two more, not four.
    replication.offset = ends[2].wrote_offset + ends[2].wrote_bytes
    assert bound.max_offset(TIMER_TOPIC, 0) == 3
    assert figures.enqueue_behind() == 2
    assert figures.runtime_info()["timerOffsetBehind"] == "2"
    assert figures.metric_values()["rocketmq_timer_enqueue_lag"] == 2
    assert figures.backlog() == schedule.pending + 2

    # Acknowledged up to the end: all four are behind; the enqueue caught up: none.
    replication.offset = ends[-1].wrote_offset + ends[-1].wrote_bytes
    assert figures.enqueue_behind() == 4
    schedule.queue_offset = 5
    assert figures.enqueue_behind() == 0


def test_without_a_bound_every_stored_message_is_behind(store: MessageStore) -> None:
    """No replication that confirms reads (master/slave, none): the store's end, as before."""
    for i in range(3):
        assert put(store, message(topic=TIMER_TOPIC, body=b"parked %d" % i)).ok
    schedule = TimerSchedule(1000, 64, 30, 0)
    assert TimerFiguresOf(schedule, store, ReadBound(store, None)).enqueue_behind() == 3
    assert TimerFiguresOf(schedule, store).enqueue_behind() == 3

"""The confirm offset when slaves join a SYNC master's in-sync set (``InSyncTracker``).

Sends stored while the set is the master alone and below ``min_in_sync_replicas`` are answered
SLAVE_NOT_AVAILABLE; the slaves copy them all the same and report their end.  When they join the
set, the confirm offset (what every member holds: consumers read up to it) must be what they
hold: before, it stayed at the acknowledgement of the set before them (the master's start) until
a later write was acknowledged, so on an idle group those messages were never readable (the
flaky ``test_pop_failover`` controller test: its 64 sends raced the set's forming and POP
received nothing in 20 s).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from tidemq_controller.sync_set import InSyncTracker
from tidemq_ha_replication.api import GroupTransfer


def slave(broker_id: int, offset: int) -> SimpleNamespace:
    """A connected HA slave as the tracker reads it, caught up at ``offset`` just now."""
    return SimpleNamespace(
        broker_id=broker_id, closed=threading.Event(), caught_up_at=time.monotonic(), ack_offset=offset
    )


def test_slaves_that_join_the_set_raise_the_confirm_offset_to_what_they_hold() -> None:
    end = 20_059  # the master's log: 64 sends answered SLAVE_NOT_AVAILABLE
    transfer = GroupTransfer()
    transfer.acked = 0  # the master's start: every new send ends past it
    options = SimpleNamespace(min_in_sync_replicas=2, sync_set_timeout_s=3.0, slave_fall_behind_max=1 << 30)
    store = SimpleNamespace(get_max_phy_offset=lambda: end)
    tracker = InSyncTracker(1, (1,), options, store, transfer)
    confirmed: list[int | None] = []
    tracker.on_confirm = lambda: confirmed.append(tracker.confirm_offset())
    try:
        assert tracker.precheck(end) is not None  # alone, below min_in_sync_replicas: refused
        assert tracker.confirm_offset() is None  # the master alone: no bound
        # Both slaves copied everything and said so while not waited for; idle, they repeat it.
        for b in (2, 3):
            tracker.on_slave_ack(b, end)
            tracker.on_slave_ack(b, end)
        assert confirmed == []
        tracker.server = SimpleNamespace(connections=[slave(2, end), slave(3, end)])  # type: ignore[assignment]
        remove, target = tracker._plan()
        assert remove == () and target == (1, 2, 3) and tracker.required == (1, 2, 3)
        # What every member holds (before: 0, the 64 messages unreadable until a later write).
        assert tracker.confirm_offset() == end
        assert confirmed == [end]  # held pulls and POPs at the bound are woken
        assert transfer.wait(end, 1.0).result(0) is not None  # a send up to it is acknowledged at once
    finally:
        transfer.shutdown()


def test_a_slave_behind_the_acknowledged_end_does_not_join() -> None:
    transfer = GroupTransfer()
    transfer.acked = 5_000
    options = SimpleNamespace(min_in_sync_replicas=2, sync_set_timeout_s=3.0, slave_fall_behind_max=1 << 30)
    tracker = InSyncTracker(1, (1, 2), options, SimpleNamespace(get_max_phy_offset=lambda: 9_000), transfer)
    try:
        tracker.on_slave_ack(2, 9_000)
        assert tracker.confirm_offset() == 9_000
        tracker.on_slave_ack(3, 4_000)  # not a member, behind what the set acknowledged
        tracker.server = SimpleNamespace(connections=[slave(2, 9_000), slave(3, 4_000)])  # type: ignore[assignment]
        tracker._plan()
        assert tracker.required == (1, 2) and tracker.confirm_offset() == 9_000
    finally:
        transfer.shutdown()

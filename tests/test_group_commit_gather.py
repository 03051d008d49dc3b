"""Loop rounds that gather (``[flush.sync] loop_gather_us``, issue 38).

After a round of many loop puts (closed-loop senders), the next round waits, at most
``loop_gather_us``, until as many bytes as that round flushed (plus what was pending when it ended)
are there, so one ``fdatasync`` covers the senders it released as well; every put is still
resolved only by a flush that covers it.  A lone sender (small rounds) never waits.
"""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

from tidemq.futures import StoreFuture, resolved
from tidemq_flush import GroupCommitFlush, SyncFlushOptions


class CountingDisk:
    """A Flushable that records what each flush made durable (what was written before it)."""

    def __init__(self) -> None:
        self.written = 0
        self.flushed_where = 0
        self.flushes: list[int] = []
        self.lock = threading.Lock()

    def commit(self, least_pages: int = 0) -> int:
        return self.written

    def flush(self, least_pages: int = 0) -> int:
        with self.lock:
            self.flushed_where = max(self.flushed_where, self.written)
            self.flushes.append(self.flushed_where)
            return self.flushed_where


def _put(policy: GroupCommitFlush, disk: CountingDisk, size: int = 100) -> tuple[int, Future[str]]:
    with disk.lock:
        disk.written += size
        end = disk.written
    fut: Future[str] = StoreFuture()
    policy.submit(end, fut, "durable", lambda: "timeout")
    return end, fut


async def _durable(policy: GroupCommitFlush, disk: CountingDisk, futs: list[tuple[int, Future[str]]]) -> None:
    for end, fut in futs:
        assert await resolved(fut) == "durable"
        # Resolved only by a flush that covered its bytes.
        assert any(flushed >= end for flushed in disk.flushes)


def test_after_a_big_round_the_senders_it_released_share_the_next_flush() -> None:
    disk = CountingDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, loop_gather_us=2_000_000))
    policy.start(disk)

    async def senders() -> None:
        first = [_put(policy, disk) for _ in range(10)]  # one iteration: a round of 10 puts
        await _durable(policy, disk, first)
        assert len(disk.flushes) == 1
        # The senders it released come back in two halves, 20 ms apart: one flush for both.
        half = [_put(policy, disk) for _ in range(5)]
        await asyncio.sleep(0.02)
        assert not any(fut.done() for _, fut in half)  # waiting for the rest, not flushed yet
        rest = [_put(policy, disk) for _ in range(5)]
        await _durable(policy, disk, half + rest)
        assert len(disk.flushes) == 2 and disk.flushes[-1] == disk.written

    try:
        asyncio.run(senders())
        assert policy.gathered_rounds == 1
    finally:
        policy.shutdown()


def test_without_loop_gather_each_half_is_its_own_round() -> None:
    disk = CountingDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, loop_gather_us=0))
    policy.start(disk)

    async def senders() -> None:
        await _durable(policy, disk, [_put(policy, disk) for _ in range(10)])
        half = [_put(policy, disk) for _ in range(5)]
        await asyncio.sleep(0.02)
        rest = [_put(policy, disk) for _ in range(5)]
        await _durable(policy, disk, half + rest)
        assert len(disk.flushes) == 3

    try:
        asyncio.run(senders())
        assert policy.gathered_rounds == 0
    finally:
        policy.shutdown()


def test_the_gathering_wait_is_bounded_by_loop_gather_us() -> None:
    disk = CountingDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, loop_gather_us=50_000))
    policy.start(disk)

    async def senders() -> float:
        await _durable(policy, disk, [_put(policy, disk) for _ in range(10)])
        started = time.monotonic()
        fewer = [_put(policy, disk) for _ in range(3)]  # never reaches the last round's bytes
        await _durable(policy, disk, fewer)
        return time.monotonic() - started

    async def more_misses(times: int) -> None:
        for _ in range(times):
            await _durable(policy, disk, [_put(policy, disk) for _ in range(10)])
            await _durable(policy, disk, [_put(policy, disk) for _ in range(3)])

    try:
        waited = asyncio.run(senders())
        assert 0.04 <= waited < 2.0
        assert policy.gathered_rounds == 1 and policy.gather_timeouts == 1 and len(disk.flushes) == 2
        # Three misses in a row (the senders do not come back in time): the rounds after them
        # start at once for a while.
        asyncio.run(more_misses(2))
        assert policy.gather_timeouts == 3
        asyncio.run(more_misses(2))
        assert policy.gather_timeouts == 3 and policy.gathered_rounds == 3
    finally:
        policy.shutdown()


def test_a_lone_sender_never_waits_to_gather() -> None:
    disk = CountingDisk()
    # A window long enough that a round waiting in it would show in the time.
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, loop_gather_us=500_000))
    policy.start(disk)

    async def sender() -> float:
        started = time.monotonic()
        for _ in range(20):
            await _durable(policy, disk, [_put(policy, disk) for _ in range(2)])
        return time.monotonic() - started

    try:
        assert asyncio.run(sender()) < 2.0
        assert policy.gathered_rounds == 0 and policy.flush_rounds == 20
    finally:
        policy.shutdown()

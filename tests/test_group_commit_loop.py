"""Group commit for writers on an event loop (issue 38): one round per loop iteration's puts.

The broker puts every send from its event loop.  Those puts do not wake the flush thread one by
one: the first put of an iteration schedules one kick at its end, and the round starts there,
without the gathering wait writer threads get (the kick is their gathering).  A loop that never
runs its kick (blocked in ``result()``) still has its puts flushed, a moment later.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from tidemq.futures import StoreFuture, resolved
from tidemq_flush import GroupCommitFlush, SyncFlushOptions


class CountingDisk:
    """A Flushable that records what each flush made durable (it covers what was written before it)."""

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


def _put(policy: GroupCommitFlush, disk: CountingDisk, size: int = 100) -> Future[str]:
    with disk.lock:
        disk.written += size
        end = disk.written
    fut: Future[str] = StoreFuture()
    policy.submit(end, fut, "durable", lambda: "timeout")
    return fut


def test_the_puts_of_one_loop_iteration_share_one_round_and_never_gather(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gathered: list[int] = []
    real_gather = GroupCommitFlush._gather

    def spy(self: GroupCommitFlush) -> None:
        gathered.append(len(self._pending))
        real_gather(self)

    monkeypatch.setattr(GroupCommitFlush, "_gather", spy)
    disk = CountingDisk()
    # A long gathering window: a loop writer's round that waited in it would show in ``gathered``.
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, batch_wait_us=200_000, batch_idle_us=50_000))
    policy.start(disk)

    async def writers(rounds: int, count: int) -> list[str]:
        results: list[str] = []
        for _ in range(rounds):
            futs = [_put(policy, disk) for _ in range(count)]  # one iteration: no await between them
            flushes_before = len(disk.flushes)
            results += [await resolved(f) for f in futs]
            # One flush made the whole iteration durable (the round started at its end).
            assert len(disk.flushes) == flushes_before + 1
            assert disk.flushes[-1] >= disk.written
        return results

    try:
        results = asyncio.run(writers(20, 32))
        assert results == ["durable"] * 20 * 32
        assert gathered == []
        assert policy.requests == 20 * 32 and policy.flush_rounds == 20
    finally:
        policy.shutdown()


def test_a_loop_that_blocks_on_its_put_still_gets_it_flushed() -> None:
    """The kick never runs while the loop is blocked in ``result()``: the round starts anyway."""
    disk = CountingDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000))
    policy.start(disk)

    async def blocking_writer() -> str:
        return _put(policy, disk).result(2)  # blocks the loop: its kick cannot run

    try:
        assert asyncio.run(blocking_writer()) == "durable"
        assert disk.flushed_where == disk.written
    finally:
        policy.shutdown()


def test_loop_writers_and_writer_threads_are_flushed_together() -> None:
    disk = CountingDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000))
    policy.start(disk)
    threaded: list[str] = []

    def thread_writer() -> None:
        for _ in range(200):
            threaded.append(_put(policy, disk).result(5))

    async def loop_writer() -> list[str]:
        out = []
        for _ in range(200):
            out += [await resolved(f) for f in [_put(policy, disk) for _ in range(4)]]
        return out

    try:
        threads = [threading.Thread(target=thread_writer) for _ in range(4)]
        for t in threads:
            t.start()
        assert asyncio.run(loop_writer()) == ["durable"] * 800
        for t in threads:
            t.join(10)
        assert threaded == ["durable"] * 800
        assert disk.flushed_where == disk.written
    finally:
        policy.shutdown()

"""Group commit's latency mechanics (issue 19): what a put waits for, never how long it takes.

The figures (put p99 at a fixed rate against one fsync) are in ``bench/store_bench.py``
(``sync_latency``) and ``bench/compare.py`` (``latency_fixed``); these tests pin the behaviour
behind them: a request that queues up during an fdatasync is flushed by the very next one, with
no batching timer in between, and no flush acknowledges a put it started before.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future

import pytest

from tidemq_flush import GroupCommitFlush, SyncFlushOptions


class GatedDisk:
    """A Flushable whose flush covers what was written when it started, and can be held mid-way."""

    def __init__(self) -> None:
        self.written = 0
        self.flushed_where = 0
        self.flushes: list[int] = []  # the offset each flush made durable
        self.gate = threading.Event()
        self.gate.set()
        self.in_flush = threading.Event()

    def commit(self, least_pages: int = 0) -> int:
        return self.written

    def flush(self, least_pages: int = 0) -> int:
        covered = self.written  # an fdatasync makes durable what was written before it started
        self.in_flush.set()
        self.gate.wait(10)
        self.in_flush.clear()
        self.flushed_where = max(self.flushed_where, covered)
        self.flushes.append(self.flushed_where)
        return self.flushed_where


def _submit(policy: GroupCommitFlush, disk: GatedDisk, size: int) -> tuple[int, Future[str]]:
    disk.written += size
    fut: Future[str] = Future()
    policy.submit(disk.written, fut, "durable", lambda: "timeout")
    return disk.written, fut


def test_a_request_queued_during_a_flush_is_flushed_next_without_waiting_to_gather(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The fdatasync in progress was the batching window of the requests that came meanwhile:
    they are flushed as soon as it returns, not after a gathering wait (batch_wait_us) as well."""
    gathered: list[int] = []
    real_gather = GroupCommitFlush._gather

    def spy(self: GroupCommitFlush) -> None:
        gathered.append(len(self._pending))
        real_gather(self)

    monkeypatch.setattr(GroupCommitFlush, "_gather", spy)
    disk = GatedDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, batch_wait_us=1000))
    policy.start(disk)
    try:
        disk.gate.clear()
        end_a, fut_a = _submit(policy, disk, 100)
        assert disk.in_flush.wait(5)  # A's flush has started and is held
        end_b, fut_b = _submit(policy, disk, 100)
        end_c, fut_c = _submit(policy, disk, 100)
        assert not fut_b.done()
        rounds_before = len(gathered)
        disk.gate.set()
        assert fut_a.result(5) == "durable"
        assert fut_b.result(5) == "durable" and fut_c.result(5) == "durable"
        # A's round started from idle (it may let running writers join); B and C's did not.
        assert len(gathered) == rounds_before
        # A was acknowledged by a flush that covered it; B and C only by a later one.
        assert disk.flushes[0] == end_a < end_b
        assert disk.flushes[-1] >= end_c
    finally:
        disk.gate.set()
        policy.shutdown()


def test_a_put_is_never_acknowledged_by_a_flush_that_started_before_it() -> None:
    disk = GatedDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, batch_wait_us=0))
    policy.start(disk)
    try:
        for _ in range(20):
            disk.gate.clear()
            _end_a, fut_a = _submit(policy, disk, 10)
            assert disk.in_flush.wait(5)
            end_b, fut_b = _submit(policy, disk, 10)
            # Held inside A's flush: B's bytes came after it started, so B must still wait.
            assert not fut_b.done()
            disk.gate.set()
            assert fut_a.result(5) == "durable" and fut_b.result(5) == "durable"
            assert disk.flushed_where >= end_b
    finally:
        disk.gate.set()
        policy.shutdown()

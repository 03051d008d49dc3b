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
from typing import Any

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


class GatedDisk(CountingDisk):
    """A CountingDisk whose flush waits for ``gate`` (a stuck fdatasync) and says when it started."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.in_flush = threading.Event()

    def flush(self, least_pages: int = 0) -> int:
        self.in_flush.set()
        self.gate.wait()
        return super().flush(least_pages)


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


class CountingLoop(asyncio.SelectorEventLoop):
    """Counts the asyncio futures made and the wake-ups from other threads."""

    def __init__(self) -> None:
        super().__init__()
        self.futures_made = 0
        self.threadsafe_calls = 0

    def create_future(self) -> asyncio.Future[Any]:
        self.futures_made += 1
        return super().create_future()

    def call_soon_threadsafe(self, *args: Any, **kwargs: Any) -> asyncio.Handle:
        self.threadsafe_calls += 1
        return super().call_soon_threadsafe(*args, **kwargs)


def test_a_round_costs_the_loop_one_future_and_one_wake_up_not_one_per_put() -> None:
    disk = CountingDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000))
    policy.start(disk)
    loop = CountingLoop()

    async def writer(results: list[str]) -> None:
        results.append(await resolved(_put(policy, disk)))

    async def rounds() -> list[str]:
        results: list[str] = []
        for _ in range(10):
            # 32 tasks put in one iteration and wait for their round together.
            await asyncio.gather(*(writer(results) for _ in range(32)))
        return results

    try:
        before = loop.futures_made, loop.threadsafe_calls
        results = loop.run_until_complete(rounds())
        assert results == ["durable"] * 320 and policy.flush_rounds == 10
        futures = loop.futures_made - before[0]
        wakeups = loop.threadsafe_calls - before[1]
        # gather's own future, and one future per round that the 32 puts await together
        # (a future per put made 33 per round).
        assert futures <= 10 * 2, futures
        assert wakeups <= 10, wakeups
    finally:
        loop.close()
        policy.shutdown()


def test_a_cancelled_waiter_does_not_cancel_the_others_of_its_round() -> None:
    disk = GatedDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, inline_max_us=0))
    policy.start(disk)

    async def scenario() -> list[str]:
        disk.gate.clear()
        held = _put(policy, disk)  # its round holds the disk: the next puts wait together
        await asyncio.sleep(0)
        assert disk.in_flush.wait(5)
        futs = [_put(policy, disk) for _ in range(4)]  # one iteration: one round
        tasks = [asyncio.ensure_future(resolved(f)) for f in futs]
        await asyncio.sleep(0.01)  # every task waits on the round's shared future
        tasks[1].cancel()
        await asyncio.sleep(0.01)
        assert not any(t.done() for t in (tasks[0], tasks[2], tasks[3]))
        disk.gate.set()
        out = [await t for t in (tasks[0], tasks[2], tasks[3])]
        assert tasks[1].cancelled()
        assert futs[1].result(5) == "durable"  # the put itself is durable all the same
        return out + [await resolved(held)]

    try:
        assert asyncio.run(scenario()) == ["durable"] * 4
    finally:
        disk.gate.set()
        policy.shutdown()


def test_a_round_that_times_out_wakes_its_waiters() -> None:
    disk = GatedDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=300, inline_max_us=0))
    policy.start(disk)

    async def scenario() -> list[str]:
        disk.gate.clear()
        futs = [_put(policy, disk) for _ in range(3)]
        return list(await asyncio.wait_for(asyncio.gather(*(resolved(f) for f in futs)), 5))

    try:
        assert asyncio.run(scenario()) == ["timeout"] * 3
    finally:
        disk.gate.set()
        policy.shutdown()


def test_puts_of_one_round_awaited_by_coroutines_driven_outside_a_task() -> None:
    """The transport runs a request eagerly (``coro.send(None)``) up to its first wait and hands
    what it yielded to a Task later: two such requests waiting on one round must both work."""
    disk = GatedDisk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, inline_max_us=0))
    policy.start(disk)

    async def finish(coro: Any, yielded: Any) -> Any:
        while True:  # as the transport's _resume: wait for what it yielded, step it again
            yielded._asyncio_future_blocking = False
            await yielded
            try:
                yielded = coro.send(None)
            except StopIteration as stop:
                return stop.value

    async def scenario() -> list[str]:
        disk.gate.clear()
        first, second = _put(policy, disk), _put(policy, disk)  # one iteration: one round
        tasks = []
        for fut in (first, second):
            coro = resolved(fut)
            yielded = coro.send(None)  # eagerly, outside a Task: suspends on the round's future
            tasks.append(asyncio.ensure_future(finish(coro, yielded)))
        disk.gate.set()
        return list(await asyncio.gather(*tasks))

    try:
        assert asyncio.run(scenario()) == ["durable", "durable"]
    finally:
        disk.gate.set()
        policy.shutdown()


def test_low_rate_rounds_are_flushed_on_the_loop_without_a_wake_up_and_big_ones_on_the_thread() -> None:
    """A lone put's round: flushed at the kick on the loop's thread, its waiter resumed with no
    wake-up from another thread.  A round of more than ``INLINE_MAX_PUTS`` puts: the flush thread's."""
    from tidemq_flush.group_commit import INLINE_MAX_PUTS

    threads: list[str] = []

    class Disk(CountingDisk):
        def flush(self, least_pages: int = 0) -> int:
            threads.append(threading.current_thread().name)
            return super().flush(least_pages)

    disk = Disk()
    policy = GroupCommitFlush(SyncFlushOptions(timeout_ms=5000, inline_max_us=1_000_000))
    policy.start(disk)
    loop = CountingLoop()

    async def rounds() -> list[str]:
        out = [await resolved(_put(policy, disk)) for _ in range(10)]  # one put per round
        big = [_put(policy, disk) for _ in range(INLINE_MAX_PUTS + 1)]  # one iteration: one round
        return out + [await resolved(f) for f in big]

    try:
        wakes = loop.threadsafe_calls
        results = loop.run_until_complete(rounds())
        assert results == ["durable"] * (10 + INLINE_MAX_PUTS + 1)
        assert threads[:10] == [threading.current_thread().name] * 10
        assert policy.inline_rounds == 10
        assert threads[10] == "group-commit"  # the big round
        assert loop.threadsafe_calls - wakes == 1  # the big round's one hop back; none for the ten
        assert disk.flushed_where == disk.written
    finally:
        loop.close()
        policy.shutdown()

"""The timer checkpoint (``config/timercheck``) is not rewritten while the timer service is idle.

It was rewritten every ``timer_flush_interval_ms`` (a temp file, its ``fsync``, a rename and a
directory ``fsync``: two journal commits a second on the store's disk, beside sync flush's rounds)
even with no timer message anywhere.  While nothing waits and nothing new reached the timer log only
``lastReadTimeMs`` moves, and a restart from the older checkpoint walks ticks that hold nothing, so
it is written every ``IDLE_REWRITE_S`` then; with work, every interval as before.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import runtime_info, wait_for
from test_delay_schedule import MQ, Collector
from test_timer_messages import TIMER, run

from tidemq.broker.timer.checkpoint import IDLE_REWRITE_S, CheckpointWriter, TimerCheckpoint
from tidemq.client import Message, Producer


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every ``fsync``/``fdatasync`` of this test's thread (the real call made)."""
    calls: list[str] = []
    me = threading.get_ident()
    for name in ("fsync", "fdatasync"):
        real = getattr(os, name)

        def counted(fd: int, _real=real, _name=name) -> None:
            if threading.get_ident() == me:
                calls.append(_name)
            _real(fd)

        monkeypatch.setattr(os, name, counted)
    yield calls


def test_an_idle_checkpoint_is_written_only_every_idle_rewrite_s(tmp_path: Path, syncs: list[str]) -> None:
    path = tmp_path / "config" / "timercheck"
    writer = CheckpointWriter(path)
    cp = TimerCheckpoint(1_000, 500, 7, 100, 72_002, {})
    assert writer.needed(cp, 0, now=0.0)  # the first one always
    writer.save(cp, 0, now=0.0)
    assert len(syncs) == 2 and TimerCheckpoint.load(path) == cp
    syncs.clear()
    for t in range(1, int(IDLE_REWRITE_S)):  # idle: only the read time moves
        assert not writer.needed(TimerCheckpoint(1_000 + 100 * t, 500, 7, 100, 72_002, {}), 0, now=float(t))
    later = TimerCheckpoint(7_000, 500, 7, 100, 72_002, {})
    assert writer.needed(later, 0, now=IDLE_REWRITE_S)
    assert not writer.needed(cp, 5, now=1.0)  # nothing changed at all
    # Any work: written at every interval.
    assert writer.needed(TimerCheckpoint(1_100, 600, 7, 100, 72_002, {}), 0, now=1.0)  # the log grew
    assert writer.needed(TimerCheckpoint(1_100, 500, 8, 100, 72_002, {}), 0, now=1.0)  # enqueued
    assert writer.needed(TimerCheckpoint(1_100, 500, 7, 100, 72_002, {"T": 1}), 0, now=1.0)
    assert writer.needed(TimerCheckpoint(1_100, 500, 7, 100, 72_002, {}), 1, now=1.0)  # waiting
    writer.save(TimerCheckpoint(1_100, 500, 7, 100, 72_002, {"T": 1}), 1, now=1.0)
    # The last written one had a message waiting: its delivery is written at the next interval.
    assert writer.needed(TimerCheckpoint(1_200, 500, 7, 100, 72_002, {}), 0, now=2.0)
    assert syncs == ["fsync", "fsync"]


def test_a_delivery_after_an_idle_stretch_touches_the_checkpoint_once_per_half_interval(
    tmp_path: Path, syncs: list[str]
) -> None:
    """What the delivery asks before its puts (``TimerMessageStore._mark_current``): whether the
    file was neither written nor touched for half an interval; a touch moves the mtime, no sync."""
    path = tmp_path / "config" / "timercheck"
    writer = CheckpointWriter(path)
    assert writer.stale(0.5)  # never written
    writer.touch()  # no file yet: nothing to touch, still stale
    assert writer.stale(0.5) and not path.exists()
    writer.save(TimerCheckpoint(1_000, 500, 7, 100, 72_002, {}), 0)
    assert not writer.stale(0.5)
    assert writer.stale(0.5, now=time.monotonic() + 0.5)  # idle for half an interval
    os.utime(path, (1_000_000, 1_000_000))  # as after a long idle stretch
    syncs.clear()
    writer.touch()
    assert os.stat(path).st_mtime > time.time() - 60 and not syncs
    assert not writer.stale(0.5)


def test_an_idle_broker_does_not_rewrite_its_timer_checkpoint(spawn, tmp_path: Path) -> None:
    mq = MQ(spawn, tmp_path, **TIMER)  # a checkpoint every 100 ms
    path = mq.data / "config" / "timercheck"
    deadline = time.monotonic() + 20
    while not path.exists():
        assert time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(0.3)
    before = os.stat(path)
    time.sleep(1.5)  # 15 intervals
    after = os.stat(path)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), "rewritten while idle"

    async def send() -> None:
        async with Producer("timer-idle-pg", mq.ns) as producer:
            await producer.send(Message("TimerIdle", b"t", properties={"TIMER_DELAY_SEC": "30"}))

    asyncio.run(send())
    deadline = time.monotonic() + 10
    while os.stat(path).st_ino == before.st_ino:  # work: written again at the next interval
        assert time.monotonic() < deadline, "not written after a timer message"
        time.sleep(0.05)
    assert TimerCheckpoint.load(path).timing_count == {"TimerIdle": 1}


@pytest.mark.slow
def test_sigkill_right_after_a_delivery_that_ended_an_idle_stretch_counts_the_repeat(
    spawn, tmp_path: Path
) -> None:
    """Idle (nothing waiting: the checkpoint neither rewritten nor touched), then a timer message
    due within the interval, delivered, and the broker SIGKILLed before the next checkpoint.  The
    restart walks again from the checkpoint's old tick and delivers it again: that repeat must be
    counted (``timerRecoveredRedeliveries``).  Recovery counts what is due before the checkpoint's
    mtime + one interval + one tick; the mtime was the idle stretch's start, so it was not (the
    holding case's sibling: ``test_timer_flush.py``)."""
    interval_s = 3.0
    mq = MQ(spawn, tmp_path, timer_precision_ms=100, timer_flush_interval_ms=3000, timer_max_delay_sec=3600)
    topic = "TimerIdleKill"
    path = mq.data / "config" / "timercheck"

    async def main() -> tuple[str, int]:
        async with Producer("timer-ik-pg", mq.ns) as producer:
            await producer.send(Message(topic, b"warm-up"))  # the topic's config on disk first
            assert wait_for(lambda: topic in (mq.data / "config" / "topics.json").read_text(), 10)
            assert wait_for(path.exists, 20)
            # The checkpoint loop wakes about every interval after its first write: send just
            # after a wake-up at least two intervals on (the mtime then older than the window
            # recovery counts), so the delivery and the kill come well before the next one.
            written = os.stat(path).st_mtime
            wake = written + 2 * interval_s
            while wake < time.time() + 0.2:
                wake += interval_s
            await asyncio.sleep(wake + 0.3 - time.time())
            before = TimerCheckpoint.load(path)
            assert before is not None and os.stat(path).st_mtime == written, "rewritten while idle"
            collector = Collector(mq, "timer-ik-cg", topic)
            await collector.consumer.start()
            try:
                r = await producer.send(Message(topic, b"soon", properties={"TIMER_DELAY_MS": "300"}))
                deadline = time.monotonic() + 20
                while b"soon" not in collector.bodies():
                    assert time.monotonic() < deadline, "soon was not delivered"
                    await asyncio.sleep(0.01)
                mq.broker.stop(signal.SIGKILL)  # within the interval of the delivery
            finally:
                await collector.consumer.shutdown()
        after = TimerCheckpoint.load(path)
        assert after is not None and after.last_timer_queue_offset == before.last_timer_queue_offset, (
            "the checkpoint was written after the send: the kill came too late to test anything"
        )
        return r.msg_id, before.last_read_time_ms

    soon_id, _ = run(main(), timeout=90)
    mq.start_broker()

    async def collect() -> list[bytes]:
        collector = Collector(mq, "timer-ik-cg2", topic)
        await collector.consumer.start()
        try:
            deadline = time.monotonic() + 30
            while soon_id not in {m.uniq_key for _, m in collector.got}:
                assert time.monotonic() < deadline, "lost the timer message"
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.5)  # the repeat too
        finally:
            await collector.consumer.shutdown()
        return collector.bodies()

    bodies = run(collect(), timeout=90)
    # Delivered again after the restart: the tick walk starts at the idle stretch's checkpoint.
    assert bodies.count(b"soon") == 2, bodies
    info = runtime_info(mq.broker_addr)
    assert int(info["timerRecoveredRedeliveries"]) >= 1, info  # the repeat is counted

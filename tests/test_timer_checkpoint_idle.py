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
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_delay_schedule import MQ
from test_timer_messages import TIMER

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

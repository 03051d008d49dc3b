"""The timer store's flush costs what the timer traffic changed, not the wheel's size.

The wheel (16 MiB at the defaults, up to 1 GiB) was ``msync``-ed whole at every checkpoint, and the
checkpoint rewritten (two ``fsync``) every ``timer_flush_interval_ms`` while messages waited, even
when none came and none was due.  Now a flush ``msync``-s the pages of the slots written since the
last one (none: no call), and a holding broker's checkpoint is not rewritten while unchanged (its
mtime is brought forward instead, for recovery's re-delivery count).
"""

from __future__ import annotations

import asyncio
import mmap
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import runtime_info, wait_for
from test_delay_schedule import MQ, Collector
from test_timer_messages import TIMER, run

from tidemq.broker.timer.checkpoint import CheckpointWriter, TimerCheckpoint
from tidemq.broker.timer.timer_wheel import SLOT_SIZE, TimerWheel
from tidemq.client import Message, Producer

#: 3 days at 1 s: the default wheel (518 402 slots, 16 MiB).
SLOTS = 518_402
PAGE = mmap.PAGESIZE


def test_the_dirty_range_is_the_pages_of_the_slots_written(tmp_path: Path) -> None:
    wheel = TimerWheel(tmp_path / "timerwheel", SLOTS)
    try:
        assert wheel.dirty_range() is None  # a new wheel: nothing written
        wheel.put(7, 0, 48, 2)
        assert wheel.dirty_range() == (0, PAGE)
        wheel.flush()
        assert wheel.dirty_range() is None
        tick = 10 * PAGE // SLOT_SIZE + 3  # a slot in page 10, then one in page 12
        wheel.put(tick, 96, 96, 1)
        wheel.put(tick + 2 * PAGE // SLOT_SIZE, 144, 144, 1)
        assert wheel.dirty_range() == (10 * PAGE, 3 * PAGE)
        wheel.put(tick + SLOTS, 192, 192, 1)  # the same slot a turn later: the same page
        assert wheel.dirty_range() == (10 * PAGE, 3 * PAGE)
        wheel.flush()
        wheel.put(SLOTS - 1, 240, 240, 1)  # the last slot: the range ends at the file's end
        start, length = wheel.dirty_range() or (0, 0)
        assert start % PAGE == 0 and start + length == SLOTS * SLOT_SIZE
        wheel.flush()
    finally:
        wheel.close()
    again = TimerWheel(tmp_path / "timerwheel", SLOTS)
    try:
        assert not again.fresh
        slot = again.get(tick + SLOTS)
        assert slot is not None and (slot.tick, slot.first_pos, slot.num) == (tick + SLOTS, 192, 1)
        assert again.get(SLOTS - 1) is not None and again.get(7) is not None
    finally:
        again.close()


SCRIPT = """
import sys
from pathlib import Path
from tidemq.broker.timer.timer_wheel import TimerWheel
wheel = TimerWheel(Path(sys.argv[1]), {slots})
print("BEGIN", flush=True)
wheel.flush()                      # nothing written yet
wheel.put(1000, 0, 48, 1)          # one slot
wheel.flush()
wheel.flush()                      # nothing since
wheel.put(5000, 96, 96, 1)
wheel.put(5001, 144, 144, 1)       # two slots of one page
wheel.close()
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
def test_a_flush_msyncs_only_the_pages_written_since_the_last_one(tmp_path: Path) -> None:
    """Seen from the kernel's side: the ``msync`` calls a real process makes (strace), not a mock."""
    script = tmp_path / "wheel.py"
    script.write_text(textwrap.dedent(SCRIPT.format(slots=SLOTS)))
    trace = tmp_path / "strace.txt"
    proc = subprocess.run(
        ["strace", "-f", "-qq", "-e", "trace=msync", "-o", str(trace), sys.executable, str(script)]
        + [str(tmp_path / "timerwheel")],
        capture_output=True,
        timeout=60,
    )
    if proc.returncode != 0 and b"ptrace" in proc.stderr:
        pytest.skip(f"strace cannot trace here: {proc.stderr.decode()[:200]}")
    assert proc.returncode == 0, proc.stderr.decode()
    lengths = [int(m) for m in re.findall(r"msync\(0x[0-9a-f]+, (\d+), MS_SYNC\)", trace.read_text())]
    # One page for the one slot, none for the flush with nothing new, one page for the two slots
    # of one page (at close).  It was the whole 16 MiB at every flush and at close.
    assert lengths == [PAGE, PAGE], trace.read_text()


def test_an_unchanged_holding_checkpoint_is_not_rewritten() -> None:
    writer = CheckpointWriter(Path("/nonexistent/timercheck"))
    cp = TimerCheckpoint(1_000, 480, 10, 100, 72_002, {"T": 10})
    writer._last, writer._last_waiting, writer._last_at = cp, 10, 0.0  # as after a write
    # Ten waiting, none new, none due: only the read time moves.
    for t in range(1, 60):
        assert not writer.needed(TimerCheckpoint(1_000 + 100 * t, 480, 10, 100, 72_002, {"T": 10}), 10, now=t)
    assert writer.needed(
        TimerCheckpoint(7_000, 480, 10, 100, 72_002, {"T": 10}), 10, now=60.0
    )  # at most 60 s
    # Any change: written at the next interval.
    assert writer.needed(TimerCheckpoint(1_100, 480, 10, 100, 72_002, {"T": 9}), 9, now=1.0)  # one delivered
    assert writer.needed(TimerCheckpoint(1_100, 480, 10, 100, 72_002, {"T": 10}), 9, now=1.0)  # one left
    assert writer.needed(TimerCheckpoint(1_100, 528, 11, 100, 72_002, {"T": 11}), 11, now=1.0)  # enqueued
    assert writer.needed(TimerCheckpoint(1_100, 528, 10, 100, 72_002, {"T": 10}), 10, now=1.0)  # the log grew


def test_a_broker_holding_timers_does_not_rewrite_its_checkpoint(spawn, tmp_path: Path) -> None:
    """Messages waiting, none new, none due: the checkpoint stays (it was rewritten every 100 ms)."""
    mq = MQ(spawn, tmp_path, **TIMER)  # a checkpoint every 100 ms
    path = mq.data / "config" / "timercheck"

    async def send() -> None:
        async with Producer("timer-hold-pg", mq.ns) as producer:
            for i in range(5):
                await producer.send(Message("TimerHold", b"h%d" % i, properties={"TIMER_DELAY_SEC": "120"}))

    run(send())
    assert wait_for(lambda: path.exists() and b'"TimerHold":5' in path.read_bytes(), 10)
    time.sleep(0.5)
    before = os.stat(path)
    data = path.read_bytes()
    time.sleep(1.5)  # 15 intervals
    after = os.stat(path)
    assert after.st_ino == before.st_ino and path.read_bytes() == data, "rewritten while holding, unchanged"
    assert after.st_mtime_ns > before.st_mtime_ns  # its mtime says it is current (recovery's count)
    assert runtime_info(mq.broker_addr)["timerCongestNum"] == "5"


@pytest.mark.slow
def test_sigkill_right_after_a_delivery_while_holding_counts_the_repeat(spawn, tmp_path: Path) -> None:
    """Holding (checkpoint not rewritten), one message delivered, the broker SIGKILLed before the
    next checkpoint: nothing lost, and a repeat of the delivered one is counted, as when the
    checkpoint was rewritten at every interval."""
    mq = MQ(spawn, tmp_path, timer_precision_ms=100, timer_flush_interval_ms=3000, timer_max_delay_sec=3600)
    topic = "TimerHoldKill"

    async def main() -> dict[str, bytes]:
        sent: dict[str, bytes] = {}
        async with Producer("timer-hk-pg", mq.ns) as producer:
            await producer.send(Message(topic, b"warm-up"))  # the topic's config on disk first
            assert wait_for(lambda: topic in (mq.data / "config" / "topics.json").read_text(), 10)
            for body, delay in ((b"soon", "7000"), (b"later", "12000")):
                r = await producer.send(Message(topic, body, properties={"TIMER_DELAY_MS": delay}))
                sent[r.msg_id] = body
        collector = Collector(mq, "timer-hk-cg", topic)
        await collector.consumer.start()
        try:
            deadline = time.monotonic() + 20
            while b"soon" not in {m.body for _, m in collector.got}:
                assert time.monotonic() < deadline, "soon was not delivered"
                await asyncio.sleep(0.01)
            mq.broker.stop(signal.SIGKILL)  # within the interval after the delivery
        finally:
            await collector.consumer.shutdown()
        return sent

    sent = run(main(), timeout=90)
    mq.start_broker()

    async def collect() -> list[bytes]:
        collector = Collector(mq, "timer-hk-cg2", topic)
        await collector.consumer.start()
        try:
            deadline = time.monotonic() + 30
            while not set(sent) <= {m.uniq_key for _, m in collector.got}:
                assert time.monotonic() < deadline, "lost a timer"
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # late repeats too
        finally:
            await collector.consumer.shutdown()
        return [m.body for _, m in collector.got]

    bodies = run(collect(), timeout=90)
    assert bodies.count(b"later") == 1
    assert 1 <= bodies.count(b"soon") <= 2
    if bodies.count(b"soon") == 2:  # delivered again after the restart: a repeat, counted
        assert int(runtime_info(mq.broker_addr)["timerRecoveredRedeliveries"]) >= 1

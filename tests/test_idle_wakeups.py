"""An idle broker leaves its event loop asleep (session 13, loose13).

Before, an idle broker's loop woke ~46 times a second: each of the eighteen delay levels and the
timer's enqueue looked at its empty queue twice a second, the timer's dequeue walked each empty
one-second tick, the delay offsets' persist loop looked every second for nothing to write.  Now
each of those sleeps until there is work (an arrival, a record put in the wheel, an offset moved):
what is left are the loops that keep time (stats sampling, the timer's checkpoint, POP revive,
offset flush, client housekeeping).  The count is of the loop's passes (each one ``epoll_wait``
that returned), on the stdlib loop, not of CPU time: the host's load does not move it.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tidemq.message import Prop
from tidemq.plugins import get_plugin_manager
from tidemq.remoting.codes import ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.testing.pytest_plugin import running_broker
from tidemq.testing.requests import send_request

pytestmark = pytest.mark.timeout(60)

#: Loop passes a second an idle broker may make.  Measured here: 87-88 before (base 3ad62e9), 8
#: after (bench/results/2026-11-29/loose13_idle_*.json has the process's figures).
MAX_PASSES_PER_S = 20
WINDOW_S = 3.0


class _CountingLoop(asyncio.SelectorEventLoop):
    passes = 0

    def _run_once(self) -> None:  # type: ignore[override]
        self.passes += 1
        super()._run_once()  # type: ignore[misc]


def _run(coro) -> None:  # type: ignore[no-untyped-def]
    with asyncio.Runner(loop_factory=_CountingLoop) as runner:
        runner.run(coro)


def _send(topic: str, props: dict[str, str]) -> RemotingCommand:
    return send_request(topic, b"idle", props)


def test_an_idle_broker_wakes_its_loop_a_few_times_a_second(tmp_path: Path) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, _CountingLoop)
        async with running_broker(tmp_path / "b") as broker:
            await asyncio.sleep(1.5)  # start-up's own passes (registration, first looks) done
            before, t0 = loop.passes, time.monotonic()
            await asyncio.sleep(WINDOW_S)
            rate = (loop.passes - before) / (time.monotonic() - t0)
            assert rate < MAX_PASSES_PER_S, f"{rate:.1f} loop passes a second while idle"

            # Asleep, not gone: a delayed message and a timer message still go out when due.
            client = get_plugin_manager().create("transport", "tcp").client()
            try:
                r = await client.invoke(broker.address, _send("IdleDelay", {Prop.DELAY_TIME_LEVEL: "1"}), 5.0)
                assert r.code == ResponseCode.SUCCESS, r.remark
                due = str(int(time.time() * 1000) + 1500)
                r = await client.invoke(broker.address, _send("IdleTimer", {"TIMER_DELIVER_MS": due}), 5.0)
                assert r.code == ResponseCode.SUCCESS, r.remark
            finally:
                await client.close()
            sent = time.monotonic()
            store = broker.store
            while time.monotonic() - sent < 10:
                if store.get_max_offset_in_queue("IdleDelay", 0) and store.get_max_offset_in_queue(
                    "IdleTimer", 0
                ):
                    break
                await asyncio.sleep(0.05)
            took = time.monotonic() - sent
            assert store.get_max_offset_in_queue("IdleDelay", 0) == 1
            assert store.get_max_offset_in_queue("IdleTimer", 0) == 1
            assert took < 1.0 + 1.5 + 1.5, took  # level 1 is 1 s, the timer 1.5 s (+ a tick)

    _run(main())


def test_a_timer_message_after_a_long_idle_is_not_late_for_the_ticks_slept_through(tmp_path: Path) -> None:
    """The idle dequeue does not walk every tick it slept through before the next message.

    Idle for 120 days, its next tick to walk is ~10 million one-second ticks back; walked one by
    one (as after a downtime, ~1 µs a tick) a message due 1.5 s after the broker woke up went out
    ~7 s late, the loop busy meanwhile (measured: 30 days, 2.6 million ticks in 2.3 s).
    """

    async def main() -> None:
        async with running_broker(tmp_path / "b") as broker:
            schedule = broker.timers.schedule
            deadline = time.monotonic() + 10
            while not schedule.dequeue_idle and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert schedule.dequeue_idle
            # As if the broker had been idle for 120 days: nothing pending, the clock far ahead.
            idle_ticks = 120 * 86_400_000 // schedule.precision_ms
            schedule.done_tick -= idle_ticks
            schedule.claimed_tick = schedule.done_tick - 1
            client = get_plugin_manager().create("transport", "tcp").client()
            try:
                due = int(time.time() * 1000) + 1500
                r = await client.invoke(
                    broker.address, _send("IdleLong", {"TIMER_DELIVER_MS": str(due)}), 5.0
                )
                assert r.code == ResponseCode.SUCCESS, r.remark
                # A message due in the past (an hour ago) goes out at once, not on a skipped tick.
                past = int(time.time() * 1000) - 3_600_000
                r = await client.invoke(
                    broker.address, _send("IdlePast", {"TIMER_DELIVER_MS": str(past)}), 5.0
                )
                assert r.code == ResponseCode.SUCCESS, r.remark
            finally:
                await client.close()
            store = broker.store
            while time.time() * 1000 < due + 15000:
                if store.get_max_offset_in_queue("IdleLong", 0) and store.get_max_offset_in_queue(
                    "IdlePast", 0
                ):
                    break
                await asyncio.sleep(0.05)
            late_ms = time.time() * 1000 - due
            assert store.get_max_offset_in_queue("IdlePast", 0) == 1
            assert store.get_max_offset_in_queue("IdleLong", 0) == 1
            assert late_ms < 1200, f"{late_ms:.0f} ms late"  # a tick (1 s) and the poll

    _run(main())

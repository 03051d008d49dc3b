"""Periodic work keeps out of the event loop's way (issue 38, looptail).

The broker's periodic loops tick on a grid, each at its own phase, instead of all at the instant
they were started (eighteen delay levels looking at their queues in one loop pass were a ~0.4 ms
stall twice a second); an idle delay level looks at its queue's end, not at its messages; the key
index's own thread releases the GIL in its compiled calls, so the loop serves requests meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tidemq.message import Prop
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.tasks import until_tick, wait_event_until_tick
from tidemq.testing.pytest_plugin import running_broker
from tidemq_transport_tcp import (
    run,
)  # the broker's loop: uvloop when installed (its timers fire up to 1 ms early)

pytestmark = pytest.mark.timeout(60)


def test_ticks_fall_on_a_grid_at_the_phase() -> None:
    for now in (0.0, 0.1, 0.25, 0.49999, 0.5, 7.3, 1e6 + 0.123):
        for phase in (0.0, 0.25, 0.9):
            left = until_tick(0.5, phase, now)
            assert 0 < left <= 0.5 + 0.002
            # The tick lands on phase * period + k * period.
            k = (now + left - phase * 0.5) / 0.5
            assert abs(k - round(k)) < 1e-6, (now, phase, left)
    # Woken a little before the tick (a timer's grain): the next wait is for the tick after.
    assert until_tick(0.5, 0.0, 0.9996) == pytest.approx(0.5004)
    assert until_tick(0.5, 0.0, 0.99) == pytest.approx(0.01)
    # Two phases of one period tick apart, whenever asked.
    a, b = until_tick(1.0, 0.0, 12.34), until_tick(1.0, 0.5, 12.34)
    assert abs(abs(a - b) - 0.5) < 1e-9


def test_waiting_for_an_event_or_the_tick() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        t0 = loop.time()
        await wait_event_until_tick(event, 0.05, 0.0)  # nobody sets it: the tick does
        assert event.is_set() and loop.time() - t0 <= 0.2
        event.clear()
        loop.call_later(0.01, event.set)
        t0 = loop.time()
        await wait_event_until_tick(event, 30.0, 0.0)  # set long before the tick
        assert loop.time() - t0 < 5
        # Cancelled while waiting: the cancellation comes through, the tick's timer goes.
        event.clear()
        task = asyncio.create_task(wait_event_until_tick(event, 30.0, 0.0))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not event.is_set()

    run(main())


def _send_delayed(topic: str, level: int) -> RemotingCommand:
    from tidemq.message import properties_to_string

    fields = {
        "producerGroup": "PG",
        "topic": topic,
        "defaultTopic": "TBW102",
        "defaultTopicQueueNums": 4,
        "queueId": 0,
        "sysFlag": 0,
        "bornTimestamp": int(time.time() * 1000),
        "flag": 0,
        "properties": properties_to_string({Prop.DELAY_TIME_LEVEL: str(level), "UNIQ_KEY": "K1"}),
        "reconsumeTimes": 0,
        "unitMode": False,
    }
    return RemotingCommand.request(RequestCode.SEND_MESSAGE, fields, b"later")


def test_idle_delay_levels_look_apart_and_without_reading(tmp_path: Path, monkeypatch) -> None:
    """Eighteen idle levels: none looks while nothing arrives (before session 13: each once a
    period, spread over it; before issue 38, all in one loop pass), none reads its queue (before:
    one store read per level and look); a delayed message is still delivered when due."""
    from tidemq.broker import schedule
    from tidemq.plugins import get_plugin_manager

    period = 0.36  # 20 ms between two levels' looks
    monkeypatch.setattr(schedule, "IDLE_WAIT_S", period)

    async def main() -> None:
        async with running_broker(tmp_path / "b", delay_levels="1s " * 17 + "1s") as broker:
            service = broker.schedule
            loop = asyncio.get_running_loop()
            looks: list[tuple[float, int]] = []
            reads: list[int] = []
            deliver = service._deliver_due
            store = broker.store
            get_message = store.get_message

            async def traced_deliver(level: int, queue_id: int, delay_ms: int) -> Any:
                looks.append((loop.time(), level))
                return await deliver(level, queue_id, delay_ms)

            def traced_get(group: str, *a: Any) -> Any:
                if group == schedule.SCHEDULE_GROUP:
                    reads.append(1)
                return get_message(group, *a)

            monkeypatch.setattr(service, "_deliver_due", traced_deliver)
            monkeypatch.setattr(store, "get_message", traced_get)  # what ReadBound.get_message reads
            await asyncio.sleep(3 * period)
            # An idle level sleeps until an arrival (session 13): no look at all while nothing
            # comes (before: one look per level and period, 36 wake-ups a second at 0.5 s; before
            # issue 38, the eighteen in one loop pass).  At most one each: a look the start-up
            # still had under way.
            assert len(looks) <= 18, sorted(looks)
            assert not reads, f"{len(reads)} reads of idle schedule queues"

            client = get_plugin_manager().create("transport", "tcp").client()
            try:
                r = await client.invoke(broker.address, _send_delayed("LoopT", 1), 5.0)
                assert r.code == ResponseCode.SUCCESS, r.remark
            finally:
                await client.close()
            for _ in range(100):
                if broker.store.get_max_offset_in_queue("LoopT", 0) == 1:
                    break
                await asyncio.sleep(0.05)
            assert broker.store.get_max_offset_in_queue("LoopT", 0) == 1
            assert reads, "the level read its queue once a message was there"

    run(main())


def test_the_index_thread_releases_the_gil_and_inline_puts_keep_it(tmp_path: Path, monkeypatch) -> None:
    from tidemq_index_hash import native, service
    from tidemq_index_hash.service import THREAD_GIL_RELEASE_KEYS, HashIndex, HashIndexOptions

    if native.impl is None:
        pytest.skip("the compiled index is not built")
    index = HashIndex(tmp_path / "index", HashIndexOptions(inline_keys=256))
    index.load(True, 0)
    seen: list[tuple[str, int]] = []
    # What the compiled calls are told (``gil_release_keys``: each call's own argument).
    for name in ("hash_chunk", "hash_batch", "put_batch"):
        compiled = getattr(service, name)

        def traced(*a: Any, _compiled: Any = compiled) -> Any:
            seen.append((threading.current_thread().name, a[-1]))
            return _compiled(*a)

        monkeypatch.setattr(service, name, traced)
    try:
        k = 0

        def put(n: int) -> None:
            nonlocal k
            for _ in range(n):
                k += 1
                index.dispatch_batch(
                    "T",
                    0,
                    [{Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: f"KEY{k:020d}"}],
                    [k * 100],
                    [100],
                    [0],
                    k,
                    k,
                    [0],
                )

        put(300)  # the 256th put indexes the queue itself, on this thread
        put(10)  # left to the index thread's next round
        deadline = time.monotonic() + 10
        while not any(name == "hash-index" for name, _ in seen) and time.monotonic() < deadline:
            time.sleep(0.01)
        inline = {v for name, v in seen if name == threading.current_thread().name}
        thread = {v for name, v in seen if name == "hash-index"}
        assert inline == {0}, seen  # 0: never released
        assert thread == {THREAD_GIL_RELEASE_KEYS}, seen
        assert list(index.query("T", f"KEY{k:020d}", 10, 0, 2**62).phy_offsets) == [k * 100]
    finally:
        index.shutdown()

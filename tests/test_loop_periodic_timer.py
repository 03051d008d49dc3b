"""The timer's and POP revive's periodic loops tick apart from each other and from the rest
(issue 38, ticks: the follow-up of tests/test_loop_periodic.py).

Before, the timer's enqueue (its idle look every 0.5 s), its checkpoint (every
``timer_flush_interval_ms``) and POP revive (every second) slept a whole period after each pass
from the instant the broker started them: their passes ran in one loop turn, period after period.
Delay level 1 looked at phase 0 of its period, the instant the stats sampling takes its
per-second sample: the two ran together every second.  Now each ticks on the grid at a phase of
its own (``tidemq.tasks.until_tick``).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path
from typing import Any

import pytest

from tidemq.testing.pytest_plugin import running_broker
from tidemq_transport_tcp import run  # the broker's loop: uvloop when installed

pytestmark = pytest.mark.timeout(60)

#: Two looks this close run in one loop turn, or back to back (what a request arriving waits for),
#: as soon as the loop is a few ms late: on a loaded host, most of the time.
CLOSE_S = 0.005


def _apart(
    looks: list[tuple[float, str]], names: set[str], close: float = CLOSE_S
) -> tuple[int, int, list[Any]]:
    """Of the looks of ``names``: how many have no look of another loop within ``close``, and how
    many there are (with the looks, for a failure's message)."""
    mine = [(t, n) for t, n in looks if n in names]
    apart = sum(1 for t, n in mine if not any(abs(u - t) < close and m != n for u, m in looks))
    t0 = min((t for t, _ in looks), default=0.0)
    return apart, len(mine), sorted((round(t - t0, 4), n) for t, n in looks)


def test_timer_and_revive_loops_tick_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timer's enqueue, its checkpoint and POP revive, all at one period here: each looks about
    once a period, and their looks stand apart (before: all three in one loop turn, every period)."""
    from tidemq.broker.pop import reviver
    from tidemq.broker.timer import enqueue

    period = 0.4
    monkeypatch.setattr(enqueue, "IDLE_WAIT_S", period)
    monkeypatch.setattr(reviver, "SYNC_INTERVAL_S", period)

    async def main() -> None:
        async with running_broker(tmp_path / "b", timer_flush_interval_ms=int(period * 1000)) as broker:
            loop = asyncio.get_running_loop()
            looks: list[tuple[float, str]] = []
            timers = broker.timers
            revive = broker.pop.reviver
            enqueue_some = timers.enqueue.enqueue_some
            sample = timers.figures.sample
            follow_role = revive.follow_role

            async def traced_enqueue() -> bool:
                looks.append((loop.time(), "enqueue"))
                return await enqueue_some()

            def traced_sample(*a: Any) -> Any:  # once at the end of each checkpoint pass
                looks.append((loop.time(), "checkpoint"))
                return sample(*a)

            async def traced_follow() -> None:  # once at the start of each revive pass
                looks.append((loop.time(), "revive"))
                await follow_role()

            monkeypatch.setattr(timers.enqueue, "enqueue_some", traced_enqueue)
            monkeypatch.setattr(timers.figures, "sample", traced_sample)
            monkeypatch.setattr(revive, "follow_role", traced_follow)
            await asyncio.sleep(8 * period)
            # The enqueue, idle, sleeps until an arrival (session 13): no look while nothing comes.
            assert sum(1 for _, m in looks if m == "enqueue") <= 1, looks
            names = {"checkpoint", "revive"}
            for name in names:
                n = sum(1 for _, m in looks if m == name)
                # About once a period (a loop starved by a loaded host may miss one; a timer firing
                # a little early must not look again and again until its tick has passed).
                assert 3 <= n <= 8 * 3, (name, n, looks)
            # Apart: before, the enqueue's and revive's looks 0-4 ms apart, drifting (each sleeps a
            # period after its pass); a loop stalled past a period fires what came due meanwhile
            # in one pass, so of each loop's looks a quarter must stand apart.
            for name in names:
                apart, total, seen = _apart(looks, {name})
                assert apart * 4 >= total, (name, seen)

    run(main())


def test_delay_level_one_does_not_tick_with_the_stats_sampling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stats sample at each whole second of the loop's clock (phase 0), once; delay level 1
    looked at phase 0 of its half second: before, every sample ran in a loop turn with its look."""

    async def main() -> None:
        async with running_broker(tmp_path / "b") as broker:
            loop = asyncio.get_running_loop()
            looks: list[tuple[float, str]] = []
            service = broker.schedule
            deliver = service._deliver_due
            stats_type = type(broker.stats)  # slotted: its method is replaced on the class
            sample_second = stats_type.sample_second

            async def traced_deliver(level: int, queue_id: int, delay_ms: int) -> Any:
                looks.append((loop.time(), f"level-{level}"))
                return await deliver(level, queue_id, delay_ms)

            def traced_sample(self: Any, *a: Any) -> None:
                looks.append((loop.time(), "stats"))
                sample_second(self, *a)

            monkeypatch.setattr(service, "_deliver_due", traced_deliver)
            monkeypatch.setattr(stats_type, "sample_second", traced_sample)
            await asyncio.sleep(3.2)
            level_1 = [t for t, n in looks if n == "level-1"]
            stats = [t for t, n in looks if n == "stats"]
            # Level 1, idle, does not look at all (session 13: it sleeps until an arrival).
            assert len(level_1) <= 1 and len(stats) >= 3, looks
            # One sample a second (before, a timer firing early sampled twice: 0.0005 s left to the
            # whole second, then again at it; 7 samples in 3.2 s).
            gaps = [b - a for a, b in itertools.pairwise(stats[1:])]  # the first: from the start
            assert min(gaps) > 0.9, gaps
            apart, total, seen = _apart(looks, {"stats"}, 0.002)  # before: none, 0 ms from level 1
            assert apart * 4 >= total, seen

    run(main())

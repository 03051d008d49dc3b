"""Broker statistics (RocketMQ's BrokerStatsManager, StoreStatsService and BrokerStats).

The hot path only adds to counters: :meth:`BrokerStats.on_put` once per stored put (a batch or
coalesced sends) and :meth:`BrokerStats.on_get` once per pull answer, each a couple of integer
additions on one :class:`Counter` found with one dict lookup (a pull that found nothing only
counts a miss).  Everything else (windows,
rates, the day's totals) comes from samples that :meth:`BrokerStats.sample_loop` takes on the
broker's event loop, as RocketMQ's sampling threads do:

- per stats item (``TOPIC_PUT_NUMS`` keyed by topic, ``GROUP_GET_NUMS`` by ``topic@group``, ...):
  every 10 s for the minute window, every 10 min for the hour, every hour for the day
  (StatsItem's csListMinute/Hour/Day; VIEW_BROKER_STATS_DATA reads them);
- broker-wide, every second for the last 600 s (StoreStatsService: ``putTps`` and
  ``getTransferedTps`` over 10, 60 and 600 s);
- at local midnight, the ``msgPutTotalTodayMorning``/``YesterdayMorning`` marks (BrokerStats).

A window's figures run from its oldest sample to *now* (RocketMQ's stop at its newest sample,
up to one period old): an operator's statsAll right after a burst already sees it.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable

import attrs

from tidemq.metrics import Buckets
from tidemq.tasks import until_tick

# RocketMQ's stats names (org.apache.rocketmq.common.stats.Stats).
TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_NAMES = (
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    GROUP_GET_NUMS,
    GROUP_GET_SIZE,
    BROKER_PUT_NUMS,
    BROKER_GET_NUMS,
)

#: (sampling period in seconds, samples kept) of the minute, hour and day windows (StatsItem).
WINDOWS = {"minute": (10.0, 7), "hour": (600.0, 7), "day": (3600.0, 25)}
#: Broker-wide samples: one per second, 600 s of them (StoreStatsService).
BROKER_SAMPLES = 601
TPS_WINDOWS_S = (10, 60, 600)

#: A sample: (ms timestamp, calls, nums, size).
Sample = tuple[int, int, int, int]


def _now_ms() -> int:
    return int(time.time() * 1000)


@attrs.frozen
class StatsSnapshot:
    """One window of one stats item: sum of values, per second, and per call (avgpt)."""

    sum: int
    tps: float
    avgpt: float

    def to_json(self) -> dict[str, float | int]:
        return {"avgpt": self.avgpt, "sum": self.sum, "tps": self.tps}


class Counter:
    """Running totals of one stats key (one topic, one topic@group, the broker), with samples."""

    __slots__ = ("calls", "nums", "samples", "size")

    def __init__(self, now_ms: int) -> None:
        self.calls = 0
        self.nums = 0
        self.size = 0
        # As StatsItem does, a window starts with a zero sample one period before the first one.
        self.samples = {
            name: collections.deque([(now_ms - int(period * 1000), 0, 0, 0)], maxlen=keep)
            for name, (period, keep) in WINDOWS.items()
        }

    def sample(self, window: str, now_ms: int) -> None:
        self.samples[window].append((now_ms, self.calls, self.nums, self.size))

    def snapshot(self, window: str, size: bool, now_ms: int) -> StatsSnapshot:
        first = self.samples[window][0]
        value = (self.size - first[3]) if size else (self.nums - first[2])
        calls = self.calls - first[1]
        elapsed = max(now_ms - first[0], 1)
        return StatsSnapshot(value, value * 1000.0 / elapsed, value / calls if calls > 0 else 0.0)


@attrs.define
class BrokerStats:
    """Message counters of a broker, per topic and per consumer group, and their rates."""

    cluster: str = "DefaultCluster"
    started_at: float = attrs.field(factory=time.time)
    #: topic -> puts (TOPIC_PUT_NUMS / TOPIC_PUT_SIZE)
    topic_puts: dict[str, Counter] = attrs.field(factory=dict)
    #: "topic@group" -> messages served to pulls (GROUP_GET_NUMS / GROUP_GET_SIZE)
    group_gets: dict[str, Counter] = attrs.field(factory=dict)
    broker_put: Counter = attrs.field(factory=lambda: Counter(_now_ms()))
    broker_get: Counter = attrs.field(factory=lambda: Counter(_now_ms()))
    #: (group, topic, queue id) -> ms timestamp of the last offset commit
    commit_times: dict[tuple[str, str, int], int] = attrs.field(factory=dict)
    #: pulls that found no message (getMissTps)
    get_misses: int = 0
    #: broker-wide (ms, put nums, get nums, get calls, get misses), one per second
    recent: collections.deque[tuple[int, int, int, int, int]] = attrs.field(
        factory=lambda: collections.deque(maxlen=BROKER_SAMPLES)
    )
    #: Seconds from a send's put to the store's answer (flush included under sync flush), per put:
    #: the metrics role's histogram (RocketMQ's putMessageDistributeTime, finer).
    put_seconds: Buckets = attrs.field(factory=Buckets)
    put_total_yesterday_morning: int = 0
    put_total_today_morning: int = 0
    get_total_yesterday_morning: int = 0
    get_total_today_morning: int = 0
    _day: str = attrs.field(factory=lambda: time.strftime("%Y-%m-%d"))

    # ------------------------------------------------------------------ the hot path
    def on_put(self, topic: str, count: int, size: int) -> None:
        """A put of ``count`` messages (``size`` bytes) to ``topic`` was stored."""
        c = self.topic_puts.get(topic)
        if c is None:
            c = self.topic_puts[topic] = Counter(_now_ms())
        c.calls += 1
        c.nums += count
        c.size += size
        b = self.broker_put
        b.calls += 1
        b.nums += count
        b.size += size

    def on_get(self, group: str, topic: str, count: int, size: int) -> None:
        """A pull of ``group`` was served ``count`` messages (``size`` bytes) of ``topic``; 0: a miss."""
        if not count:
            self.get_misses += 1
            return
        key = f"{topic}@{group}"
        c = self.group_gets.get(key)
        if c is None:
            c = self.group_gets[key] = Counter(_now_ms())
        c.calls += 1
        c.nums += count
        c.size += size
        b = self.broker_get
        b.calls += 1
        b.nums += count
        b.size += size

    def remove_topic(self, topic: str) -> None:
        """Forget ``topic``'s figures (RocketMQ's onTopicDeleted): a deleted topic's counters would
        otherwise stay for the broker's life, and topics created and deleted in a loop would grow
        the tables without bound."""
        self.topic_puts.pop(topic, None)
        prefix = f"{topic}@"
        for key in [k for k in self.group_gets if k.startswith(prefix)]:
            del self.group_gets[key]
        for queue in [q for q in self.commit_times if q[1] == topic]:
            del self.commit_times[queue]

    def on_commit(self, group: str, topic: str, queue_id: int) -> None:
        self.commit_times[(group, topic, queue_id)] = _now_ms()

    # ------------------------------------------------------------------ totals since start
    @property
    def put_count(self) -> int:
        return self.broker_put.nums

    @property
    def put_bytes(self) -> int:
        return self.broker_put.size

    @property
    def get_count(self) -> int:
        return self.broker_get.nums

    @property
    def get_bytes(self) -> int:
        return self.broker_get.size

    # ------------------------------------------------------------------ sampling
    async def sample_loop(self, clock: Callable[[], float] = time.monotonic) -> None:
        """Take the samples, forever (run it as a supervised task of the broker)."""
        tick = 0
        while True:
            self.sample_second()
            if tick % 10 == 0:
                self.sample("minute")
            if tick % 600 == 0:
                self.sample("hour")
            if tick % 3600 == 0:
                self.sample("day")
            tick += 1
            # To the next whole second; a timer firing a little early (uvloop's: up to 1 ms) does
            # not make a second sample a few hundred microseconds later (until_tick's slack).
            await asyncio.sleep(until_tick(1.0, 0.0, clock()))

    def sample_second(self, now_ms: int | None = None) -> None:
        now_ms = _now_ms() if now_ms is None else now_ms
        self.recent.append(
            (now_ms, self.broker_put.nums, self.broker_get.nums, self.broker_get.calls, self.get_misses)
        )
        day = time.strftime("%Y-%m-%d", time.localtime(now_ms / 1000))
        if day != self._day:  # local midnight passed: BrokerStats.record()
            self._day = day
            self.put_total_yesterday_morning = self.put_total_today_morning
            self.put_total_today_morning = self.broker_put.nums
            self.get_total_yesterday_morning = self.get_total_today_morning
            self.get_total_today_morning = self.broker_get.nums

    def sample(self, window: str, now_ms: int | None = None) -> None:
        """Add a sample of every item to ``window`` ("minute", "hour" or "day")."""
        now_ms = _now_ms() if now_ms is None else now_ms
        for table in (self.topic_puts, self.group_gets):
            for c in table.values():
                c.sample(window, now_ms)
        self.broker_put.sample(window, now_ms)
        self.broker_get.sample(window, now_ms)

    # ------------------------------------------------------------------ reading
    def item(self, name: str, key: str) -> tuple[Counter, bool] | None:
        """The counter of stats ``name`` and ``key``, and whether it is a SIZE item; None if unknown."""
        if name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE):
            c = self.topic_puts.get(key)
        elif name in (GROUP_GET_NUMS, GROUP_GET_SIZE):
            c = self.group_gets.get(key)
        elif name == BROKER_PUT_NUMS:
            c = self.broker_put if key == self.cluster else None
        elif name == BROKER_GET_NUMS:
            c = self.broker_get if key == self.cluster else None
        else:
            c = None
        return None if c is None else (c, name.endswith("_SIZE"))

    def snapshots(self, name: str, key: str) -> dict[str, StatsSnapshot] | None:
        """Minute, hour and day figures of one item (VIEW_BROKER_STATS_DATA); None if unknown."""
        found = self.item(name, key)
        if found is None:
            return None
        counter, size = found
        now = _now_ms()
        snaps = {window: counter.snapshot(window, size, now) for window in WINDOWS}
        if name in (BROKER_PUT_NUMS, BROKER_GET_NUMS):
            # RocketMQ adds to these without counting calls: their avgpt is always 0.
            snaps = {w: attrs.evolve(s, avgpt=0.0) for w, s in snaps.items()}
        return snaps

    def group_get_tps(self, group: str, topic: str) -> float:
        """Messages per second served to ``group`` from ``topic`` over the minute (tpsGroupGetNums)."""
        c = self.group_gets.get(f"{topic}@{group}")
        return 0.0 if c is None else c.snapshot("minute", False, _now_ms()).tps

    def broker_tps(self, *fields: int, now_ms: int | None = None) -> str:
        """``"t10 t60 t600"``: a broker-wide rate per window, of the sum of ``fields`` (1 put nums,
        2 get nums, 3 pulls that found messages, 4 pulls that found none).

        Until a window has filled, it covers the samples there are (RocketMQ leaves it blank,
        which its own readers cannot parse).
        """
        now_ms = _now_ms() if now_ms is None else now_ms
        last = (now_ms, self.broker_put.nums, self.broker_get.nums, self.broker_get.calls, self.get_misses)
        samples = self.recent
        out = []
        for window in TPS_WINDOWS_S:
            first = samples[max(len(samples) - window, 0)] if samples else last
            elapsed = last[0] - first[0]
            count = sum(last[f] - first[f] for f in fields)
            out.append(f"{count * 1000.0 / elapsed if elapsed > 0 else 0.0:.2f}")
        return " ".join(out)

"""Producer queue selectors (role ``select``), after RocketMQ's MQFaultStrategy.

``round_robin`` deals queues in turn and skips the broker whose send just failed.
``latency_fault`` (the default) does the same but also remembers slow or failed brokers: a send
that took ``latency`` ms puts its broker out of rotation for the matching penalty of the
latency→penalty table, and a failed send counts as 30 s latency (the longest penalty).  The
broker comes back by itself when its penalty ends.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable, Sequence

import attrs

from tidemq import hookimpl
from tidemq.config import parse_options
from tidemq.plugins import PluginContext
from tidemq.queues import MessageQueue

# A private generator: the process's global `random` state stays the application's.
_random = random.Random()

log = logging.getLogger(__name__)

__all__ = ["LatencyFaultSelector", "RoundRobinSelector", "LATENCY_MAX_MS", "NOT_AVAILABLE_MS"]

#: A send at least this slow (ms)...
LATENCY_MAX_MS: tuple[int, ...] = (50, 100, 550, 1000, 2000, 3000, 15000)
#: ...puts its broker out of rotation for this long (ms).
NOT_AVAILABLE_MS: tuple[int, ...] = (0, 0, 30000, 60000, 120000, 180000, 600000)
#: The latency a failed send counts as (RocketMQ's isolation).
FAILURE_LATENCY_MS = 30000

Clock = Callable[[], float]  # seconds, monotonic


def _monotonic_clock() -> float:
    return time.monotonic()


class RoundRobinSelector:
    """Queues in turn per topic; after a failure the next pick avoids the failed broker.

    Each topic's turn starts at a random queue, as RocketMQ's ``ThreadLocalIndex`` does: many
    short-lived producers (one per Spark task, per CLI call...) would otherwise all begin on the
    first broker's first queue.  ``start`` fixes the first turn (tests).
    """

    name = "round_robin"

    def __init__(self, start: int | None = None) -> None:
        self._counters: dict[str, itertools.count[int]] = {}
        self._start = start

    def _next(self, topic: str) -> int:
        counter = self._counters.get(topic)
        if counter is None:
            first = self._start if self._start is not None else _random.randrange(1 << 31)
            counter = self._counters[topic] = itertools.count(first)
        return next(counter)

    def select(
        self, topic: str, queues: Sequence[MessageQueue], last_broker: str | None = None
    ) -> MessageQueue:
        if not queues:
            raise ValueError(f"topic {topic!r} has no writable queue")
        start = self._next(topic)
        n = len(queues)
        if last_broker is not None:
            for i in range(n):
                mq = queues[(start + i) % n]
                if mq.broker_name != last_broker:
                    return mq
        return queues[start % n]

    def record(self, broker_name: str, latency_ms: float, failed: bool) -> None:
        """Round-robin learns nothing."""


@attrs.define
class FaultItem:
    """What the selector remembers about one broker."""

    broker_name: str
    latency_ms: float
    available_at: float  # clock seconds


class LatencyFaultSelector(RoundRobinSelector):
    """Round-robin over the brokers not serving a latency penalty."""

    name = "latency_fault"

    def __init__(
        self,
        latency_max_ms: Sequence[float] = LATENCY_MAX_MS,
        not_available_ms: Sequence[float] = NOT_AVAILABLE_MS,
        clock: Clock = _monotonic_clock,
        start: int | None = None,
    ) -> None:
        super().__init__(start)
        if len(latency_max_ms) != len(not_available_ms) or not latency_max_ms:
            raise ValueError("latency_max_ms and not_available_ms must be non-empty and of the same length")
        if list(latency_max_ms) != sorted(latency_max_ms):
            raise ValueError("latency_max_ms must be increasing")
        self.latency_max_ms = tuple(latency_max_ms)
        self.not_available_ms = tuple(not_available_ms)
        self.clock = clock
        self._faults: dict[str, FaultItem] = {}

    def penalty_ms(self, latency_ms: float) -> float:
        """How long a broker whose send took ``latency_ms`` stays out of rotation."""
        for limit, penalty in zip(
            reversed(self.latency_max_ms), reversed(self.not_available_ms), strict=True
        ):
            if latency_ms >= limit:
                return penalty
        return 0.0

    def is_available(self, broker_name: str) -> bool:
        item = self._faults.get(broker_name)
        return item is None or self.clock() >= item.available_at

    def record(self, broker_name: str, latency_ms: float, failed: bool) -> None:
        penalty = self.penalty_ms(FAILURE_LATENCY_MS if failed else latency_ms)
        now = self.clock()
        if penalty <= 0:
            self._faults.pop(broker_name, None)
            return
        if broker_name not in self._faults or self.is_available(broker_name):
            log.info(
                "broker %s out of rotation for %.0f ms (latency %.0f ms, failed=%s)",
                broker_name,
                penalty,
                latency_ms,
                failed,
            )
        self._faults[broker_name] = FaultItem(broker_name, latency_ms, now + penalty / 1000.0)

    def select(
        self, topic: str, queues: Sequence[MessageQueue], last_broker: str | None = None
    ) -> MessageQueue:
        if not queues:
            raise ValueError(f"topic {topic!r} has no writable queue")
        start = self._next(topic)
        n = len(queues)
        ring = [queues[(start + i) % n] for i in range(n)]
        # First choice: a healthy broker other than the one that just failed.
        for mq in ring:
            if mq.broker_name != last_broker and self.is_available(mq.broker_name):
                return mq
        for mq in ring:
            if self.is_available(mq.broker_name):
                return mq
        # Everyone is penalised: try the broker whose penalty ends first (RocketMQ's pickOneAtLeast).
        candidates = [mq for mq in ring if mq.broker_name != last_broker] or ring
        soonest = min(candidates, key=lambda mq: self._faults[mq.broker_name].available_at)
        return soonest


@attrs.define
class LatencyFaultOptions:
    """``[select.latency_fault]``: the latency→penalty table in milliseconds."""

    latency_max_ms: list[float] = attrs.field(factory=lambda: list(LATENCY_MAX_MS))
    not_available_ms: list[float] = attrs.field(factory=lambda: list(NOT_AVAILABLE_MS))


def _latency_fault(ctx: PluginContext) -> LatencyFaultSelector:
    opts = parse_options(LatencyFaultOptions, ctx.options, f"[select.{ctx.name}]")
    try:
        return LatencyFaultSelector(opts.latency_max_ms, opts.not_available_ms)
    except ValueError as exc:
        from tidemq.errors import ConfigError

        raise ConfigError(f"[select.{ctx.name}]: {exc}") from exc


@hookimpl
def tidemq_register_queue_selectors(register) -> None:  # noqa: ANN001 - pluggy passes a Register
    register.add(
        "round_robin",
        lambda ctx: RoundRobinSelector(),
        "queues in turn, skipping the broker that just failed",
    )
    register.add(
        "latency_fault", _latency_fault, "round-robin avoiding slow/failed brokers for a penalty (default)"
    )

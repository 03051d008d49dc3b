"""Metrics contract (role ``metrics``): an exporter serving a broker's or NameServer's figures.

Optional, like ``acl``: ``[plugins] metrics = "prometheus"`` (``tidemq standalone`` turns it on by
default, on loopback).  The exporter reads what the service already keeps (its statistics, the
store's positions, the flush and replication state) when it is scraped: nothing is added to the
per-message path for it.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

__all__ = ["BATCH_BOUNDS", "LATENCY_BOUNDS", "Buckets", "MetricsExporter"]


@runtime_checkable
class MetricsExporter(Protocol):
    """Built from the config with the other roles; started once the service serves."""

    async def start(self, service: Any) -> str:
        """Serve ``service``'s metrics; returns where, as a URL for the start-up line.

        A broker hands its :class:`tidemq.context.BrokerFiguresView` (read-only), whose
        ``metrics_companions`` lists other services of the process to serve too; a NameServer
        hands itself.  Raises ``OSError`` when it cannot listen."""

    async def stop(self) -> None:
        """Stop serving; safe to call when never started."""


#: Upper bounds (seconds) of latency buckets: RocketMQ's put-time ranges, finer below 10 ms.
LATENCY_BOUNDS: tuple[float, ...] = (
    0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
)  # fmt: skip


#: Upper bounds of batch-size buckets (puts per group commit, messages per put).
BATCH_BOUNDS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class Buckets:
    """A histogram kept by the code it measures: one ``observe`` per event, read when scraped.

    Cheaper than a metrics library's histogram on a hot path (no lock: one writer thread, and a
    reader may see a count a moment ahead of the sum, which a scrape tolerates).  ``counts[i]``
    counts values <= ``bounds[i]`` and above the previous bound; the last slot counts the rest.
    """

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BOUNDS) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.count = 0
        self.total = 0.0

    def observe(self, value: float) -> None:
        i = 0
        bounds = self.bounds
        n = len(bounds)
        while i < n and value > bounds[i]:
            i += 1
        self.counts[i] += 1
        self.count += 1
        self.total += value

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, cumulative count)`` pairs, Prometheus's bucket form, ending with ``+Inf``."""
        out = []
        running = 0
        for bound, n in zip(self.bounds, self.counts, strict=False):
            running += n
            out.append((repr(float(bound)), running))
        out.append(("+Inf", running + self.counts[-1]))
        return out

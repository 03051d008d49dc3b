"""The duplicate window's figures (issue 37) as Prometheus families."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.context import BrokerFiguresView


def dedup_families(broker: BrokerFiguresView) -> list[Metric]:
    """``tidemq_dedup_dropped_total{topic}`` (resends answered from the window, not stored),
    ``tidemq_dedup_evicted_total``, and the window's size: ``tidemq_dedup_entries``,
    ``tidemq_dedup_bytes``."""
    window = broker.dedup
    dropped = CounterMetricFamily(
        "tidemq_dedup_dropped",
        "Messages answered from the duplicate window instead of being stored again, per topic",
        labels=["topic"],
    )
    for topic, count in sorted(window.dropped.items()):
        dropped.add_metric([topic], count)
    evicted = CounterMetricFamily(
        "tidemq_dedup_evicted", "Sends evicted from the duplicate window before their time (its bounds)"
    )
    evicted.add_metric([], window.evicted)
    entries = GaugeMetricFamily("tidemq_dedup_entries", "Keys the duplicate window holds")
    entries.add_metric([], window.entries)
    nbytes = GaugeMetricFamily("tidemq_dedup_bytes", "Estimated bytes the duplicate window holds")
    nbytes.add_metric([], window.nbytes)
    return [dropped, evicted, entries, nbytes]

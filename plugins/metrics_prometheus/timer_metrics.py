"""Timer messages' figures (issue 36) as Prometheus families, under RocketMQ 5's timer names."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.context import BrokerFiguresView


def timer_families(broker: BrokerFiguresView) -> list[Metric]:
    """``rocketmq_timer_*``, ``rocketmq_timing_messages{topic}`` and ``tidemq_timer_lateness_p99_ms``,
    read through the exporter's read-only view (``broker.timers.metric_values()``): a dict value is
    a gauge per topic, a ``*_total`` name a counter, anything else a gauge."""
    out: list[Metric] = []
    for name, value in broker.timers.metric_values().items():
        if isinstance(value, dict):
            gauge = GaugeMetricFamily(name, "Timer messages waiting, per topic", labels=["topic"])
            for topic, count in sorted(value.items()):
                gauge.add_metric([topic], count)
            out.append(gauge)
        elif name.endswith("_total"):
            counter = CounterMetricFamily(name[: -len("_total")], "Timer messages since start")
            counter.add_metric([], value)
            out.append(counter)
        else:
            gauge = GaugeMetricFamily(name, "Timer message service")
            gauge.add_metric([], value)
            out.append(gauge)
    return out

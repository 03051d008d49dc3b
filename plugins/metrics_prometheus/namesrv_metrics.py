"""A NameServer's figures as Prometheus metric families, read on its event loop at scrape time."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric

from tidemq import __version__

_STARTED = time.time()


def namesrv_families(namesrv: Any) -> list[Metric]:
    """Brokers alive per cluster, topics, routes: what an operator checks first on a NameServer."""
    routes = namesrv.route_info
    info = GaugeMetricFamily(
        "tidemq_namesrv_build_info", "tidemq version of this NameServer", labels=["version"]
    )
    info.add_metric([__version__], 1)
    brokers = GaugeMetricFamily(
        "tidemq_namesrv_brokers", "Broker addresses registered and alive, per cluster", labels=["cluster"]
    )
    live = set(routes.broker_live_table)
    for cluster, names in sorted(routes.cluster_addr_table.items()):
        alive = 0
        for name in names:
            data = routes.broker_addr_table.get(name)
            if data is not None:
                alive += sum(1 for addr in data.broker_addrs.values() if addr in live)
        brokers.add_metric([cluster], alive)
    topics = GaugeMetricFamily("tidemq_namesrv_topics", "Topics with a route")
    topics.add_metric([], len(routes.topic_queue_table))
    names = GaugeMetricFamily("tidemq_namesrv_broker_names", "Broker names (master/slave sets) registered")
    names.add_metric([], len(routes.broker_addr_table))
    up = GaugeMetricFamily(
        "tidemq_namesrv_uptime_seconds", "Seconds since the NameServer's metrics module loaded"
    )
    up.add_metric([], time.time() - _STARTED)
    return [info, brokers, topics, names, up]

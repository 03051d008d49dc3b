"""Prometheus metrics for brokers and NameServers (role ``metrics``: ``prometheus``, ``none``).

``[plugins] metrics = "prometheus"`` serves ``/metrics`` on ``[metrics.prometheus] listen``
(default ``127.0.0.1:5557``): rocketmq-exporter's metric names and labels where it has them, so
existing Grafana dashboards work, and tidemq's own under ``tidemq_``.  Figures are read from what
the broker keeps anyway, on its event loop, when Prometheus scrapes.
"""

from __future__ import annotations

from typing import Any

from tidemq import hookimpl
from tidemq.plugins import PluginContext, Register


def _prometheus(ctx: PluginContext) -> Any:
    from tidemq_metrics_prometheus.exporter import PrometheusExporter
    from tidemq_metrics_prometheus.options import parse_prometheus_options

    return PrometheusExporter(parse_prometheus_options(ctx.options))


def _none(ctx: PluginContext) -> Any:
    from tidemq_metrics_prometheus.exporter import NoMetrics

    return NoMetrics()


@hookimpl
def tidemq_register_metrics_exporters(register: Register) -> None:
    register.add(
        "prometheus", _prometheus, summary="Prometheus /metrics (rocketmq-exporter names + tidemq_*)"
    )
    register.add("none", _none, summary="no metrics endpoint")

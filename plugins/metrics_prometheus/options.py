"""Options of the Prometheus exporter: the ``[metrics.prometheus]`` table."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from tidemq.address import parse_address
from tidemq.config import number, parse_options


def _listen(_inst: object, attribute: attrs.Attribute, value: str) -> None:
    parse_address(value, f"listen = {value!r}", allow_port_zero=True)


@attrs.define
class PrometheusOptions:
    """``[metrics.prometheus]``."""

    #: HOST:PORT of the HTTP endpoint (``/metrics``); loopback unless you mean to expose it.
    #: Port 0 picks a free port (the start-up line says which).
    listen: str = attrs.field(default="127.0.0.1:5557", validator=_listen)
    #: Also export the process's CPU, memory and file descriptors (``process_*``).
    process_metrics: bool = True
    #: A listen address that cannot be bound fails the start; false: warn and serve no metrics
    #: (what ``tidemq standalone``'s default endpoint does, so two of them can run side by side).
    required: bool = True
    #: How long a scrape waits for the broker's event loop to read its figures.
    scrape_timeout_s: float = number(5.0, gt=0, le=60)


def parse_prometheus_options(values: Mapping[str, Any] | None) -> PrometheusOptions:
    return parse_options(PrometheusOptions, values, "[metrics.prometheus]")

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
    #: How long a scrape may take to format the figures it read; a slower one is answered 503.
    scrape_timeout_s: float = number(5.0, gt=0, le=60)
    #: A scrape within this many seconds of the last reading is answered with that reading: the
    #: broker reads its figures at most once per interval, however many scrapers there are.
    min_scrape_interval_s: float = number(1.0, ge=0, le=300)
    #: Seconds a connection has to send a request's headers (the first, or once one has started).
    header_timeout_s: float = number(5.0, gt=0, le=300)
    #: Seconds a kept-alive connection may wait for its next request before it is closed.
    idle_timeout_s: float = number(30.0, gt=0, le=3600)
    #: Connections served at once; more are closed as soon as they are accepted.
    max_connections: int = number(16, ge=1, le=10_000)
    #: Serve HTTPS with this certificate (PEM; the key too unless ``tls_keyfile`` is set).
    tls_certfile: str = ""
    #: The certificate's private key (PEM).
    tls_keyfile: str = ""
    #: With TLS: ask scrapers for a client certificate signed by this CA (PEM), refuse others.
    tls_client_cafile: str = ""
    #: Ask scrapers for HTTP basic auth with this user name (and ``basic_auth_password_file``).
    basic_auth_user: str = ""
    #: The file holding the basic-auth password (its first line); keep it 0600.
    basic_auth_password_file: str = ""

    def __attrs_post_init__(self) -> None:
        if bool(self.basic_auth_user) != bool(self.basic_auth_password_file):
            raise ValueError("basic_auth_user and basic_auth_password_file go together")
        if (self.tls_keyfile or self.tls_client_cafile) and not self.tls_certfile:
            raise ValueError("tls_keyfile and tls_client_cafile need tls_certfile")


def parse_prometheus_options(values: Mapping[str, Any] | None) -> PrometheusOptions:
    return parse_options(PrometheusOptions, values, "[metrics.prometheus]")

"""The HTTP endpoint (prometheus-client's server, in its own thread) and the scrape hand-over.

A scrape runs in the HTTP server's thread; the figures are read on the service's event loop (the
only thread that changes them), so a scrape never sees a table half-updated and the loop never
takes a lock for it.  A loop too busy to answer within ``scrape_timeout_s`` gives a scrape with
``tidemq_scrape_timeouts_total`` raised and no other service figures, never a hung scrape.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from tidemq.address import format_address, parse_address
from tidemq_metrics_prometheus.options import PrometheusOptions

log = logging.getLogger(__name__)


class NoMetrics:
    """``[plugins] metrics = "none"``: no endpoint."""

    async def start(self, service: Any) -> str:
        return ""

    async def stop(self) -> None:
        return None


class _LoopCollector(Collector):
    """Reads the service's figures on its event loop when scraped."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, read: Callable[[], list[Metric]], timeout: float
    ) -> None:
        self._loop = loop
        self._read = read
        self._timeout = timeout
        self._timeouts = 0
        self._errors = 0
        self._lock = threading.Lock()  # scrapes may overlap (one thread per request)

    def describe(self) -> list[Metric]:
        return []  # no scrape at registration

    def collect(self) -> Iterator[Metric]:
        done: concurrent.futures.Future[list[Metric]] = concurrent.futures.Future()

        def read() -> None:
            if not done.set_running_or_notify_cancel():
                return  # the scrape gave up waiting
            try:
                done.set_result(self._read())
            except Exception as exc:  # a bug in a figure must not break the endpoint
                log.exception("metrics: cannot read the service's figures")
                done.set_exception(exc)

        families: list[Metric] = []
        try:
            self._loop.call_soon_threadsafe(read)
            families = done.result(self._timeout)
        except concurrent.futures.TimeoutError:
            done.cancel()
            with self._lock:
                self._timeouts += 1
        except RuntimeError:  # the loop is closed: the service is stopping
            pass
        except Exception:
            with self._lock:
                self._errors += 1
        yield from families
        timeouts = CounterMetricFamily(
            "tidemq_scrape_timeouts",
            "Scrapes the service's event loop did not answer within scrape_timeout_s",
        )
        timeouts.add_metric([], self._timeouts)
        yield timeouts
        errors = CounterMetricFamily("tidemq_scrape_errors", "Scrapes whose figures could not be read")
        errors.add_metric([], self._errors)
        yield errors


class PrometheusExporter:
    """``[plugins] metrics = "prometheus"``: ``/metrics`` for a broker or a NameServer."""

    def __init__(self, options: PrometheusOptions) -> None:
        self.options = options
        self.url = ""
        self._server: Any = None
        self._thread: threading.Thread | None = None

    async def start(self, service: Any) -> str:
        from tidemq_metrics_prometheus.broker_metrics import broker_families
        from tidemq_metrics_prometheus.namesrv_metrics import namesrv_families

        services = [service, *getattr(service, "metrics_companions", ())]

        def read() -> list[Metric]:
            families: list[Metric] = []
            for s in services:
                families += broker_families(s) if hasattr(s, "store") else namesrv_families(s)
            return families

        registry = CollectorRegistry(auto_describe=False)
        if self.options.process_metrics:
            ProcessCollector(registry=registry)
        registry.register(_LoopCollector(asyncio.get_running_loop(), read, self.options.scrape_timeout_s))
        host, port = parse_address(self.options.listen, "[metrics.prometheus] listen", allow_port_zero=True)
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            if self.options.required:
                raise OSError(exc.errno, f"metrics endpoint {self.options.listen}: {exc.strerror}") from exc
            log.warning("no metrics endpoint: cannot listen on %s: %s", self.options.listen, exc.strerror)
            return ""
        bound = self._server.server_address[1]
        self.url = f"http://{format_address(host, bound)}/metrics"
        log.info("metrics on %s", self.url)
        return self.url

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        # shutdown() waits for serve_forever to notice: off the loop, which scrapes may be waiting on.
        await asyncio.to_thread(server.shutdown)
        server.server_close()
        if self._thread is not None:
            self._thread.join(5)

"""The HTTP endpoint, served from the service's event loop, and the throttled scrape.

``/metrics`` is served by a small HTTP/1.1 server on the service's own event loop: no thread per
connection, a deadline for a request's headers (``header_timeout_s``), for an idle keep-alive
connection (``idle_timeout_s``), a cap on open connections (``max_connections``; more are closed
at once), optional TLS and HTTP basic auth.  The figures are read on the loop (the only thread that
changes them), so a scrape never sees a table half-updated; the text is then formatted in a worker
thread.  A scrape within ``min_scrape_interval_s`` of the last one is answered from that one, and
overlapping scrapes share one reading: however many scrapers there are, the broker reads its
figures at most once per interval.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import ssl
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from tidemq.address import format_address, parse_address
from tidemq.errors import ConfigError
from tidemq_metrics_prometheus.options import PrometheusOptions

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024


class NoMetrics:
    """``[plugins] metrics = "none"``: no endpoint."""

    async def start(self, service: Any) -> str:
        return ""

    async def stop(self) -> None:
        return None


class _Families(Collector):
    """The families read on the loop for one scrape, handed to ``generate_latest``."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield from self._families


class Scraper:
    """Reads the service's figures on the loop and formats them; throttled and shared."""

    def __init__(self, read: Callable[[], list[Metric]], options: PrometheusOptions) -> None:
        self._read = read
        self._options = options
        self._process = ProcessCollector(registry=None) if options.process_metrics else None
        self._cached: bytes = b""
        self._cached_at = -1e18
        self._running: asyncio.Future[bytes] | None = None
        self.timeouts = 0
        self.errors = 0
        self.readings = 0  # how many times the figures were read (not served from the cache)

    async def scrape(self) -> bytes:
        if time.monotonic() - self._cached_at < self._options.min_scrape_interval_s:
            return self._cached
        if self._running is None:
            self._running = asyncio.ensure_future(self._scrape_once())
            self._running.add_done_callback(self._finished)
        return await asyncio.shield(self._running)

    def _finished(self, fut: asyncio.Future[bytes]) -> None:
        self._running = None
        if not fut.cancelled() and fut.exception() is None:
            self._cached, self._cached_at = fut.result(), time.monotonic()

    async def _scrape_once(self) -> bytes:
        self.readings += 1
        families: list[Metric] = []
        try:
            families = self._read()
        except Exception:  # a bug in a figure must not break the endpoint
            log.exception("metrics: cannot read the service's figures")
            self.errors += 1
        families += self._own_families()
        registry = CollectorRegistry(auto_describe=False)
        if self._process is not None:
            registry.register(self._process)
        registry.register(_Families(families))
        try:
            return await asyncio.wait_for(
                asyncio.to_thread(generate_latest, registry), self._options.scrape_timeout_s
            )
        except TimeoutError:
            self.timeouts += 1
            raise

    def _own_families(self) -> list[Metric]:
        timeouts = CounterMetricFamily(
            "tidemq_scrape_timeouts",
            "Scrapes that could not be formatted within scrape_timeout_s",
        )
        timeouts.add_metric([], self.timeouts)
        errors = CounterMetricFamily("tidemq_scrape_errors", "Scrapes whose figures could not be read")
        errors.add_metric([], self.errors)
        readings = CounterMetricFamily(
            "tidemq_scrape_readings", "Scrapes that read the figures (the others reused a recent one)"
        )
        readings.add_metric([], self.readings)
        return [timeouts, errors, readings]


def _basic_auth(options: PrometheusOptions) -> bytes | None:
    """The expected ``Authorization`` header value, or None without basic auth."""
    if not options.basic_auth_user:
        return None
    path = Path(options.basic_auth_password_file).expanduser()
    try:
        if path.stat().st_mode & 0o077:
            raise ConfigError(
                f"[metrics.prometheus] basic_auth_password_file {str(path)!r} is readable by others: "
                f"chmod 600 {path}"
            )
        lines = path.read_text().splitlines()
        password = lines[0].strip() if lines else ""
    except OSError as exc:
        raise ConfigError(
            f"[metrics.prometheus] basic_auth_password_file = {str(path)!r}: {exc.strerror}"
        ) from None
    if not password:
        raise ConfigError(f"[metrics.prometheus] basic_auth_password_file {str(path)!r} is empty")
    token = base64.b64encode(f"{options.basic_auth_user}:{password}".encode()).decode()
    return f"Basic {token}".encode()


def _tls(options: PrometheusOptions) -> ssl.SSLContext | None:
    if not options.tls_certfile:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(options.tls_certfile, options.tls_keyfile or None)
        if options.tls_client_cafile:
            ctx.load_verify_locations(options.tls_client_cafile)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"[metrics.prometheus] TLS files: {exc}") from None
    return ctx


def _response(
    status: str, body: bytes, content_type: str = "text/plain; charset=utf-8", **extra: str
) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}", f"Content-Length: {len(body)}"]
    head += [f"{k.replace('_', '-')}: {v}" for k, v in extra.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class MetricsServer:
    """``/metrics`` over HTTP/1.1 on the running event loop, bounded in time and connections."""

    def __init__(
        self,
        scraper: Scraper,
        options: PrometheusOptions,
        *,
        auth: bytes | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.scraper = scraper
        self.options = options
        self.auth = auth
        self.tls = tls
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(
            self._serve,
            host,
            port,
            ssl=self.tls,
            ssl_handshake_timeout=self.options.header_timeout_s if self.tls is not None else None,
            backlog=128,
            limit=MAX_HEADER_BYTES,
        )
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if self.connections >= self.options.max_connections:
            writer.transport.abort()  # over the cap: no thread, no buffer, no answer
            return
        self.connections += 1
        if task is not None:
            self._tasks.add(task)
        try:
            await self._requests(reader, writer)
        except (OSError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            self.connections -= 1
            if task is not None:
                self._tasks.discard(task)
            writer.close()  # flushes what is left of the answer, then closes
            try:
                await asyncio.wait_for(writer.wait_closed(), self.options.idle_timeout_s)
            except (TimeoutError, OSError, ssl.SSLError):
                writer.transport.abort()

    async def _requests(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opts = self.options
        first = True
        while True:
            try:
                if first:  # the whole head within header_timeout_s of the connection
                    head = await asyncio.wait_for(_read_head(reader, b""), opts.header_timeout_s)
                else:  # kept alive: the next request starts within idle_timeout_s
                    line = await asyncio.wait_for(reader.readuntil(b"\r\n"), opts.idle_timeout_s)
                    head = await asyncio.wait_for(_read_head(reader, line), opts.header_timeout_s)
            except TimeoutError:
                return
            except (asyncio.LimitOverrunError, _HeadTooLarge):
                writer.write(
                    _response(
                        "431 Request Header Fields Too Large", b"headers too large\n", Connection="close"
                    )
                )
                await writer.drain()
                return
            first = False
            keep_alive = await self._answer(head, writer)
            # A scraper that does not read its answer is given idle_timeout_s, not for ever.
            await asyncio.wait_for(writer.drain(), opts.idle_timeout_s)
            if not keep_alive:
                return

    async def _answer(self, head: bytes, writer: asyncio.StreamWriter) -> bool:
        lines = head.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            writer.write(_response("400 Bad Request", b"bad request line\n", Connection="close"))
            return False
        method, target, version = parts
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if headers.get("content-length", "0") != "0" or "transfer-encoding" in headers:
            # A scrape has no body; reading one would be a way to hold the connection.
            writer.write(_response("400 Bad Request", b"no request body expected\n", Connection="close"))
            return False
        keep_alive = headers.get("connection", "").lower() != "close" and version == "HTTP/1.1"
        conn = {"Connection": "keep-alive" if keep_alive else "close"}
        if method not in ("GET", "HEAD"):
            writer.write(_response("405 Method Not Allowed", b"GET /metrics\n", Allow="GET, HEAD", **conn))
            return keep_alive
        if self.auth is not None and not hmac.compare_digest(
            headers.get("authorization", "").encode("latin-1"), self.auth
        ):
            writer.write(
                _response(
                    "401 Unauthorized",
                    b"credentials needed\n",
                    WWW_Authenticate='Basic realm="tidemq"',
                    **conn,
                )
            )
            return keep_alive
        path = target.split("?", 1)[0]
        if path not in ("/metrics", "/"):
            writer.write(_response("404 Not Found", b"GET /metrics\n", **conn))
            return keep_alive
        try:
            body = await self.scraper.scrape()
        except Exception:
            writer.write(_response("503 Service Unavailable", b"the scrape did not finish in time\n", **conn))
            return keep_alive
        response = _response("200 OK", body, CONTENT_TYPE_LATEST, **conn)
        writer.write(response if method == "GET" else response[: len(response) - len(body)])
        return keep_alive


class _HeadTooLarge(Exception):
    pass


async def _read_head(reader: asyncio.StreamReader, first: bytes) -> bytes:
    """The request line and headers (without the blank line ending them)."""
    lines = [first] if first.strip() else []
    size = len(first)
    while True:
        line = await reader.readuntil(b"\r\n")
        size += len(line)
        if size > MAX_HEADER_BYTES:
            raise _HeadTooLarge
        if line == b"\r\n":
            if lines:
                return b"".join(lines)
            continue  # blank lines before a request line are tolerated (RFC 9112 2.2)
        lines.append(line)


class PrometheusExporter:
    """``[plugins] metrics = "prometheus"``: ``/metrics`` for a broker or a NameServer."""

    def __init__(self, options: PrometheusOptions) -> None:
        self.options = options
        self.url = ""
        self._server: MetricsServer | None = None
        # Read when the exporter is made, so check-config reports a bad file in one line.
        self._auth = _basic_auth(options)
        self._tls = _tls(options)

    async def start(self, service: Any) -> str:
        from tidemq_metrics_prometheus.broker_metrics import broker_families
        from tidemq_metrics_prometheus.namesrv_metrics import namesrv_families

        services = [service, *getattr(service, "metrics_companions", ())]

        def read() -> list[Metric]:
            families: list[Metric] = []
            for s in services:
                families += broker_families(s) if hasattr(s, "store") else namesrv_families(s)
            return families

        host, port = parse_address(self.options.listen, "[metrics.prometheus] listen", allow_port_zero=True)
        server = MetricsServer(Scraper(read, self.options), self.options, auth=self._auth, tls=self._tls)
        try:
            bound = await server.start(host, port)
        except OSError as exc:
            if self.options.required:
                raise OSError(exc.errno, f"metrics endpoint {self.options.listen}: {exc.strerror}") from exc
            log.warning("no metrics endpoint: cannot listen on %s: %s", self.options.listen, exc.strerror)
            return ""
        self._server = server
        scheme = "https" if server.tls is not None else "http"
        self.url = f"{scheme}://{format_address(host, bound)}/metrics"
        log.info("metrics on %s", self.url)
        return self.url

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.stop()

"""The metrics endpoint under attack on loopback (issue 41, item 6): half-sent requests, a flood of
scrapes, missing credentials; and the same endpoint over TLS with basic auth."""

from __future__ import annotations

import base64
import concurrent.futures
import shutil
import socket
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from test_metrics_prometheus import _sample, _scrape
from test_metrics_prometheus import _standalone as _metrics_standalone

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.config import parse_options
from tidemq.errors import ConfigError
from tidemq_metrics_prometheus.exporter import PrometheusExporter
from tidemq_metrics_prometheus.options import PrometheusOptions

pytestmark = pytest.mark.timeout(120)


def _standalone(spawn: Any, tmp_path: Path, extra: str = "") -> tuple[Any, str]:
    """A standalone broker with ``extra`` ``[metrics.prometheus]`` lines; its /metrics URL."""
    return _metrics_standalone(spawn, tmp_path, metrics=extra)


def _threads(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    raise AssertionError("no Threads line")


def test_half_sent_requests_hold_no_threads_and_time_out(spawn: Any, tmp_path: Path) -> None:
    # Before: one thread per connection, no timeout: 300 half-sent requests made 313 threads.
    server, url = _standalone(spawn, tmp_path)  # the defaults: header_timeout_s 5, max_connections 16
    pid = server.proc.pid
    assert _sample(_scrape(url), "tidemq_messages_put_total") is not None
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)
    threads, fds = _threads(pid), len(list(Path(f"/proc/{pid}/fd").iterdir()))
    held = []
    for _ in range(300):
        s = socket.create_connection((host, int(port)), timeout=5)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        held.append(s)
    time.sleep(0.3)
    assert _threads(pid) - threads < 5
    assert len(list(Path(f"/proc/{pid}/fd").iterdir())) - fds < 40  # the cap: 16 kept, the rest closed
    # The broker answers meanwhile.
    namesrv = server.addresses["namesrv"]
    with BlockingProducer("metrics-attack-pg", namesrv) as producer:
        assert producer.send(Message("MetricsAttack", b"x")).status is SendStatus.SEND_OK
    deadline = time.monotonic() + 10
    for s in held:  # every half-sent request is dropped within header_timeout_s
        s.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            assert s.recv(100) == b""
        except ConnectionResetError:
            pass
        s.close()
    assert _sample(_scrape(url), "tidemq_messages_put_total") == 1


def test_scrapes_are_throttled(spawn: Any, tmp_path: Path) -> None:
    # Before: every scrape read every figure on the broker's loop, however many came.
    _, url = _standalone(spawn, tmp_path, "min_scrape_interval_s = 3.0\nmax_connections = 64\n")
    first = _sample(_scrape(url), "tidemq_scrape_readings_total")
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        bodies = list(pool.map(lambda _: _scrape(url), range(40)))
    readings = {_sample(b, "tidemq_scrape_readings_total") for b in bodies}
    assert first is not None and readings <= {first, first + 1}
    time.sleep(3.2)
    assert _sample(_scrape(url), "tidemq_scrape_readings_total") == max(readings) + 1


def _openssl(*args: str) -> None:
    import subprocess

    subprocess.run(["openssl", *args], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_tls_and_basic_auth(spawn: Any, tmp_path: Path) -> None:
    crt, key = tmp_path / "m.crt", tmp_path / "m.key"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
             "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1")  # fmt: skip
    secret = tmp_path / "metrics.pass"
    secret.write_text("scrape-pass-123\n")
    secret.chmod(0o600)
    _, url = _standalone(
        spawn,
        tmp_path,
        f'tls_certfile = "{crt}"\ntls_keyfile = "{key}"\n'
        f'basic_auth_user = "prom"\nbasic_auth_password_file = "{secret}"\n',
    )
    assert url.startswith("https://")
    ctx = ssl.create_default_context(cafile=str(crt))

    def get(auth: str | None) -> int:
        req = urllib.request.Request(url)
        if auth is not None:
            req.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
        try:
            with urllib.request.urlopen(req, timeout=10, context=ctx) as resp:
                assert b"tidemq_messages_put_total" in resp.read()
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return exc.code

    assert get(None) == 401
    assert get("prom:wrong") == 401
    assert get("prom:scrape-pass-123") == 200
    with pytest.raises(OSError):  # plain HTTP on the TLS port: closed without an answer
        urllib.request.urlopen(url.replace("https://", "http://"), timeout=5)


def test_bad_auth_and_tls_options_are_one_line_errors(tmp_path: Path) -> None:
    secret = tmp_path / "metrics.pass"
    secret.write_text("pw\n")
    secret.chmod(0o644)

    def make(**values: Any) -> PrometheusExporter:
        return PrometheusExporter(parse_options(PrometheusOptions, values, "[metrics.prometheus]"))

    with pytest.raises(ConfigError, match="readable by others"):
        make(basic_auth_user="prom", basic_auth_password_file=str(secret))
    with pytest.raises(ConfigError, match="go together"):
        make(basic_auth_user="prom")
    with pytest.raises(ConfigError, match="TLS files"):
        make(tls_certfile=str(tmp_path / "missing.crt"))
    with pytest.raises(ConfigError, match="max_connections"):
        make(max_connections=0)


def test_keep_alive_idle_and_bad_requests(spawn: Any, tmp_path: Path) -> None:
    _, url = _standalone(spawn, tmp_path, "idle_timeout_s = 1.0\n")
    host, port = url.split("//", 1)[1].split("/", 1)[0].rsplit(":", 1)

    def exchange(s: socket.socket, request: bytes) -> bytes:
        s.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(b":")[1]
        )
        while len(body) < length:
            body += s.recv(65536)
        return head.split(b"\r\n")[0]

    with socket.create_connection((host, int(port)), timeout=5) as s:
        for _ in range(2):  # kept alive
            assert exchange(s, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n") == b"HTTP/1.1 200 OK"
        assert exchange(s, b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 405")
        assert exchange(s, b"GET /secret HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 404")
        start = time.monotonic()
        assert s.recv(10) == b""  # idle_timeout_s without a request: closed
        assert time.monotonic() - start < 3
    with socket.create_connection((host, int(port)), timeout=5) as s:
        big = b"GET /metrics HTTP/1.1\r\n" + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n"
        assert exchange(s, big).startswith(b"HTTP/1.1 431")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        body = b"GET /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello"
        assert exchange(s, body).startswith(b"HTTP/1.1 400")

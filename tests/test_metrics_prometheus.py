"""The Prometheus endpoint, scraped by a real Prometheus server (Debian's ``prometheus`` package).

A ``tidemq standalone`` serves ``/metrics``; a Prometheus started by the test scrapes it every
second; messages are sent at a known pace and a consumer group commits part of them; PromQL over
Prometheus's HTTP API then returns the send rate, the topic's offset and the group's lag.
``.ci/run`` installs the package; elsewhere the Prometheus part is skipped unless
``TIDEMQ_REQUIRE_SERVERS=1`` says it must run.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import commit_offset, free_port, require_server, wait_for

from tidemq.client import BlockingProducer, Message, SendStatus
from tidemq.client.admin import AdminClient, topic_fields
from tidemq.remoting.codes import RequestCode

pytestmark = pytest.mark.timeout(180)

TOPIC = "MetricsTopic"
GROUP = "metrics-group"


def _scrape(url: str) -> dict[str, float]:
    """``name{labels}`` -> value of every sample on the endpoint."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def _sample(samples: dict[str, float], name: str, **labels: str) -> float | None:
    for key, value in samples.items():
        if key == name or key.startswith(name + "{"):
            if all(f'{k}="{v}"' in key for k, v in labels.items()):
                return value
    return None


def _standalone(
    spawn: Any,
    tmp_path: Path,
    metrics_port: int | None = None,
    metrics: str = "",
    plugins: str = "",
    tail: str = "",
) -> tuple[Any, str]:
    """A standalone broker serving /metrics; its URL.  ``metrics``: more ``[metrics.prometheus]``
    lines, ``plugins``: more ``[plugins]`` lines, ``tail``: more sections."""
    config = tmp_path / "metrics.toml"
    port = free_port() if metrics_port is None else metrics_port
    config.write_text(
        f'[plugins]\nmetrics = "prometheus"\n{plugins}\n'
        f'[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n{metrics}{tail}'
    )
    server = spawn(
        "standalone",
        "-c",
        str(config),
        "--data-dir",
        str(tmp_path / "data"),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
    )
    line = server.proc.stdout.readline().decode()
    assert line.startswith(("tidemq broker metrics on http://", "tidemq broker metrics on https://")), line
    return server, line.rsplit(" ", 1)[1].strip()


def _create_topic(namesrv: str, broker: str) -> None:
    async def main() -> None:
        client = AdminClient(namesrv)
        try:
            await client.call(broker, RequestCode.UPDATE_AND_CREATE_TOPIC, topic_fields(TOPIC, 1, 1, 6))
        finally:
            await client.close()

    asyncio.run(main())


def test_endpoint_serves_rocketmq_exporter_names(spawn: Any, tmp_path: Path) -> None:
    server, url = _standalone(spawn, tmp_path, free_port())
    namesrv, broker = server.addresses["namesrv"], server.addresses["broker"]
    _create_topic(namesrv, broker)
    with BlockingProducer("metrics-pg", namesrv) as producer:
        for i in range(30):
            assert producer.send(Message(TOPIC, b"m%03d" % i)).status is SendStatus.SEND_OK
    commit_offset(namesrv, broker, GROUP, TOPIC, 0, 12)
    samples = _scrape(url)
    assert _sample(samples, "rocketmq_producer_offset", topic=TOPIC, cluster="DefaultCluster") == 30
    assert _sample(samples, "rocketmq_consumer_offset", topic=TOPIC, group=GROUP) == 12
    assert _sample(samples, "rocketmq_group_diff", group=GROUP, topic=TOPIC, msgModel="1") == 18
    age = _sample(samples, "rocketmq_group_get_latency_by_storetime", topic=TOPIC, group=GROUP)
    assert age is not None and 0 < age < 120_000
    assert _sample(samples, "tidemq_messages_put_total") == 30
    # Per-minute rates (RocketMQ's stats items): 30 messages within the first minute.
    assert (_sample(samples, "rocketmq_producer_tps", topic=TOPIC) or 0) > 0
    assert (_sample(samples, "rocketmq_producer_message_size", topic=TOPIC) or 0) > 0
    assert (_sample(samples, "rocketmq_broker_tps", cluster="DefaultCluster") or 0) > 0
    assert _sample(samples, "rocketmq_brokeruntime_put_tps600") is not None
    assert _sample(samples, "tidemq_namesrv_brokers", cluster="DefaultCluster") == 1
    assert (_sample(samples, "tidemq_store_disk_bytes", kind="commitlog") or 0) > 0
    assert (_sample(samples, "process_resident_memory_bytes") or 0) > 0
    # Garbage on the endpoint's socket gets an error answer (or a close); the endpoint serves on.
    import socket

    host, port = urllib.parse.urlparse(url).netloc.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(b"\x00\xff GARBAGE " + b"A" * 70000 + b"\r\n\r\n")
        try:
            sock.recv(1024)
        except OSError:
            pass
    assert _sample(_scrape(url), "tidemq_messages_put_total") == 30


def test_standalone_serves_metrics_by_default_and_tolerates_a_taken_port(spawn: Any, tmp_path: Path) -> None:
    """Without a [plugins] metrics key `tidemq standalone` serves on 127.0.0.1:5557; when that port
    is taken it warns and runs on (two standalones side by side)."""
    first = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "a"),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
    )
    second = spawn(
        "standalone",
        "--data-dir",
        str(tmp_path / "b"),
        "--namesrv-listen",
        "127.0.0.1:0",
        "--broker-listen",
        "127.0.0.1:0",
    )
    # Each logs where it serves metrics, or that it serves none (the other one, or something else
    # on this machine, has the port).
    servers = (first, second)

    def settled() -> bool:
        return all(
            "metrics on http://" in (text := srv.log_path.read_text()) or "no metrics endpoint" in text
            for srv in servers
        )

    assert wait_for(settled, 20)
    serving = [
        srv for srv in servers if "metrics on http://127.0.0.1:5557/metrics" in srv.log_path.read_text()
    ]
    assert len(serving) <= 1
    if serving:
        assert _sample(_scrape("http://127.0.0.1:5557/metrics"), "tidemq_uptime_seconds") is not None
    refused = [srv for srv in servers if srv not in serving]
    for srv in refused:
        assert "no metrics endpoint: cannot listen on 127.0.0.1:5557" in srv.log_path.read_text()
    for srv in servers:
        assert srv.proc.poll() is None, "a standalone stopped over its metrics port"


def test_a_taken_configured_port_is_a_one_line_error(spawn: Any, tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        config = tmp_path / "m.toml"
        config.write_text(
            f'[plugins]\nmetrics = "prometheus"\n\n[metrics.prometheus]\nlisten = "127.0.0.1:{port}"\n'
        )
        out = subprocess.run(
            [
                "tidemq",
                "broker",
                "-c",
                str(config),
                "--listen",
                "127.0.0.1:0",
                "--namesrv",
                "127.0.0.1:1",
                "--data-dir",
                str(tmp_path / "d"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"},
        )
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tidemq: error:") and f"metrics endpoint 127.0.0.1:{port}" in last, out.stderr
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------------------- a real Prometheus


def _prometheus_binary() -> str:
    return require_server("prometheus", package="prometheus")


def _query(prom: str, expr: str) -> list[dict[str, Any]]:
    url = f"http://{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=10) as resp:
        body = orjson.loads(resp.read())
    assert body["status"] == "success", body
    return body["data"]["result"]


def _value(prom: str, expr: str) -> float | None:
    result = _query(prom, expr)
    return float(result[0]["value"][1]) if result else None


def test_real_prometheus_scrapes_rates_and_lag(spawn: Any, tmp_path: Path) -> None:
    binary = _prometheus_binary()
    server, url = _standalone(spawn, tmp_path, free_port())
    namesrv, broker = server.addresses["namesrv"], server.addresses["broker"]
    _create_topic(namesrv, broker)
    target = urllib.parse.urlparse(url).netloc
    prom_port = free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: tidemq\n"
        f"    static_configs:\n      - targets: ['{target}']\n"
    )
    log = open(tmp_path / "prometheus.log", "wb")
    prom = subprocess.Popen(
        [
            binary,
            f"--config.file={tmp_path / 'prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prom_port}",
        ],
        stdout=log,
        stderr=log,
    )
    addr = f"127.0.0.1:{prom_port}"
    try:
        assert wait_for(lambda: _ready(addr), 30), (tmp_path / "prometheus.log").read_text()[-2000:]
        assert wait_for(lambda: _value(addr, 'up{job="tidemq"}') == 1.0, 30)
        # 20 messages a second for 6 seconds.
        with BlockingProducer("metrics-pg", namesrv) as producer:
            start = time.monotonic()
            for i in range(120):
                delay = start + i / 20 - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                assert producer.send(Message(TOPIC, b"r%03d" % i)).status is SendStatus.SEND_OK
        commit_offset(namesrv, broker, GROUP, TOPIC, 0, 100)
        assert wait_for(
            lambda: _value(addr, f'rocketmq_group_diff{{group="{GROUP}",topic="{TOPIC}"}}') == 20.0, 20
        )
        assert _value(addr, f'rocketmq_producer_offset{{topic="{TOPIC}"}}') == 120.0
        rate = _value(addr, "max_over_time(rate(tidemq_messages_put_total[3s])[10s:1s])")
        assert rate is not None and 12 <= rate <= 30, rate
        # The Grafana-dashboard form: lag summed over brokers per group.
        total = _value(addr, f'sum by (group) (rocketmq_group_diff{{group="{GROUP}"}})')
        assert total == 20.0
    finally:
        prom.terminate()
        try:
            prom.wait(15)
        except subprocess.TimeoutExpired:
            prom.kill()
        log.close()


def _ready(addr: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{addr}/-/ready", timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def test_sync_flush_histograms_and_namesrv_endpoint(spawn: Any, tmp_path: Path) -> None:
    """Under sync flush every put waits for a flush round: the flush-latency and group-commit
    histograms count them.  A `tidemq namesrv` with the metrics role serves its own endpoint."""
    ns_port = free_port()
    ns_config = tmp_path / "ns.toml"
    ns_config.write_text(
        f'[plugins]\nmetrics = "prometheus"\n\n[metrics.prometheus]\nlisten = "127.0.0.1:{ns_port}"\n'
    )
    ns = spawn("namesrv", "-c", str(ns_config), "--listen", "127.0.0.1:0")
    line = ns.proc.stdout.readline().decode()
    assert line.strip() == f"tidemq namesrv metrics on http://127.0.0.1:{ns_port}/metrics"
    metrics_port = free_port()
    config = tmp_path / "broker.toml"
    config.write_text(
        f'[broker]\nlisten = "127.0.0.1:0"\nnamesrv = ["{ns.addresses["namesrv"]}"]\ndata_dir = "{tmp_path / "data"}"\n\n'
        f'[plugins]\nflush = "sync"\nmetrics = "prometheus"\n\n[metrics.prometheus]\nlisten = "127.0.0.1:{metrics_port}"\n'
    )
    broker = spawn("broker", "-c", str(config))
    url = f"http://127.0.0.1:{metrics_port}/metrics"
    namesrv = ns.addresses["namesrv"]
    _create_topic(namesrv, broker.addresses["broker"])
    with BlockingProducer("metrics-pg", namesrv) as producer:
        for i in range(10):
            assert producer.send(Message(TOPIC, b"s%03d" % i)).status is SendStatus.SEND_OK
    samples = _scrape(url)
    assert (_sample(samples, "tidemq_group_commit_batch_size_count") or 0) >= 1
    # One observation per put (a send here), each at least as long as the flush it waited for.
    assert _sample(samples, "tidemq_put_latency_seconds_count") == 10
    assert (_sample(samples, "tidemq_put_latency_seconds_sum") or 0) > 0
    assert (_sample(samples, "tidemq_flush_latency_seconds_count") or 0) >= 1
    assert (_sample(samples, "tidemq_flush_latency_seconds_sum") or 0) > 0
    assert _sample(samples, "tidemq_flush_latency_seconds_bucket", le="+Inf") == _sample(
        samples, "tidemq_flush_latency_seconds_count"
    )
    assert _sample(samples, "tidemq_recovery_seconds") is not None
    assert _sample(samples, "tidemq_index_backlog_messages") is not None
    assert _sample(samples, "tidemq_acl_refusals_total") == 0
    ns_samples = _scrape(f"http://127.0.0.1:{ns_port}/metrics")
    assert wait_for(
        lambda: (
            _sample(
                _scrape(f"http://127.0.0.1:{ns_port}/metrics"),
                "tidemq_namesrv_brokers",
                cluster="DefaultCluster",
            )
            == 1
        ),
        10,
    )
    assert _sample(ns_samples, "tidemq_namesrv_build_info") == 1
    assert _sample(ns_samples, "rocketmq_producer_offset") is None  # a NameServer has no store


def test_buckets_count_each_value_once_under_its_upper_bound() -> None:
    from tidemq.metrics import Buckets

    b = Buckets((0.001, 0.01, 0.1))
    for value in (0.0005, 0.001, 0.002, 0.05, 0.1, 3.0):
        b.observe(value)
    assert b.counts == [2, 1, 2, 1]
    assert b.cumulative() == [("0.001", 2), ("0.01", 3), ("0.1", 5), ("+Inf", 6)]
    assert b.count == 6 and abs(b.total - 3.1535) < 1e-9


def test_the_request_lanes_counts_move_in_broker_status_and_metrics(spawn: Any, tmp_path: Path) -> None:
    """Sends and pulls through the compiled request lanes (issue 38) move their counters, read by
    ``tidemq admin brokerStatus`` (``lane*`` keys) and on ``/metrics`` (``tidemq_*_lane_*``)."""
    from tidemq_store_mmap.lane import compiled_send_lane

    if compiled_send_lane() is None:
        pytest.skip("the compiled request lanes are not built (or TIDEMQ_NO_EXTENSIONS=1)")
    from tidemq.client import BlockingPullConsumer, PullStatus

    server, url = _standalone(spawn, tmp_path, free_port())
    namesrv, broker = server.addresses["namesrv"], server.addresses["broker"]
    _create_topic(namesrv, broker)

    def status() -> dict[str, int]:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", "brokerStatus", "-b", broker, "-n", namesrv],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        rows = (line.split(":", 1) for line in out.stdout.splitlines() if ":" in line)
        return {k.strip(): int(v) for k, v in rows if k.strip().startswith("lane")}

    def lanes(samples: dict[str, float]) -> tuple[float, float, float]:
        return (
            _sample(samples, "tidemq_send_lane_runs_total", served_by="lane") or 0,
            _sample(samples, "tidemq_read_lane_frames_total") or 0,
            _sample(samples, "tidemq_pull_lane_pulls_total", served_by="lane") or 0,
        )

    before, scraped_before = status(), lanes(_scrape(url))
    assert set(before) >= {
        "laneSendRunsServed",
        "laneSendRunsToPython",
        "laneReadFramesTaken",
        "laneReadAnswers",
        "lanePullServed",
        "lanePullToPython",
    }, before
    with BlockingProducer("lanes-pg", namesrv) as producer:
        for i in range(10):
            assert producer.send(Message(TOPIC, b"lane %d" % i)).status is SendStatus.SEND_OK
    consumer = BlockingPullConsumer("lanes-cg", namesrv)
    consumer.start()
    try:
        (mq,) = consumer.fetch_subscribe_queues(TOPIC)
        got = consumer.pull(mq, "*", 0, 32)
        assert got.status is PullStatus.FOUND and len(got.messages) == 10
    finally:
        consumer.shutdown()
    after = status()
    # A scrape within min_scrape_interval_s of the last is answered from it.
    assert wait_for(lambda: lanes(_scrape(url)) != scraped_before, 10)
    scraped_after = lanes(_scrape(url))
    # The producer's sends came whole in their reads: the read lane took them and the prepare
    # step served them; the pull took the pull lane.
    assert after["laneReadFramesTaken"] - before["laneReadFramesTaken"] >= 10, (before, after)
    assert after["laneSendRunsServed"] - before["laneSendRunsServed"] >= 10, (before, after)
    assert after["lanePullServed"] > before["lanePullServed"], (before, after)
    assert all(a > b for a, b in zip(scraped_after, scraped_before, strict=True)), (
        scraped_before,
        scraped_after,
    )

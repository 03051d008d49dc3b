"""The official RocketMQ 5 Python client (``rocketmq-python-client==5.1.2``, its own venv) through
``tidemq proxy`` in front of a NameServer and two broker groups, all real processes; what it sent
is read from the brokers by tidemq's remoting client."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import v5_venv
from conftest import wait_for
from grpc_proxy_support import BROKERS, ProxyCluster, drain

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

V5_WORKER = Path(__file__).with_name("v5_client.py")
CONSUMER = Path(__file__).with_name("v5_consume_client.py")
#: Invisible times and long polls down to 1 s (RocketMQ's proxy defaults, 10 s and 5 s, would only
#: make the tests slower).
FAST = "receive_min_invisible_ms = 1000\nreceive_min_polling_ms = 1000\n"


@pytest.fixture(scope="session")
def v5_python() -> Path:
    try:
        return v5_venv.v5_python()
    except v5_venv.Unavailable as exc:
        pytest.skip(str(exc))


def run(
    cluster: ProxyCluster, python: Path, *args: str, timeout: float = 180, worker: Path = V5_WORKER
) -> list[Any]:
    out = subprocess.run(
        [str(python), str(worker), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cluster.env,
        cwd=cluster.tmp,
    )
    ok = out.returncode == 0 or (out.returncode == -6 and "boost::thread_interrupted" in out.stderr)
    assert ok, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def consumer_connection(cluster: ProxyCluster, group: str) -> str:
    """``consumerConnection -g group`` (its error text when no member is online)."""
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", "consumerConnection", "-g", group, "-n", cluster.namesrv],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
    )
    return out.stdout + out.stderr


def test_a_v5_producer_through_the_proxy_reaches_both_groups_and_the_other_when_one_goes_down(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("ProxyV5")
    lines = run(
        cluster, v5_python, "produce", "--endpoints", cluster.proxy, "--topic", "ProxyV5", "--count", "20"
    )
    receipts = [line for line in lines if "i" in line]
    assert sorted(r["i"] for r in receipts) == list(range(20))
    stored = drain(cluster.namesrv, "ProxyV5", "G_PROXY_V5")
    assert sorted(stored) == sorted(f"v5-{i}".encode() for i in range(20))
    assert set(stored.values()) == set(BROKERS)  # one endpoint, both broker groups

    # broker-a's group goes down (its NameServer route stays until it expires): the same
    # producer scenario succeeds, every message on broker-b.
    cluster.brokers["broker-a"].stop(signal.SIGKILL)
    lines = run(
        cluster,
        v5_python,
        "produce",
        "--endpoints",
        cluster.proxy,
        "--topic",
        "ProxyV5",
        "--count",
        "10",
        "--prefix",
        "down",
    )
    assert sorted(r["i"] for r in lines if "i" in r) == list(range(10))
    after = drain(cluster.namesrv, "ProxyV5", "G_PROXY_V5_AFTER")
    assert {body: broker for body, broker in after.items() if body.startswith(b"down-")} == {
        f"down-{i}".encode(): "broker-b" for i in range(10)
    }


def test_v5_transactions_through_the_proxy_end_and_are_checked_on_the_broker_holding_them(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    # Checks every second, of half messages older than a second.
    cluster = ProxyCluster(
        spawn, tmp_path, broker_toml="transaction_check_interval_s = 1.0\ntransaction_timeout_s = 1.0\n"
    )
    cluster.create_topic("ProxyTx", "-a", "+message.type=TRANSACTION", queues=2)
    actions = "commit,rollback,unknown,commit,unknown,commit"
    lines = run(
        cluster,
        v5_python,
        "transaction",
        "--endpoints",
        cluster.proxy,
        "--topic",
        "ProxyTx",
        "--actions",
        actions,
        "--wait",
        "60",
    )
    sends = [line for line in lines if "action" in line]
    checks = [line for line in lines if "checked" in line]
    assert [s["action"] for s in sends] == actions.split(",")
    assert all(s["transaction_id"] for s in sends)
    unknown = {s["message_id"] for s in sends if s["action"] == "unknown"}
    # The brokers' checks came to the proxy and went on to the producer's Telemetry stream.
    assert {c["checked"] for c in checks} == unknown, lines

    expected = {f"v5-{a}-{i}".encode() for i, a in enumerate(actions.split(",")) if a != "rollback"}
    deadline = time.monotonic() + 30
    while (
        stored := drain(cluster.namesrv, "ProxyTx", f"G_PROXY_TX_{time.monotonic_ns()}")
    ).keys() != expected:
        assert time.monotonic() < deadline, sorted(stored)
        time.sleep(0.5)
    assert set(stored.values()) == set(BROKERS)  # half messages on both groups, each ended there


def test_v5_simple_and_push_consumers_through_the_proxy_receive_from_both_groups(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path, proxy_toml=FAST)
    cluster.create_topic("ProxySimple")
    cluster.create_topic("ProxyPush")
    endpoints = ("--endpoints", cluster.proxy)
    sent = run(
        cluster, v5_python, "produce", "--topic", "ProxySimple", "--count", "12", *endpoints, worker=CONSUMER
    )
    assert set(drain(cluster.namesrv, "ProxySimple", "G_PEEK").values()) == set(BROKERS)

    # SimpleConsumer: receive and ack, from both groups through the one endpoint.
    args = ["simple", "--topic", "ProxySimple", "--group", "G_PROXY_SIMPLE", "--count", "12", "--pause"]
    worker = subprocess.Popen(
        [str(v5_python), str(CONSUMER), *args, *endpoints],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        cwd=cluster.tmp,
    )
    try:
        assert worker.stdout is not None and worker.stdin is not None
        lines = []
        for raw in worker.stdout:
            lines.append(json.loads(raw))
            if "paused" in lines[-1]:
                break
        # The brokers know the group and the client itself: the proxy registers each v5 client
        # with them under its own client id, language and version (as RocketMQ 5's proxy).
        client_id = lines[-1]["client_id"]
        for name in BROKERS:
            connection = cluster.admin(
                "consumerConnection", "-g", "G_PROXY_SIMPLE", "-b", cluster.addresses[name]
            )
            assert "ProxySimple" in connection, connection
            member = next((row for row in connection.splitlines() if client_id in row), "")
            assert "PYTHON" in member and "V5_1_2" in member, connection
            assert "grpc-proxy-" not in connection, connection  # not the proxy's own client id
        worker.stdin.write("go\n")
        worker.stdin.flush()
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    lines += [json.loads(raw) for raw in out.splitlines() if raw.startswith("{")]
    # The client ended (NotifyClientTermination, its stream's end): unregistered under its id.
    assert wait_for(lambda: client_id not in consumer_connection(cluster, "G_PROXY_SIMPLE"), 30)
    got = [line for line in lines if "body" in line]
    assert sorted(r["message_id"] for r in got) == sorted(s["message_id"] for s in sent)
    assert all(r["attempt"] == 1 and r["topic"] == "ProxySimple" for r in got)
    again = run(
        cluster,
        v5_python,
        "simple",
        "--topic",
        "ProxySimple",
        "--group",
        "G_PROXY_SIMPLE",
        "--wait",
        "3",
        *endpoints,
        worker=CONSUMER,
    )
    assert [line for line in again if "body" in line] == []  # all acknowledged on both groups

    # PushConsumer: all consumed; a failed one comes back, attempt 2.
    sent = run(
        cluster, v5_python, "produce", "--topic", "ProxyPush", "--count", "12", *endpoints, worker=CONSUMER
    )
    lines = run(
        cluster,
        v5_python,
        "push",
        "--topic",
        "ProxyPush",
        "--group",
        "G_PROXY_PUSH",
        "--count",
        "12",
        "--fail-first",
        "--wait",
        "60",
        *endpoints,
        worker=CONSUMER,
    )
    assert lines[-1] == {"complete": True, "succeeded": 12}, lines
    successes = [x for x in lines if x.get("result") == "success"]
    assert sorted(x["message_id"] for x in successes) == sorted(s["message_id"] for s in sent)
    failure = next(x for x in lines if x.get("result") == "failure")
    retried = next(x for x in successes if x["message_id"] == failure["message_id"])
    assert (failure["attempt"], retried["attempt"]) == (1, 2)


def test_v5_fifo_push_consumer_and_the_dead_letter_queue_through_the_proxy(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path, proxy_toml=FAST)
    cluster.create_topic("ProxyFifo", "-a", "+message.type=FIFO")
    cluster.create_topic("ProxyDlq", queues=1)
    for name in BROKERS:  # the groups' settings, on every broker group
        address = cluster.addresses[name]
        cluster.admin("updateSubGroup", "-b", address, "-g", "G_PROXY_FIFO", "-o", "true")
        cluster.admin("updateSubGroup", "-b", address, "-g", "G_PROXY_DLQ", "-r", "2")
    endpoints = ("--endpoints", cluster.proxy)

    # FIFO: three message groups, spread over the queues of both broker groups, each in order.
    groups = "ga,gb,gc"
    run(
        cluster,
        v5_python,
        "produce",
        "--topic",
        "ProxyFifo",
        "--count",
        "24",
        "--groups",
        groups,
        *endpoints,
        worker=CONSUMER,
    )
    lines = run(
        cluster,
        v5_python,
        "push",
        "--topic",
        "ProxyFifo",
        "--group",
        "G_PROXY_FIFO",
        "--count",
        "24",
        "--slow",
        "0.02",
        "--wait",
        "60",
        *endpoints,
        worker=CONSUMER,
    )
    assert lines[0] == {"started": True, "fifo": True}  # the group's consumeMessageOrderly, from the brokers
    assert lines[-1] == {"complete": True, "succeeded": 24}, lines
    got = [x for x in lines if x.get("result") == "success"]
    for group in groups.split(","):
        order = [x["body"] for x in got if x["group"] == group]
        assert order == [f"{group}-{i}" for i in range(8)], order

    # Never acknowledged: 3 deliveries (retryMaxTimes 2), then the dead-letter queue.
    run(cluster, v5_python, "produce", "--topic", "ProxyDlq", "--count", "1", *endpoints, worker=CONSUMER)
    lines = run(
        cluster,
        v5_python,
        "simple",
        "--mode",
        "dlq",
        "--topic",
        "ProxyDlq",
        "--group",
        "G_PROXY_DLQ",
        "--invisible",
        "1",
        "--wait",
        "14",
        "--deliveries",  # the third delivery is the last: 4 s more (4 invisible times) to see a 4th
        "3",
        "--grace",
        "4",
        *endpoints,
        worker=CONSUMER,
    )
    deliveries = [x for x in lines if "body" in x]
    assert [d["attempt"] for d in deliveries] == [1, 2, 3], deliveries

    # %DLQ%G_PROXY_DLQ (write-only, as RocketMQ makes it) holds the one message.
    # (it moves there one invisible time after the third delivery: within the grace above, or soon after)
    def dlq_holds_it() -> bool:
        status = cluster.admin("topicStatus", "-t", "%DLQ%G_PROXY_DLQ")
        return any(line.split()[-3:-2] == ["1"] for line in status.splitlines()[1:])

    assert wait_for(dlq_holds_it, 15), cluster.admin("topicStatus", "-t", "%DLQ%G_PROXY_DLQ")


def test_a_timer_message_sent_through_the_proxy_is_recalled_through_it(
    v5_python: Path, spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path, proxy_toml=FAST)
    cluster.create_topic("ProxyRecall", "-a", "+message.type=DELAY")
    endpoints = ("--endpoints", cluster.proxy)
    (answer,) = run(
        cluster, v5_python, "recall", "--topic", "ProxyRecall", "--delay", "4", *endpoints, worker=CONSUMER
    )
    # The recall handle names the broker group holding the message: the recall went there.
    assert answer["handle"] and answer["recalled_id"] == answer["recalled"]
    deadline = time.monotonic() + 30
    while b"kept" not in (got := drain(cluster.namesrv, "ProxyRecall", f"G_RECALL_{time.monotonic_ns()}")):
        assert time.monotonic() < deadline, got
        time.sleep(0.5)
    time.sleep(1.0)  # both were due at the same second: the recalled one would be there by now
    assert list(drain(cluster.namesrv, "ProxyRecall", "G_RECALL_LAST")) == [b"kept"]

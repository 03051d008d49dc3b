"""The official RocketMQ 5 Python client (``rocketmq-python-client==5.1.2``, its own venv) through
``tidemq proxy`` in front of a NameServer and two broker groups, all real processes; what it sent
is read from the brokers by tidemq's remoting client."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import v5_venv
from grpc_proxy_support import BROKERS, ProxyCluster, drain

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

V5_WORKER = Path(__file__).with_name("v5_client.py")


@pytest.fixture(scope="session")
def v5_python() -> Path:
    try:
        return v5_venv.v5_python()
    except v5_venv.Unavailable as exc:
        pytest.skip(str(exc))


def run(cluster: ProxyCluster, python: Path, *args: str, timeout: float = 180) -> list[Any]:
    out = subprocess.run(
        [str(python), str(V5_WORKER), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cluster.env,
        cwd=cluster.tmp,
    )
    ok = out.returncode == 0 or (out.returncode == -6 and "boost::thread_interrupted" in out.stderr)
    assert ok, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


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
    cluster.create_topic("ProxyTx", queues=2)
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

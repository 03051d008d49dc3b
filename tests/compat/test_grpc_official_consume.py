"""The official RocketMQ 5 Python client's consumers (PyPI ``rocketmq-python-client==5.1.2``)
against tidemq's gRPC endpoint: SimpleConsumer (receive, ack, change invisible duration,
redelivery, dead-letter queue), PushConsumer (standard and FIFO), messages crossing between
``rocketmq==0.4.4`` and 5.x clients, and the recall of a timer message.

Each scenario is written as a new user writes it from the client's README
(tests/compat/v5_consume_client.py), against a ``tidemq broker`` subprocess whose endpoint takes
invisible times and long polls down to 1 s (``receive_min_invisible_ms``/``receive_min_polling_ms``;
RocketMQ's proxy defaults, 10 s and 5 s, would only make the tests slower).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from test_grpc_official import V4_WORKER, GrpcCluster, grpc_server, shared_clusters  # noqa: F401
from test_grpc_official import v5_python as v5_python_fixture

pytest.importorskip("grpc", reason="the grpc extra (grpcio) is not installed")
pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(600)]

#: The v5 client's environment, as test_grpc_official.py makes it (once per machine).
v5_python = v5_python_fixture
WORKER = Path(__file__).with_name("v5_consume_client.py")
FAST = "receive_min_invisible_ms = 1000\nreceive_min_polling_ms = 1000\n"


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], GrpcCluster]]:
    """One NameServer + gRPC broker (FAST) per HTTP/2 server kind, shared by the module's tests:
    each has topics and groups of its own, and none restarts the broker or reads broker-wide figures."""
    yield from shared_clusters(tmp_path_factory, FAST)


@pytest.fixture
def cluster(clusters: Callable[[str], GrpcCluster], grpc_server: str) -> GrpcCluster:  # noqa: F811
    return clusters(grpc_server)


def v5(cluster: GrpcCluster, python: Path, *args: str, timeout: float = 120) -> list[Any]:
    return cluster.run(python, WORKER, *args, "--endpoints", cluster.grpc, timeout=timeout)


def test_simple_consumer_receives_and_acks_what_a_4x_producer_sent_and_shows_as_a_consumer(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V4ToSimple", "-r", "2", "-w", "2")
    sent = cluster.run(
        sys.executable,
        V4_WORKER,
        "produce",
        "--namesrv",
        cluster.namesrv,
        "--topic",
        "V4ToSimple",
        "--count",
        "6",
    )
    assert [s["status"] for s in sent] == [0] * 6
    args = ["simple", "--topic", "V4ToSimple", "--group", "G_SIMPLE", "--count", "6", "--pause"]
    worker = subprocess.Popen(
        [str(v5_python), str(WORKER), *args, "--endpoints", cluster.grpc],
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
        # While it runs, the admin tools see the v5 consumer as they see a 4.x one.
        connection = cluster.admin("consumerConnection", "-g", "G_SIMPLE")
        assert "V4ToSimple" in connection, connection
        assert "PYTHON" in connection, connection
        progress = cluster.admin("consumerProgress", "-g", "G_SIMPLE")
        assert "V4ToSimple" in progress, progress
        worker.stdin.write("go\n")
        worker.stdin.flush()
        out, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err[-3000:]
    finally:
        if worker.poll() is None:
            worker.kill()
    lines += [json.loads(raw) for raw in out.splitlines() if raw.startswith("{")]
    got = [line for line in lines if "body" in line]
    assert sorted(r["body"] for r in got) == [f"msg-{i}" for i in range(6)]
    by_body = {r["body"]: r for r in got}
    for i, receipt in enumerate(sent):
        record = by_body[f"msg-{i}"]
        assert record["message_id"] == receipt["msg_id"]  # the 4.x client's id, as 4.x consumers see it
        assert record["tag"] == ("TagA" if i % 2 == 0 else "TagB")
        assert record["keys"] == sorted([f"key-{i}", "shared"])
        assert record["props"] == {"idx": str(i), "color": "blue"}
        assert record["topic"] == "V4ToSimple" and record["attempt"] == 1
    # All acknowledged: the group has nothing left.
    again = v5(cluster, v5_python, "simple", "--topic", "V4ToSimple", "--group", "G_SIMPLE", "--wait", "3")
    assert [line for line in again if "body" in line] == []


def test_simple_consumer_redelivery_after_the_invisible_time_and_change_invisible_duration(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V5Invisible", "-r", "1", "-w", "1")
    v5(cluster, v5_python, "produce", "--topic", "V5Invisible", "--count", "2")
    # Left unacknowledged for its 2 s of invisibility: delivered again, attempt 2.
    lines = v5(
        cluster,
        v5_python,
        "simple",
        "--mode",
        "redeliver",
        "--topic",
        "V5Invisible",
        "--group",
        "G_REDO",
        "--invisible",
        "2",
    )
    first, again = (next(x for x in lines if x.get("step") == s) for s in ("first", "again"))
    assert again["message_id"] == first["message_id"] and again["body"] == first["body"]
    assert (first["attempt"], again["attempt"]) == (1, 2)
    assert again["t"] - first["t"] >= 1.5
    assert lines[-1] == {"acked": first["message_id"]}
    # Received for 60 s, then made visible again 1 s later with change_invisible_duration.
    lines = v5(
        cluster,
        v5_python,
        "simple",
        "--mode",
        "change",
        "--topic",
        "V5Invisible",
        "--group",
        "G_CHANGE",
        "--invisible",
        "60",
    )
    first, again = (next(x for x in lines if x.get("step") == s) for s in ("first", "again"))
    changed = next(x["changed"] for x in lines if "changed" in x)
    assert again["message_id"] == first["message_id"] and again["attempt"] == 2
    assert again["t"] - changed < 20  # long before the 60 s it was received with
    assert lines[-1] == {"acked": first["message_id"]}


@pytest.mark.slow
def test_simple_consumer_messages_never_acked_reach_the_dead_letter_queue_after_max_attempts(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V5Dlq", "-r", "1", "-w", "1")
    cluster.admin(
        "updateSubGroup", "-b", cluster.broker, "-g", "G_DLQ", "-r", "2"
    )  # 3 deliveries, then %DLQ%G_DLQ
    v5(cluster, v5_python, "produce", "--topic", "V5Dlq", "--count", "1")
    lines = v5(
        cluster,
        v5_python,
        "simple",
        "--mode",
        "dlq",
        "--topic",
        "V5Dlq",
        "--group",
        "G_DLQ",
        "--invisible",
        "1",
        "--wait",
        "14",
        "--deliveries",  # the third delivery is the last: 4 s more (4 invisible times) to see a 4th
        "3",
        "--grace",
        "4",
    )
    deliveries = [x for x in lines if "body" in x]
    assert [d["attempt"] for d in deliveries] == [1, 2, 3], deliveries
    assert len({d["message_id"] for d in deliveries}) == 1

    # (it moves there one invisible time after the third delivery: within the grace above, or soon after)
    def dlq_holds_it() -> bool:
        status = cluster.admin("topicStatus", "-t", "%DLQ%G_DLQ")
        return any(line.split()[-3:-2] == ["1"] or " 1 " in line for line in status.splitlines()[1:])

    assert wait_for(dlq_holds_it, 15), cluster.admin("topicStatus", "-t", "%DLQ%G_DLQ")


def test_push_consumer_consumes_all_and_a_failed_message_comes_back(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V5Push", "-r", "4", "-w", "4")
    sent = v5(cluster, v5_python, "produce", "--topic", "V5Push", "--count", "12")
    lines = v5(
        cluster,
        v5_python,
        "push",
        "--topic",
        "V5Push",
        "--group",
        "G_PUSH",
        "--count",
        "12",
        "--fail-first",
        "--wait",
        "60",
    )
    assert lines[0] == {"started": True, "fifo": False}
    assert lines[-1] == {"complete": True, "succeeded": 12}, lines
    successes = [x for x in lines if x.get("result") == "success"]
    assert sorted(x["message_id"] for x in successes) == sorted(s["message_id"] for s in sent)
    failure = next(x for x in lines if x.get("result") == "failure")
    retried = next(x for x in successes if x["message_id"] == failure["message_id"])
    assert (failure["attempt"], retried["attempt"]) == (1, 2)


def test_fifo_push_consumer_gets_each_message_group_in_order(v5_python: Path, cluster: GrpcCluster) -> None:
    cluster.admin("updateTopic", "-t", "V5FifoPush", "-r", "4", "-w", "4", "-a", "+message.type=FIFO")
    cluster.admin("updateSubGroup", "-b", cluster.broker, "-g", "G_FIFO_PUSH", "-o", "true")
    v5(cluster, v5_python, "produce", "--topic", "V5FifoPush", "--count", "24", "--groups", "ga,gb,gc")
    lines = v5(
        cluster,
        v5_python,
        "push",
        "--topic",
        "V5FifoPush",
        "--group",
        "G_FIFO_PUSH",
        "--count",
        "24",
        "--slow",
        "0.02",
        "--wait",
        "60",
    )
    assert lines[0] == {"started": True, "fifo": True}  # the group's consumeMessageOrderly, from settings
    assert lines[-1] == {"complete": True, "succeeded": 24}, lines
    got = [x for x in lines if x.get("result") == "success"]
    for group in ("ga", "gb", "gc"):
        order = [x["body"] for x in got if x["group"] == group]
        assert order == [f"{group}-{i}" for i in range(8)], order


@pytest.mark.slow
def test_a_4x_consumer_reads_what_a_5x_producer_sent_and_a_timer_message_is_recalled(
    v5_python: Path, cluster: GrpcCluster
) -> None:
    cluster.admin("updateTopic", "-t", "V5Recall", "-r", "1", "-w", "1", "-a", "+message.type=DELAY")
    (answer,) = v5(cluster, v5_python, "recall", "--topic", "V5Recall", "--delay", "4")
    assert answer["handle"] and answer["recalled_id"] == answer["recalled"]
    got = cluster.run(
        sys.executable,
        V4_WORKER,
        "pull",
        "--namesrv",
        cluster.namesrv,
        "--topic",
        "V5Recall",
        "--group",
        "G_V4_RECALL",
        "--count",
        "2",
        "--timeout",
        "12",
    )[-1]
    # Only the message not recalled is delivered, at its time, with its v5 id.
    assert [r["body"] for r in got["received"]] == ["kept"], got
    assert got["received"][0]["id"] == answer["kept"]

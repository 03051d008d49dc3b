"""The official RocketMQ client (PyPI ``rocketmq==0.4.4``, rocketmq-client-cpp) against tidemq.

``tidemq namesrv`` and ``tidemq broker`` run as subprocesses on free loopback ports; each client
scenario runs in its own process (official_client.py) with its own HOME, bounded by a timeout.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from official_client import message_fields

pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]

WORKER = Path(__file__).with_name("official_client.py")


# rocketmq-client-cpp (inside rocketmq==0.4.4) can abort in shutdown() with this, after the
# scenario has finished and printed its result (apache/rocketmq-client-cpp#335, #411).
KNOWN_CLIENT_SHUTDOWN_ABORT = "boost::thread_interrupted"


def finished_ok(returncode: int, stderr: str) -> bool:
    """The scenario ran to its end: a clean exit, or the client library's known abort on shutdown."""
    return returncode == 0 or (returncode == -6 and KNOWN_CLIENT_SHUTDOWN_ABORT in stderr)


class Cluster:
    """A NameServer and one broker started with the ``tidemq`` command line."""

    def __init__(self, spawn: Any, tmp_path: Path, port: int) -> None:
        self.tmp = tmp_path
        self.namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
        (tmp_path / "broker.toml").write_text(
            "[broker]\n"
            'name = "broker-compat"\n'
            f'listen = "127.0.0.1:{port}"\n'
            f'namesrv = ["{self.namesrv}"]\n'
            f'data_dir = "{tmp_path / "data"}"\n'
        )
        self._spawn = spawn
        self.broker_server = spawn("broker", "-c", str(tmp_path / "broker.toml"))
        self.broker = self.broker_server.addresses["broker"]
        self.env = {**os.environ, "HOME": str(tmp_path)}  # the C++ client writes ~/logs/rocketmq-cpp

    def restart_broker(self) -> None:
        """Stop the broker (SIGTERM) and start it again on the same port and data."""
        assert self.broker_server.stop() == 0
        self.broker_server = self._spawn("broker", "-c", str(self.tmp / "broker.toml"))
        assert self.broker_server.addresses["broker"] == self.broker

    def admin(self, *args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
            capture_output=True,
            text=True,
            timeout=30,
            env=self.env,
        )
        assert out.returncode == 0, out.stderr
        return out.stdout

    def create_topic(self, topic: str, queues: int = 4) -> None:
        self.admin("updateTopic", "-t", topic, "-r", str(queues), "-w", str(queues))

    def client(self, *args: str, timeout: float = 60) -> list[Any]:
        """Run one scenario to its end; returns its JSON output lines."""
        out = subprocess.run(
            [sys.executable, str(WORKER), *args, "--namesrv", self.namesrv],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.tmp,
        )
        assert finished_ok(out.returncode, out.stderr), out.stderr[-3000:]
        return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]

    def start_client(self, *args: str) -> subprocess.Popen[str]:
        """Start a consumer scenario and wait until it says it is ready."""
        proc = subprocess.Popen(
            [sys.executable, str(WORKER), *args, "--namesrv", self.namesrv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
            cwd=self.tmp,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        return proc

    @staticmethod
    def finish(proc: subprocess.Popen[str], timeout: float = 60) -> dict[str, Any]:
        out, err = proc.communicate(timeout=timeout)
        assert finished_ok(proc.returncode, err), err[-3000:]
        return json.loads(out.strip().splitlines()[-1])


@pytest.fixture
def cluster(spawn: Any, tmp_path: Path, port: int) -> Cluster:
    return Cluster(spawn, tmp_path, port)


def assert_intact(received: list[dict[str, Any]], topic: str, indexes: range, prefix: str = "msg") -> None:
    """Every message arrived once with body, keys, tag and properties as sent."""
    by_body = {r["body"]: r for r in received}
    assert sorted(by_body) == sorted(f"{prefix}-{i}" for i in indexes)
    for i in indexes:
        want, got = message_fields(prefix, i), by_body[f"{prefix}-{i}"]
        assert (got["topic"], got["keys"], got["tags"], got["props"]) == (
            topic,
            want["keys"],
            want["tags"],
            want["props"],
        )


def test_send_sync_and_push_consumer_clustering(cluster: Cluster) -> None:
    cluster.create_topic("CompatSync")
    sent = cluster.client("produce", "--topic", "CompatSync", "--count", "20")
    assert [s["status"] for s in sent] == [0] * 20  # SEND_OK
    assert len({s["msg_id"] for s in sent}) == 20
    got = cluster.client(
        "push", "--topic", "CompatSync", "--group", "G_SYNC", "--count", "20", "--timeout", "40"
    )[-1]
    assert got["complete"]
    assert_intact(got["received"], "CompatSync", range(20))
    assert {r["queue_id"] for r in got["received"]} == {0, 1, 2, 3}  # spread over the four queues
    # The operator sees the group caught up, and finds a message by key.
    progress = cluster.admin("consumerProgress", "-g", "G_SYNC", "-t", "CompatSync")
    assert "Diff Total: 0" in progress
    found = cluster.admin("queryMsgByKey", "-t", "CompatSync", "-k", "key-7")
    assert sent[7]["msg_id"] in found


def test_send_oneway_then_pull_consumer(cluster: Cluster) -> None:
    cluster.create_topic("CompatOneway")
    cluster.client("produce", "--topic", "CompatOneway", "--count", "12", "--mode", "oneway")
    got = cluster.client(
        "pull", "--topic", "CompatOneway", "--group", "G_PULL", "--count", "12", "--timeout", "30"
    )[-1]
    assert got["complete"]
    assert_intact(got["received"], "CompatOneway", range(12))


def test_batch_send_then_tag_filtered_push(cluster: Cluster) -> None:
    cluster.create_topic("CompatBatch")
    sent = cluster.client("produce", "--topic", "CompatBatch", "--count", "8", "--mode", "batch")
    assert sent[0]["status"] == 0
    got = cluster.client(
        "push",
        "--topic",
        "CompatBatch",
        "--group",
        "G_TAG",
        "--count",
        "4",
        "--expression",
        "TagB",
        "--linger",
        "2",
    )[-1]
    # Only the TagB half arrives: the broker filters by tag code, the client by exact tag.
    assert_intact(got["received"], "CompatBatch", range(1, 8, 2))


def test_send_orderly_with_queue_selector_and_orderly_consumer(cluster: Cluster) -> None:
    cluster.create_topic("CompatOrder")
    sent = cluster.client(
        "produce", "--topic", "CompatOrder", "--count", "15", "--mode", "orderly", "--orders", "3"
    )
    assert [s["status"] for s in sent] == [0] * 15
    got = cluster.client(
        "push",
        "--topic",
        "CompatOrder",
        "--group",
        "G_ORDER",
        "--count",
        "15",
        "--orderly",
        "--timeout",
        "40",
    )[-1]
    assert got["complete"]
    assert_intact(got["received"], "CompatOrder", range(15))
    for order in range(3):
        mine = [r for r in got["received"] if int(r["props"]["idx"]) % 3 == order]
        assert {r["queue_id"] for r in mine} == {order}  # the selector's queue (arg % 4)
        assert [int(r["props"]["idx"]) for r in mine] == sorted(int(r["props"]["idx"]) for r in mine)


def test_broadcasting_consumers_each_receive_everything(cluster: Cluster) -> None:
    cluster.create_topic("CompatBroadcast")
    consumers = [
        cluster.start_client(
            "push",
            "--topic",
            "CompatBroadcast",
            "--group",
            "G_BCAST",
            "--count",
            "10",
            "--broadcast",
            "--timeout",
            "40",
        )
        for _ in range(2)
    ]
    time.sleep(4)  # a broadcasting consumer starts at the queue ends: let both rebalance first
    cluster.client("produce", "--topic", "CompatBroadcast", "--count", "10")
    for proc in consumers:
        got = Cluster.finish(proc)
        assert got["complete"]
        assert_intact(got["received"], "CompatBroadcast", range(10))


# Under -m slow for the default suite's time budget (~10 s); by default test_admin_official checks
# the official consumer's commits reach the broker, and tidemq's clients' resume tests run.
@pytest.mark.slow
def test_restarted_consumer_resumes_from_its_committed_offset(cluster: Cluster) -> None:
    cluster.create_topic("CompatResume")
    cluster.client("produce", "--topic", "CompatResume", "--count", "10")
    # linger past the client's 5 s offset persist period, so the commit does not depend on shutdown()
    first = cluster.client(
        "push", "--topic", "CompatResume", "--group", "G_RESUME", "--count", "10", "--linger", "6"
    )[-1]
    assert_intact(first["received"], "CompatResume", range(10))
    cluster.client("produce", "--topic", "CompatResume", "--count", "5", "--start", "10")
    second = cluster.client(
        "push", "--topic", "CompatResume", "--group", "G_RESUME", "--count", "5", "--linger", "3"
    )[-1]
    assert_intact(second["received"], "CompatResume", range(10, 15))  # nothing consumed before comes back


# Under -m slow for the default suite's time budget (~13 s); tidemq's own clients' retry tests
# (test_delay_schedule, test_client_e2e) run by default.
@pytest.mark.slow
def test_failed_message_is_redelivered_through_the_retry_topic(cluster: Cluster) -> None:
    cluster.create_topic("CompatRetry")
    cluster.create_topic("%RETRY%G_RETRY", queues=1)  # so the consumer finds its retry route at start
    cluster.client("produce", "--topic", "CompatRetry", "--count", "3")
    got = cluster.client(
        "push",
        "--topic",
        "CompatRetry",
        "--group",
        "G_RETRY",
        "--count",
        "3",
        "--fail-first",
        "1",
        "--timeout",
        "60",
    )[-1]
    assert got["complete"]
    assert_intact(got["received"], "CompatRetry", range(3))
    retried = [r for r in got["received"] if r["reconsume_times"] > 0]
    assert len(retried) == 1 and retried[0]["topic"] == "CompatRetry"  # the client restores the real topic


@pytest.mark.slow
def test_consumer_keeps_going_across_a_broker_restart(cluster: Cluster) -> None:
    cluster.create_topic("CompatRestart")
    consumer = cluster.start_client(
        "push",
        "--topic",
        "CompatRestart",
        "--group",
        "G_RESTART",
        "--count",
        "20",
        "--timeout",
        "120",
        "--linger",
        "2",
    )
    cluster.client("produce", "--topic", "CompatRestart", "--count", "10")
    time.sleep(3)
    cluster.restart_broker()
    cluster.client("produce", "--topic", "CompatRestart", "--count", "10", "--start", "10", timeout=90)
    got = Cluster.finish(consumer, timeout=150)
    assert got["complete"]
    assert {r["body"] for r in got["received"]} == {f"msg-{i}" for i in range(20)}

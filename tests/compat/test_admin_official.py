"""Operators' requests relayed by tidemq's broker to the official client (rocketmq==0.4.4).

rocketmq-client-cpp answers GET_CONSUMER_RUNNING_INFO and RESET_CONSUMER_CLIENT_OFFSET (in its
list-form body, ResetOffsetBodyForC); it never answers CONSUME_MESSAGE_DIRECTLY, so the broker
must give up on it with CONSUME_MSG_TIMEOUT, as RocketMQ's does.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import wait_for
from test_official_client import WORKER, Cluster, finished_ok

pytest.importorskip("rocketmq.client", reason="the official client (rocketmq==0.4.4) is not installed")

pytestmark = [pytest.mark.compat, pytest.mark.timeout(180)]


def admin(cluster: Cluster, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", *args, "-n", cluster.namesrv],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
        cwd=cluster.tmp,
    )
    assert out.returncode == (0 if ok else 1), out.stderr
    return out


def committed(cluster: Cluster, group: str, topic: str) -> list[int]:
    """The group's committed offsets per queue, as consumerProgress prints them."""
    out = admin(cluster, "consumerProgress", "-g", group, "-t", topic, ok=True).stdout
    rows = [line.split() for line in out.splitlines() if line.startswith(topic + " ")]
    return [int(r[4]) for r in sorted(rows, key=lambda r: int(r[2]))]


def client_log(home: Path) -> str:
    """Everything the C++ client has logged so far (it writes under HOME/logs/rocketmq-cpp)."""
    return "".join(f.read_text(errors="replace") for f in sorted((home / "logs" / "rocketmq-cpp").glob("*")))


def reset_commits(log: str, topic: str) -> set[int]:
    """Queues of ``topic`` for which ``log`` shows the client committing offset 0."""
    pattern = re.compile(
        r"oneway updateConsumeOffsetToBroker of mq:MessageQueue \[topic="
        + re.escape(topic)
        + r", brokerName=[^,]+, queueId=(\d+)\], its offset is:0\b"
    )
    return {int(m.group(1)) for m in pattern.finditer(log)}


def live_consumer(cluster: Cluster, topic: str, group: str, count: int) -> subprocess.Popen[str]:
    """The official PushConsumer in a worker process that stays online (SIGUSR1 ends it)."""
    return subprocess.Popen(
        [sys.executable, str(WORKER), "push", "--topic", topic, "--group", group, "--count", str(count)]
        + ["--timeout", "90", "--linger", "45", "--namesrv", cluster.namesrv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cluster.env,
        cwd=cluster.tmp,
    )


def test_broker_relays_to_the_official_consumer(spawn: Any, tmp_path: Path, port: int) -> None:
    cluster = Cluster(spawn, tmp_path, port)
    cluster.create_topic("OpsT", 2)
    cluster.client("produce", "--topic", "OpsT", "--count", "6")
    proc = live_consumer(cluster, "OpsT", "G_OPS", 6)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        # The C++ client commits every 5 s: wait until the broker holds all six.
        assert wait_for(lambda: sum(committed(cluster, "G_OPS", "OpsT")) == 6, 40, every=1.0)

        conn = admin(cluster, "consumerConnection", "-g", "G_OPS").stdout
        cid = conn.splitlines()[1].split()[0]
        assert conn.splitlines()[1].split()[2] == "CPP" and "OpsT" in conn

        info = admin(cluster, "consumerStatus", "-g", "G_OPS", "-i", cid).stdout
        assert "PROP_CONSUME_TYPE                       : CONSUME_PASSIVELY" in info
        assert "ClassFilter: false    SubExpression: *" in info
        offsets = [r.split() for r in info.split("#Consumer Offset#\n")[1].split("\n\n")[0].splitlines()[1:]]
        assert sum(int(r[3]) for r in offsets if r[0] == "OpsT") == 6
        assert "ProcessQueueInfo [commitOffset=" in info
        everyone = admin(cluster, "consumerStatus", "-g", "G_OPS").stdout
        assert everyone.splitlines()[1].split()[1] == cid

        # The broker commits nothing itself: the client commits 0 only if it read the list-form body.
        # That commit is all the broker can see, and only for a moment: the client's long pull, still
        # suspended at the reset, answers NO_NEW_MSG later and rocketmq-client-cpp then puts its old
        # offset back into its store (even for a dropped request) and commits it on its next 5 s tick.
        # So the client's own log is the witness: the oneway commits of 0 it sent for both queues.
        before = len(client_log(tmp_path))
        out = admin(cluster, "resetOffsetByTime", "-g", "G_OPS", "-t", "OpsT", "-s", "0").stdout
        assert [line.split()[1:] for line in out.splitlines()[2:]] == [["0", "0"], ["1", "0"]]
        assert wait_for(lambda: reset_commits(client_log(tmp_path)[before:], "OpsT") == {0, 1}, 30, every=0.5)
        proc.send_signal(signal.SIGUSR1)  # done with the live consumer: end its linger
    finally:
        out, err = proc.communicate(timeout=120)
    assert finished_ok(proc.returncode, err), err[-3000:]
    received = json.loads(out.strip().splitlines()[-1])["received"]
    assert {r["body"] for r in received} == {f"msg-{i}" for i in range(6)}


# The default run keeps the relay test above; this one (a fallback path) runs under -m slow.
@pytest.mark.slow
def test_reset_of_an_offline_official_group_falls_back(spawn: Any, tmp_path: Path, port: int) -> None:
    cluster = Cluster(spawn, tmp_path, port)
    cluster.create_topic("OffT", 2)
    cluster.client("produce", "--topic", "OffT", "--count", "4")
    got = cluster.client("push", "--topic", "OffT", "--group", "G_GONE", "--count", "4", "--timeout", "40")[
        -1
    ]
    assert got["complete"]
    assert sum(committed(cluster, "G_GONE", "OffT")) == 4  # committed at shutdown
    out = admin(cluster, "skipAccumulatedMessage", "-g", "G_GONE", "-t", "OffT").stdout
    assert out.splitlines()[0].split()[-1] == "#rollbackOffset"
    out = admin(cluster, "resetOffsetByTime", "-g", "G_GONE", "-t", "OffT", "-s", "0").stdout
    assert "consumerGroup[G_GONE]" in out.splitlines()[0]
    assert committed(cluster, "G_GONE", "OffT") == [0, 0]
    # The official consumer, started again, reads everything once more from there.
    again = cluster.client("push", "--topic", "OffT", "--group", "G_GONE", "--count", "4", "--timeout", "40")[
        -1
    ]
    assert again["complete"] and len(again["received"]) >= 4


# Under -m slow for the default suite's time budget: the relay waits out the broker's client call.
@pytest.mark.slow
def test_consume_message_directly_to_the_official_consumer_times_out(
    spawn: Any, tmp_path: Path, port: int
) -> None:
    """Not answered by rocketmq-client-cpp: the relay gives up with CONSUME_MSG_TIMEOUT, as RocketMQ's does."""
    cluster = Cluster(spawn, tmp_path, port)
    cluster.create_topic("DirT", 1)
    cluster.client("produce", "--topic", "DirT", "--count", "2")
    proc = live_consumer(cluster, "DirT", "G_DIR", 2)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        conn = admin(cluster, "consumerConnection", "-g", "G_DIR").stdout
        cid = conn.splitlines()[1].split()[0]
        key = admin(cluster, "queryMsgByKey", "-t", "DirT", "-k", "key-1").stdout
        offset_id = key.splitlines()[1].split()[1]
        began = time.monotonic()
        direct = admin(cluster, "queryMsgById", "-i", offset_id, "-g", "G_DIR", "-d", cid, ok=False)
        assert "CONSUME_MSG_TIMEOUT(207)" in direct.stderr and time.monotonic() - began < 30
        proc.send_signal(signal.SIGUSR1)
    finally:
        out, err = proc.communicate(timeout=120)
    assert finished_ok(proc.returncode, err), err[-3000:]

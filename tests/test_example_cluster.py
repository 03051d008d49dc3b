"""examples/cluster/ as the README tells a user to run it: six real processes on loopback.

``cluster.py start`` brings up two NameServers, broker-a (master + slave) and broker-b from the
example's own TOML files (ports moved with ``--base-port``, data under ``tmp_path``); clients given
both NameServers send and consume through it; then the master of broker-a stops and its messages
are read from the slave.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import runtime_info, wait_for

from tidemq.client import BlockingProducer, BlockingPullConsumer, Message, PullStatus, SendStatus

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "cluster" / "cluster.py"
TOPIC = "ClusterDemo"


def free_block(n: int) -> int:
    """A port P with P..P+n-1 all free on 127.0.0.1 a moment ago."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        socks = []
        try:
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no block of free ports")


class ExampleCluster:
    def __init__(self, root: Path, base: int):
        self.root = root
        self.base = base
        self.namesrv = f"127.0.0.1:{base};127.0.0.1:{base + 1}"
        self.master = f"127.0.0.1:{base + 2}"
        self.slave = f"127.0.0.1:{base + 4}"
        self.broker_b = f"127.0.0.1:{base + 5}"
        self.proxy = f"127.0.0.1:{base + 6}"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                str(SCRIPT),
                *args,
                "--data-root",
                str(self.root),
                "--base-port",
                str(self.base),
            ],
            capture_output=True,
            text=True,
            timeout=180,
        )

    def admin(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tidemq", "admin", *args, "-n", self.namesrv],
            capture_output=True,
            text=True,
            timeout=60,
        )


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ExampleCluster]:
    c = ExampleCluster(tmp_path / "cluster", free_block(7))
    out = c.run("start")
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        yield c
    finally:
        stopped = c.run("stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr


def drain(consumer: BlockingPullConsumer) -> dict[bytes, str]:
    """body -> broker name, of every message of TOPIC, pulled from offset 0 through the route."""
    got: dict[bytes, str] = {}
    for mq in consumer.fetch_subscribe_queues(TOPIC):
        offset = 0
        while True:
            res = consumer.pull(mq, "*", offset, 64)
            if res.status is not PullStatus.FOUND:
                break
            got.update((m.body, mq.broker_name) for m in res.messages)
            offset = res.next_begin_offset
    return got


def test_example_cluster_serves_and_fails_over_to_slave_reads(cluster: ExampleCluster) -> None:
    status = cluster.run("status").stdout
    assert status.count("running") == 6, status
    listing = cluster.admin("clusterList")
    assert listing.returncode == 0, listing.stderr
    assert {cluster.master, cluster.slave, cluster.broker_b} <= set(listing.stdout.split()), listing.stdout

    created = cluster.admin("updateTopic", "-t", TOPIC, "-r", "4", "-w", "4")
    assert created.returncode == 0 and created.stdout.count("success") == 2, created.stdout + created.stderr

    sent: dict[bytes, str] = {}
    with BlockingProducer("demo-pg", cluster.namesrv) as producer:
        for i in range(40):
            res = producer.send(Message(TOPIC, b"order-%03d" % i))
            assert res.status is SendStatus.SEND_OK
            sent[b"order-%03d" % i] = res.queue.broker_name
    assert set(sent.values()) == {"broker-a", "broker-b"}  # both broker groups took sends

    consumer = BlockingPullConsumer("demo-cg", cluster.namesrv)
    consumer.start()
    try:
        assert drain(consumer) == sent
    finally:
        consumer.shutdown()

    # The slave has everything before its master goes; then the master stops.
    assert wait_for(lambda: runtime_info(cluster.master)["haSlaveFallBehind"] == "0", 30), runtime_info(
        cluster.master
    )
    stopped = cluster.run("stop", "broker-a-master")
    assert stopped.returncode == 0 and "broker-a-master: stopped" in stopped.stdout, stopped.stderr

    after = BlockingPullConsumer("demo-cg-after", cluster.namesrv)
    after.start()
    try:
        # broker-a's messages now come from the slave (the route keeps it), broker-b's as before.
        assert wait_for(lambda: drain(after) == sent, 40), (
            f"{len(set(sent) - set(drain(after)))} of {len(sent)} unread after the master stopped"
        )
    finally:
        after.shutdown()

    # Sends go on, to broker-b: the slave takes none.
    with BlockingProducer("demo-pg", cluster.namesrv) as producer:
        res = producer.send(Message(TOPIC, b"after-failover"))
        assert res.status is SendStatus.SEND_OK and res.queue.broker_name == "broker-b"

    # RocketMQ 5 clients' one endpoint, the proxy, follows: broker-a's queues are read-only now
    # (a slave), sends through it land on broker-b.
    grpc = pytest.importorskip("grpc")
    from tidemq_transport_grpc.proto import load

    pb = load()

    async def v5() -> tuple[Any, list[int]]:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            meta = (("x-mq-client-id", "example-cluster@1"),)

            def rpc(name: str, response: str) -> Any:
                return channel.unary_unary(
                    f"/apache.rocketmq.v2.MessagingService/{name}",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=getattr(pb, response).FromString,
                )

            route = await rpc("QueryRoute", "QueryRouteResponse")(
                pb.QueryRouteRequest(topic=pb.Resource(name=TOPIC)), metadata=meta
            )
            codes = []
            for i in range(4):
                msg = pb.Message(topic=pb.Resource(name=TOPIC), body=b"v5-after-failover-%d" % i)
                msg.system_properties.message_id = f"v5-after-failover-{i}"
                answer = await rpc("SendMessage", "SendMessageResponse")(
                    pb.SendMessageRequest(messages=[msg]), metadata=meta
                )
                codes.append(answer.status.code)
            return route, codes

    route, codes = asyncio.run(v5())
    assert route.status.code == pb.OK
    layout = {(q.broker.name, q.permission) for q in route.message_queues}
    assert layout == {("broker-a", pb.READ), ("broker-b", pb.READ_WRITE)}, layout
    assert {f"{a.host}:{a.port}" for q in route.message_queues for a in q.broker.endpoints.addresses} == {
        cluster.proxy
    }
    assert codes == [pb.OK] * 4
    last = BlockingPullConsumer("demo-cg-v5", cluster.namesrv)
    last.start()
    try:
        got = drain(last)
    finally:
        last.shutdown()
    assert {got.get(b"v5-after-failover-%d" % i) for i in range(4)} == {"broker-b"}


def test_cluster_script_refuses_an_unknown_member(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "stop", "broker-c", "--data-root", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "unknown member(s) broker-c" in out.stderr

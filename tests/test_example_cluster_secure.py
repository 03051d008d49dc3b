"""examples/cluster/ with ``start --secure``: the same six processes, every listener authenticated.

What an operator gets by following the example's "secure:" steps (protected mode requires them
beyond loopback): brokers with the plain ACL signing their registrations with a NameServer that
checks them, and broker-a's master and slave sharing the HA secret.  Clients sign; unsigned ones
are refused; the slave still copies the master's commit log (HA authenticated) and metadata
(signed by the brokers' own account).
"""

from __future__ import annotations

import asyncio
import stat
from pathlib import Path

import orjson
import pytest
from conftest import wait_for
from test_example_cluster import TOPIC, ExampleCluster, free_block

from tidemq.client import AdminClient, BlockingProducer, Message, SendStatus, SessionCredentials
from tidemq.remoting.codes import RequestCode

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def runtime_info(addr: str, credentials: SessionCredentials) -> dict[str, str]:
    async def ask() -> dict[str, str]:
        client = AdminClient(addr, credentials=credentials)
        try:
            resp = await client.call(addr, RequestCode.GET_BROKER_RUNTIME_INFO)
        finally:
            await client.close()
        return dict(orjson.loads(resp.payload())["table"])

    return asyncio.run(ask())


def grpc_send(proxy: str, topic: str, body: bytes) -> str:
    """One SendMessage through the proxy: its status ("OK" or the code and why)."""
    grpc = pytest.importorskip("grpc")
    from tidemq_transport_grpc.proto import load

    pb = load()

    async def send() -> str:
        async with grpc.aio.insecure_channel(proxy) as channel:
            msg = pb.Message(topic=pb.Resource(name=topic), body=body)
            msg.system_properties.message_id = body.decode()
            answer = await channel.unary_unary(
                "/apache.rocketmq.v2.MessagingService/SendMessage",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.SendMessageResponse.FromString,
            )(pb.SendMessageRequest(messages=[msg]), metadata=(("x-mq-client-id", "secure@1"),))
            status = answer.status
            return "OK" if status.code == pb.OK else f"{pb.Code.Name(status.code)}: {status.message}"

    return asyncio.run(send())


def test_secure_example_cluster_authenticates_every_listener(tmp_path: Path) -> None:
    c = ExampleCluster(tmp_path / "cluster", free_block(7))
    out = c.run("start", "--secure")
    assert out.returncode == 0, out.stdout + out.stderr
    try:
        secrets = c.root / "secrets"
        assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
        for f in secrets.iterdir():
            assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
        admin = SessionCredentials("cluster-admin", (secrets / "admin.secret").read_text().strip())
        app = SessionCredentials("cluster-app", (secrets / "app.secret").read_text().strip())
        keys = ["--access-key", admin.access_key, "--secret-key", admin.secret_key]
        listing = c.admin("clusterList")  # a read: unsigned, as RocketMQ's clients send it
        assert {c.master, c.slave, c.broker_b} <= set(listing.stdout.split()), listing.stdout + listing.stderr
        assert c.admin("updateTopic", "-t", TOPIC, "-r", "2", "-w", "2").returncode != 0  # unsigned: refused
        created = c.admin("updateTopic", "-t", TOPIC, "-r", "2", "-w", "2", *keys)
        assert created.returncode == 0 and created.stdout.count("success") == 2, (
            created.stdout + created.stderr
        )
        with BlockingProducer("secure-pg", c.namesrv, credentials=app) as producer:
            for i in range(10):
                assert producer.send(Message(TOPIC, b"m%d" % i)).status is SendStatus.SEND_OK
        # The gRPC proxy (loopback) signs its requests to the ACL brokers as the app account.
        assert grpc_send(c.proxy, TOPIC, b"through-the-proxy") == "OK"
        # The HA stream authenticated with the shared secret: the slave caught up.
        assert wait_for(lambda: runtime_info(c.master, admin)["haSlaveFallBehind"] == "0", 30)
        slave_log = (c.root / "logs" / "broker-a-slave.log").read_text()
        # Its metadata copies are signed by the brokers' own account (unsigned: refused by the ACL).
        assert "slave synced" in slave_log and "sync failed" not in slave_log, slave_log[-2000:]
    finally:
        stopped = c.run("stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr

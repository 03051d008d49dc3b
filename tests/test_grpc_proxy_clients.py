"""The v5 clients behind ``tidemq proxy`` are clients of the brokers, each under its own client id,
language and version (as RocketMQ 5's proxy registers them): ``producerConnection`` and
``consumerConnection`` list them, several over the proxy's one connection per broker, and a
client's end (NotifyClientTermination, its stream's end) unregisters it alone.  Real processes,
raw calls; the official client's proof is in tests/compat/test_grpc_proxy_official.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from grpc_proxy_support import ProxyCluster  # noqa: E402
from test_grpc_proxy import SERVICE, call  # noqa: E402

from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
pytestmark = pytest.mark.timeout(300)


def admin(cluster: ProxyCluster, *args: str) -> str:
    """An admin command's output (its error text when the group has no member online)."""
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "admin", *args, "-n", cluster.namesrv],
        capture_output=True,
        text=True,
        timeout=60,
        env=cluster.env,
    )
    return out.stdout + out.stderr


def row(listing: str, client_id: str) -> list[str]:
    """What a connection listing says of ``client_id``: ``[address, language, version]`` ([]: none)."""
    for line in listing.splitlines():
        tokens = line.split()
        if client_id in tokens:
            return tokens[tokens.index(client_id) + 1 :]
    return []


async def until(check: Any, timeout: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await asyncio.to_thread(check):
        assert asyncio.get_running_loop().time() < deadline, "not within the time"
        await asyncio.sleep(0.3)


def test_each_v5_client_behind_the_proxy_is_a_broker_client_of_its_own(spawn: Any, tmp_path: Path) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("Reg")

    def telemetry(channel: Any, client_id: str) -> Any:
        return channel.stream_stream(
            SERVICE + "Telemetry",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString,
        )(metadata=(("x-mq-client-id", client_id),))

    async def hello(channel: Any, client_id: str, settings: Any) -> Any:
        stream = telemetry(channel, client_id)
        await stream.write(pb.TelemetryCommand(settings=settings))
        answer = await asyncio.wait_for(stream.read(), 30)
        assert answer.status.code == pb.OK, answer.status
        return stream

    def consumer(language: Any, version: str) -> Any:
        return pb.Settings(
            client_type=pb.SIMPLE_CONSUMER,
            user_agent=pb.UA(language=language, version=version),
            subscription=pb.Subscription(
                group=pb.Resource(name="GReg"),
                subscriptions=[
                    pb.SubscriptionEntry(
                        topic=pb.Resource(name="Reg"),
                        expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                    )
                ],
            ),
        )

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            producer = await hello(
                channel,
                "java-producer@1",
                pb.Settings(
                    client_type=pb.PRODUCER,
                    user_agent=pb.UA(language=pb.JAVA, version="5.0.7"),
                    publishing=pb.Publishing(topics=[pb.Resource(name="Reg")]),
                ),
            )
            go = await hello(channel, "go-consumer@1", consumer(pb.GOLANG, "5.1.0"))
            node = await hello(channel, "node-consumer@1", consumer(pb.NODE_JS, "5.0.3"))

            def producers() -> str:
                return admin(cluster, "producerConnection", "-g", "GRPC_PRODUCER_Reg", "-t", "Reg")

            def consumers() -> str:
                return admin(cluster, "consumerConnection", "-g", "GReg")

            await until(lambda: row(producers(), "java-producer@1"))
            assert row(producers(), "java-producer@1")[1:] == ["JAVA", "V5_0_7"], producers()
            await until(lambda: row(consumers(), "go-consumer@1") and row(consumers(), "node-consumer@1"))
            listing = consumers()
            assert row(listing, "go-consumer@1")[1:] == ["GO", "V5_1_0"], listing
            assert row(listing, "node-consumer@1")[1:] == ["NODE_JS", "V5_0_3"], listing
            assert "grpc-proxy-" not in listing + producers()  # never the proxy's own client id

            # One client says goodbye: it alone leaves the group.
            bye = call(channel, "NotifyClientTermination", "NotifyClientTerminationResponse")
            answer = await bye(
                pb.NotifyClientTerminationRequest(group=pb.Resource(name="GReg")),
                metadata=(("x-mq-client-id", "go-consumer@1"),),
            )
            assert answer.status.code == pb.OK
            go.cancel()
            await until(lambda: not row(consumers(), "go-consumer@1"))
            assert row(consumers(), "node-consumer@1"), consumers()
            # A stream's end unregisters its client too.
            node.cancel()
            producer.cancel()
            await until(lambda: not row(consumers(), "node-consumer@1"))
            await until(lambda: not row(producers(), "java-producer@1"))

    asyncio.run(main())


def test_running_info_relayed_to_a_v5_client_behind_the_proxy_is_that_client_s(
    spawn: Any, tmp_path: Path
) -> None:
    """``consumerStatus -g G -i <client>`` (GET_CONSUMER_RUNNING_INFO, relayed by a broker to the
    connection the client is registered on: the proxy's) is answered for the client named, not for
    the group: its own version and subscription; a client id the proxy does not have is not online."""
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("Run")

    def consumer(language: Any, version: str, tag: str) -> Any:
        return pb.Settings(
            client_type=pb.SIMPLE_CONSUMER,
            user_agent=pb.UA(language=language, version=version),
            subscription=pb.Subscription(
                group=pb.Resource(name="GRun"),
                subscriptions=[
                    pb.SubscriptionEntry(
                        topic=pb.Resource(name="Run"),
                        expression=pb.FilterExpression(type=pb.TAG, expression=tag),
                    )
                ],
            ),
        )

    async def hello(channel: Any, client_id: str, settings: Any) -> Any:
        stream = channel.stream_stream(
            SERVICE + "Telemetry",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString,
        )(metadata=(("x-mq-client-id", client_id),))
        await stream.write(pb.TelemetryCommand(settings=settings))
        answer = await asyncio.wait_for(stream.read(), 30)
        assert answer.status.code == pb.OK, answer.status
        return stream

    def status(client_id: str) -> str:
        return admin(cluster, "consumerStatus", "-g", "GRun", "-i", client_id)

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            go = await hello(channel, "go-runner@1", consumer(pb.GOLANG, "5.1.0", "a"))
            node = await hello(channel, "node-runner@1", consumer(pb.NODE_JS, "5.0.3", "b"))
            await until(lambda: "PROP_CLIENT_VERSION" in status("go-runner@1"))
            await until(lambda: "PROP_CLIENT_VERSION" in status("node-runner@1"))
            for client_id, version, tag, language in (
                ("go-runner@1", "V5_1_0", "a", "GO"),
                ("node-runner@1", "V5_0_3", "b", "NODE_JS"),
            ):
                text = status(client_id)
                lines = {
                    line.split(":", 1)[0].strip(): line.split(":", 1)[1].strip()
                    for line in text.splitlines()
                    if ": " in line and "Topic:" not in line
                }
                assert lines["PROP_CLIENT_VERSION"] == version, text
                # SimpleConsumers: CONSUME_ACTIVELY, as RocketMQ 5's proxy registers them.
                assert lines["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY", text
                assert lines["language"] == language, text
                assert f"SubExpression: {tag}\n" in text, text
            assert "not online" in status("nobody@1")
            go.cancel()
            node.cancel()

    asyncio.run(main())


def test_consumer_status_relayed_to_v5_clients_behind_the_proxy_is_an_empty_table_each(
    spawn: Any, tmp_path: Path
) -> None:
    """``getConsumerStatus -g G -t T`` (INVOKE_BROKER_TO_GET_CONSUMER_STATUS: the broker asks each
    client of the group GET_CONSUMER_STATUS_FROM_CLIENT, the v5 ones on the proxy's connection) is
    answered for every v5 client, with no queues (they POP: the brokers keep the offsets), as
    RocketMQ answers for a consumer holding none; before, the proxy answered SYSTEM_ERROR and the
    clients were missing from the table."""
    from tidemq.admin.consumers import consumer_status_table
    from tidemq.client import AdminClient

    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("Stat")

    def settings() -> Any:
        return pb.Settings(
            client_type=pb.SIMPLE_CONSUMER,
            user_agent=pb.UA(language=pb.JAVA, version="5.0.7"),
            subscription=pb.Subscription(
                group=pb.Resource(name="GStat"),
                subscriptions=[
                    pb.SubscriptionEntry(
                        topic=pb.Resource(name="Stat"),
                        expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                    )
                ],
            ),
        )

    async def hello(channel: Any, client_id: str) -> Any:
        stream = channel.stream_stream(
            SERVICE + "Telemetry",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString,
        )(metadata=(("x-mq-client-id", client_id),))
        await stream.write(pb.TelemetryCommand(settings=settings()))
        answer = await asyncio.wait_for(stream.read(), 30)
        assert answer.status.code == pb.OK, answer.status
        return stream

    async def table(client_id: str = "") -> dict[str, Any]:
        admin_client = AdminClient(cluster.namesrv, timeout=15)
        try:
            return await consumer_status_table(admin_client, "GStat", "Stat", client_id)
        finally:
            await admin_client.close()

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            one = await hello(channel, "stat-one@1")
            two = await hello(channel, "stat-two@1")
            await until(lambda: row(admin(cluster, "consumerConnection", "-g", "GStat"), "stat-two@1"))
            assert await table() == {"stat-one@1": {}, "stat-two@1": {}}
            assert await table("stat-two@1") == {"stat-two@1": {}}
            # mqadmin's command: its header, no queue rows (none held), exit status 0.
            out = cluster.admin("getConsumerStatus", "-g", "GStat", "-t", "Stat")
            assert "get consumer status from client. group=GStat, topic=Stat" in out, out
            assert "#clientId" in out and "stat-one@1" not in out, out
            one.cancel()
            two.cancel()

    asyncio.run(main())

"""``tidemq proxy``: one gRPC endpoint (RocketMQ 5's MessagingService) in front of a NameServer and
two broker groups, all real processes, driven with tidemq's own protobuf module.

The official v5 client's scenarios through the proxy are in tests/compat/test_grpc_proxy_official.py.
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from conftest import free_port  # noqa: E402
from grpc_proxy_support import BROKERS, ProxyCluster, drain  # noqa: E402

from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
SERVICE = "/apache.rocketmq.v2.MessagingService/"
META = (("x-mq-client-id", "proxy-test@1"),)
pytestmark = pytest.mark.timeout(300)


def call(channel: Any, rpc: str, response: str) -> Any:
    return channel.unary_unary(
        SERVICE + rpc,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=getattr(pb, response).FromString,
    )


def pull_stream(channel: Any) -> Any:
    return channel.unary_stream(
        SERVICE + "PullMessage",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.PullMessageResponse.FromString,
    )


def message(topic: str, body: bytes, **system: Any) -> Any:
    msg = pb.Message(topic=pb.Resource(name=topic), body=body)
    msg.system_properties.message_id = system.pop("message_id", body.decode())
    msg.system_properties.born_timestamp.GetCurrentTime()
    for key, value in system.items():
        setattr(msg.system_properties, key, value)
    return msg


def test_query_route_hands_out_the_proxy_for_every_queue_of_both_broker_groups(
    spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("ProxyRoute", queues=3)
    cluster.create_topic("ProxyFifoType", "-a", "+message.type=FIFO")

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            route = call(channel, "QueryRoute", "QueryRouteResponse")
            answer = await route(pb.QueryRouteRequest(topic=pb.Resource(name="ProxyRoute")), metadata=META)
            assert answer.status.code == pb.OK, answer.status
            layout = sorted((q.broker.name, q.id) for q in answer.message_queues)
            assert layout == [(b, i) for b in BROKERS for i in range(3)]
            assert {q.permission for q in answer.message_queues} == {pb.READ_WRITE}
            for queue in answer.message_queues:  # every queue at the proxy, none at a broker
                address = queue.broker.endpoints.addresses[0]
                assert f"{address.host}:{address.port}" == cluster.proxy
            missing = await route(pb.QueryRouteRequest(topic=pb.Resource(name="NoSuchTopic")), metadata=META)
            assert missing.status.code == pb.TOPIC_NOT_FOUND
            bad = await route(pb.QueryRouteRequest(topic=pb.Resource(name="bad topic!")), metadata=META)
            assert bad.status.code == pb.ILLEGAL_TOPIC
            # The topic's message.type, from the brokers' topic configs: announced, and checked.
            fifo = await route(pb.QueryRouteRequest(topic=pb.Resource(name="ProxyFifoType")), metadata=META)
            assert {tuple(q.accept_message_types) for q in fifo.message_queues} == {(pb.FIFO,)}
            send = call(channel, "SendMessage", "SendMessageResponse")
            normal = await send(
                pb.SendMessageRequest(messages=[message("ProxyFifoType", b"normal")]), metadata=META
            )
            assert normal.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, normal.status
            ordered = await send(
                pb.SendMessageRequest(messages=[message("ProxyFifoType", b"fifo", message_group="g")]),
                metadata=META,
            )
            assert ordered.status.code == pb.OK, ordered.status

    asyncio.run(main())


def test_sends_land_on_both_groups_and_pulls_and_offsets_go_to_the_queues_group(
    spawn: Any, tmp_path: Path
) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("ProxySend", "-a", "+message.type=MIXED")  # normal and FIFO messages

    async def main() -> None:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            send = call(channel, "SendMessage", "SendMessageResponse")
            for i in range(20):
                answer = await send(
                    pb.SendMessageRequest(messages=[message("ProxySend", b"m-%02d" % i, tag="T")]),
                    metadata=META,
                )
                assert answer.status.code == pb.OK, answer.status
            # A FIFO group keeps one queue of one broker group.
            fifo = []
            for i in range(6):
                answer = await send(
                    pb.SendMessageRequest(messages=[message("ProxySend", b"f-%d" % i, message_group="g1")]),
                    metadata=META,
                )
                assert answer.status.code == pb.OK, answer.status
                fifo.append(answer.entries[0].offset)
            assert fifo == sorted(fifo) and len(set(fifo)) == 6

            # The v5 pull consumer's RPCs, on broker-b's queue 0 through the proxy.
            queue = pb.MessageQueue(
                topic=pb.Resource(name="ProxySend"), id=0, broker=pb.Broker(name="broker-b")
            )
            group = pb.Resource(name="G_PROXY_PULL")
            end = await call(channel, "QueryOffset", "QueryOffsetResponse")(
                pb.QueryOffsetRequest(message_queue=queue, query_offset_policy=pb.END), metadata=META
            )
            assert end.status.code == pb.OK
            pulled: list[Any] = []
            async for part in pull_stream(channel)(
                pb.PullMessageRequest(
                    group=group,
                    message_queue=queue,
                    offset=0,
                    batch_size=32,
                    filter_expression=pb.FilterExpression(type=pb.TAG, expression="*"),
                ),
                metadata=META,
            ):
                pulled.append(part)
            bodies = [p.message.body for p in pulled if p.WhichOneof("content") == "message"]
            assert len(bodies) == end.offset
            assert pulled[-1].next_offset == end.offset
            updated = await call(channel, "UpdateOffset", "UpdateOffsetResponse")(
                pb.UpdateOffsetRequest(group=group, message_queue=queue, offset=end.offset), metadata=META
            )
            assert updated.status.code == pb.OK
            got = await call(channel, "GetOffset", "GetOffsetResponse")(
                pb.GetOffsetRequest(group=group, message_queue=queue), metadata=META
            )
            assert (got.status.code, got.offset) == (pb.OK, end.offset)
            elsewhere = queue.__class__()
            elsewhere.CopyFrom(queue)
            elsewhere.broker.name = "broker-a"
            none = await call(channel, "GetOffset", "GetOffsetResponse")(
                pb.GetOffsetRequest(group=group, message_queue=elsewhere), metadata=META
            )
            assert none.status.code == pb.OFFSET_NOT_FOUND  # offsets are per broker group

    asyncio.run(main())
    stored = drain(cluster.namesrv, "ProxySend", "G_PROXY_READS")
    assert sorted(stored) == sorted([b"m-%02d" % i for i in range(20)] + [b"f-%d" % i for i in range(6)])
    assert {stored[b"m-%02d" % i] for i in range(20)} == set(BROKERS)  # spread over both groups
    assert len({stored[b"f-%d" % i] for i in range(6)}) == 1

    # The NameServer goes away: the proxy's cached routes keep sends going.
    cluster.namesrv_server.stop()

    async def without_namesrv() -> list[int]:
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            send = call(channel, "SendMessage", "SendMessageResponse")
            return [
                (
                    await send(
                        pb.SendMessageRequest(messages=[message("ProxySend", b"later-%d" % i)]), metadata=META
                    )
                ).status.code
                for i in range(4)
            ]

    assert asyncio.run(without_namesrv()) == [pb.OK] * 4


def test_a_broker_group_going_down_sends_go_to_the_other(spawn: Any, tmp_path: Path) -> None:
    cluster = ProxyCluster(spawn, tmp_path)
    cluster.create_topic("ProxyFailover")
    cluster.brokers["broker-a"].stop(signal.SIGKILL)

    async def main() -> list[int]:
        codes = []
        async with grpc.aio.insecure_channel(cluster.proxy) as channel:
            send = call(channel, "SendMessage", "SendMessageResponse")
            for i in range(12):
                answer = await send(
                    pb.SendMessageRequest(messages=[message("ProxyFailover", b"after-%02d" % i)]),
                    metadata=META,
                )
                codes.append(answer.status.code)
        return codes

    started = time.monotonic()
    assert asyncio.run(main()) == [pb.OK] * 12
    assert time.monotonic() - started < 20  # the down group is passed over, not waited for
    consumer_view = drain(cluster.namesrv, "ProxyFailover", "G_FAILOVER")
    assert set(consumer_view) == {b"after-%02d" % i for i in range(12)}
    assert set(consumer_view.values()) == {"broker-b"}


def test_an_unreachable_namesrv_is_unavailable_to_clients_and_the_proxy_stays_up(
    spawn: Any, tmp_path: Path
) -> None:
    nowhere = f"127.0.0.1:{free_port()}"
    proxy = spawn("proxy", "--namesrv", nowhere, "--listen", "127.0.0.1:0")
    address = proxy.addresses["proxy"]

    async def main() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            for _ in range(2):
                with pytest.raises(grpc.aio.AioRpcError) as failed:
                    await call(channel, "QueryRoute", "QueryRouteResponse")(
                        pb.QueryRouteRequest(topic=pb.Resource(name="AnyTopic")), metadata=META, timeout=30
                    )
                assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
                assert "NameServer" in (failed.value.details() or "")
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await call(channel, "SendMessage", "SendMessageResponse")(
                    pb.SendMessageRequest(messages=[message("AnyTopic", b"x")]), metadata=META, timeout=30
                )
            assert failed.value.code() == grpc.StatusCode.UNAVAILABLE

            # A frame that does not parse: INVALID_ARGUMENT, the proxy serves on.
            garbage = channel.unary_unary(
                SERVICE + "SendMessage", response_deserializer=pb.SendMessageResponse.FromString
            )
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await garbage(b"\xff\xff\xff\xff", metadata=META, timeout=30)
            assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(main())
    assert proxy.proc.poll() is None  # still serving
    assert "do not answer" in proxy.log_path.read_text()
    assert proxy.stop() == 0  # SIGTERM: a clean stop


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ((), "needs its NameServers"),
        (("--namesrv", "nowhere"), "[proxy] namesrv"),
        (("--namesrv", "127.0.0.1:9876", "--listen", "0.0.0.0:0"), "protected mode"),
        (("--namesrv", "127.0.0.1:9876", "--tls-certfile", "x.pem"), "both tls_certfile and tls_keyfile"),
    ],
)
def test_bad_proxy_settings_are_one_line_errors(args: tuple[str, ...], expected: str, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tidemq", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert out.returncode == 2, out.stdout + out.stderr
    assert expected in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_busy_port_is_a_one_line_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "tidemq",
                "proxy",
                "--namesrv",
                "127.0.0.1:9876",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=tmp_path,
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cannot listen" in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_the_proxy_serves_tls_and_mutual_tls(spawn: Any, tmp_path: Path) -> None:
    from test_tls_verification import make_certs

    certs = make_certs(tmp_path)
    proxy = spawn(
        "proxy",
        "--namesrv",
        f"127.0.0.1:{free_port()}",
        "--listen",
        "127.0.0.1:0",
        "--tls-certfile",
        str(certs["good"]),
        "--tls-keyfile",
        str(certs["good_key"]),
        "--tls-cafile",
        str(certs["ca"]),
    )
    address = proxy.addresses["proxy"]
    ca = certs["ca"].read_bytes()

    # With a client certificate signed by the CA the call reaches the proxy (which has no
    # NameServer here: UNAVAILABLE naming it); without one the handshake fails, no answer of its.
    mutual = grpc.ssl_channel_credentials(ca, certs["good_key"].read_bytes(), certs["good"].read_bytes())
    assert "NameServer" in proxy_answer(address, mutual)
    assert "NameServer" not in proxy_answer(address, grpc.ssl_channel_credentials(ca))
    assert proxy.proc.poll() is None


def proxy_answer(address: str, credentials: Any) -> str:
    async def ask() -> str:
        async with grpc.aio.secure_channel(address, credentials) as channel:
            try:
                await call(channel, "QueryRoute", "QueryRouteResponse")(
                    pb.QueryRouteRequest(topic=pb.Resource(name="T")), metadata=META, timeout=20
                )
            except grpc.aio.AioRpcError as exc:
                return exc.details() or ""
            return "answered"

    return asyncio.run(ask())

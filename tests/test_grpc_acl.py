"""The plain ACL over gRPC: RocketMQ 5 clients' signature (``authorization: MQv2-HMAC-SHA1 ...``
and ``x-mq-date-time``) checked with the same accounts and permissions as remoting requests.
Raw calls with tidemq's own protobuf module; the official client's proof is in
tests/compat/test_grpc_official_acl.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from tidemq.acl import NotAuthenticated, SignedCall, parse_v5_authorization, v5_signature  # noqa: E402
from tidemq.remoting.protocol import TopicConfig  # noqa: E402
from tidemq_transport_grpc import plugin as grpc_plugin  # noqa: E402
from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
SERVICE = "/apache.rocketmq.v2.MessagingService/"
ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: producer-ak
    secretKey: producer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=PUB
      - Secret=DENY
  - accessKey: consumer-ak
    secretKey: consumer-secret
    defaultTopicPerm: DENY
    defaultGroupPerm: DENY
    topicPerms:
      - Orders=SUB
    groupPerms:
      - orders-cg=SUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""
DATE = "20261128T101010Z"


def signed(ak: str, sk: str, date: str = DATE) -> tuple[tuple[str, str], ...]:
    """The metadata a v5 client with credentials sends (its Signature.metadata)."""
    auth = f"MQv2-HMAC-SHA1 Credential={ak}, SignedHeaders=x-mq-date-time, Signature={v5_signature(sk, date)}"
    return (("x-mq-client-id", f"{ak}@1"), ("x-mq-date-time", date), ("authorization", auth))


PRODUCER = signed("producer-ak", "producer-secret")
CONSUMER = signed("consumer-ak", "consumer-secret")
ADMIN = signed("admin-ak", "admin-secret")
UNSIGNED = (("x-mq-client-id", "anon@1"),)


def call(channel: Any, rpc: str, response: str) -> Any:
    return channel.unary_unary(
        SERVICE + rpc,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=getattr(pb, response).FromString,
    )


def test_the_v5_signature_is_rocketmq_s() -> None:
    # hex(HmacSHA1(secretKey, x-mq-date-time)), as the 5.1.2 Python client's Signature.sign computes it.
    import hashlib
    import hmac

    assert v5_signature("sk", DATE) == hmac.new(b"sk", DATE.encode(), hashlib.sha1).hexdigest()
    assert parse_v5_authorization(
        "MQv2-HMAC-SHA1 Credential=ak/x, SignedHeaders=x-mq-date-time, Signature=ab"
    ) == (
        "ak",
        "ab",
    )
    for bad in ("Basic abc", "MQv2-HMAC-SHA1", "MQv2-HMAC-SHA1 Credential=ak", "MQv2-HMAC-SHA1 junk"):
        with pytest.raises(NotAuthenticated):
            parse_v5_authorization(bad)
    assert SignedCall.of("QueryRoute", [("x-mq-date-time", DATE)]).authorization is None


def acl_broker(make: Any, tmp_path: Path) -> Any:
    path = tmp_path / "plain_acl.yml"
    path.write_text(ACL)
    options = {"transport": {"grpc": {"listen": "127.0.0.1:0"}}, "acl": {"plain": {"file": str(path)}}}
    return make({"acl": "plain"}, options=options, auto_create_topic=True)


def test_calls_are_checked_with_the_plain_acl_s_accounts(tidemq_make_broker: Any, tmp_path: Path) -> None:
    async def main() -> None:
        async with acl_broker(tidemq_make_broker, tmp_path) as broker:
            for topic in ("Orders", "Secret"):
                broker.topics.update(TopicConfig(topic, 2, 2))
            server = grpc_plugin.server_of(broker)
            async with grpc.aio.insecure_channel(server.address) as channel:
                route = call(channel, "QueryRoute", "QueryRouteResponse")
                send = call(channel, "SendMessage", "SendMessageResponse")

                def message(topic: str) -> Any:
                    return pb.SendMessageRequest(
                        messages=[pb.Message(topic=pb.Resource(name=topic), body=b"x")]
                    )

                async def code(rpc: Any, request: Any, metadata: Any) -> str:
                    return pb.Code.Name((await rpc(request, metadata=metadata)).status.code)

                orders = pb.QueryRouteRequest(topic=pb.Resource(name="Orders"))
                # Unsigned, unknown key, wrong secret, a malformed header: UNAUTHORIZED.
                assert await code(route, orders, UNSIGNED) == "UNAUTHORIZED"
                assert await code(route, orders, signed("who-ak", "x")) == "UNAUTHORIZED"
                assert await code(route, orders, signed("producer-ak", "wrong")) == "UNAUTHORIZED"
                bad_header = (*UNSIGNED, ("x-mq-date-time", DATE), ("authorization", "Basic eA=="))
                assert await code(route, orders, bad_header) == "UNAUTHORIZED"
                refused = await send(message("Orders"), metadata=signed("producer-ak", "wrong"))
                assert refused.status.message == "signature check failed for accessKey producer-ak"
                assert broker.store.get_max_offset_in_queue("Orders", 0) == 0  # nothing stored

                # Signed: the account's permissions, as for remoting requests.
                assert await code(route, orders, PRODUCER) == "OK"  # a route needs PUB or SUB
                assert await code(send, message("Orders"), PRODUCER) == "OK"
                denied = await send(message("Secret"), metadata=PRODUCER)
                assert pb.Code.Name(denied.status.code) == "FORBIDDEN"
                assert "topic:Secret" in denied.status.message
                assert await code(send, message("Orders"), CONSUMER) == "FORBIDDEN"  # SUB only
                assert await code(send, message("Secret"), ADMIN) == "OK"  # admin, no rules: all

                # A consumer's calls need its group too.
                query = call(channel, "QueryOffset", "QueryOffsetResponse")
                get_offset = call(channel, "GetOffset", "GetOffsetResponse")
                mq = pb.MessageQueue(topic=pb.Resource(name="Orders"), id=0)
                assert await code(query, pb.QueryOffsetRequest(message_queue=mq), CONSUMER) == "OK"
                mine = pb.GetOffsetRequest(group=pb.Resource(name="orders-cg"), message_queue=mq)
                other = pb.GetOffsetRequest(group=pb.Resource(name="other-cg"), message_queue=mq)
                assert await code(get_offset, mine, CONSUMER) == "OFFSET_NOT_FOUND"  # it ran
                assert await code(get_offset, other, CONSUMER) == "FORBIDDEN"
                pull = channel.unary_stream(
                    SERVICE + "PullMessage",
                    request_serializer=lambda m: m.SerializeToString(),
                    response_deserializer=pb.PullMessageResponse.FromString,
                )
                answers = [
                    a
                    async for a in pull(
                        pb.PullMessageRequest(
                            group=pb.Resource(name="other-cg"), message_queue=mq, batch_size=1
                        ),
                        metadata=CONSUMER,
                        timeout=10,
                    )
                ]
                assert [pb.Code.Name(a.status.code) for a in answers] == ["FORBIDDEN"]
            assert server.gate is not None and server.gate.refusals == 9

    asyncio.run(main())


def test_a_telemetry_stream_is_signed_and_its_settings_checked(
    tidemq_make_broker: Any, tmp_path: Path
) -> None:
    async def main() -> None:
        async with acl_broker(tidemq_make_broker, tmp_path) as broker:
            server = grpc_plugin.server_of(broker)
            async with grpc.aio.insecure_channel(server.address) as channel:

                async def telemetry(metadata: Any, topic: str) -> list[str]:
                    stream = channel.stream_stream(
                        SERVICE + "Telemetry",
                        request_serializer=lambda m: m.SerializeToString(),
                        response_deserializer=pb.TelemetryCommand.FromString,
                    )(metadata=metadata)
                    settings = pb.Settings(
                        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name=topic)])
                    )
                    await stream.write(pb.TelemetryCommand(settings=settings))
                    first = await asyncio.wait_for(stream.read(), 10)
                    stream.cancel()
                    return [pb.Code.Name(first.status.code), first.WhichOneof("command") or ""]

                assert await telemetry(UNSIGNED, "Orders") == ["UNAUTHORIZED", ""]
                assert await telemetry(PRODUCER, "Secret") == ["FORBIDDEN", ""]
                assert await telemetry(PRODUCER, "Orders") == ["OK", "settings"]

    asyncio.run(main())

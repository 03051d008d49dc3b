"""The gRPC endpoint (RocketMQ 5's MessagingService) of a real broker, driven over loopback gRPC.

The official v5 client's scenarios are in tests/compat/test_grpc_official.py; these check the
protocol answers a client relies on, fast, with tidemq's own protobuf module.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from tidemq import hookimpl  # noqa: E402
from tidemq.errors import ConfigError  # noqa: E402
from tidemq.plugins import get_plugin_manager  # noqa: E402
from tidemq.record import decode_message  # noqa: E402
from tidemq.remoting.protocol import TopicConfig  # noqa: E402
from tidemq_transport_grpc import plugin as grpc_plugin  # noqa: E402
from tidemq_transport_grpc.proto import load  # noqa: E402

pb = load()
SERVICE = "/apache.rocketmq.v2.MessagingService/"
MakeBroker = Callable[..., AbstractAsyncContextManager[Any]]
META = (("x-mq-client-id", "test-client@1"),)


def call(channel: Any, rpc: str, response: str) -> Any:
    return channel.unary_unary(
        SERVICE + rpc,
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=getattr(pb, response).FromString,
    )


@asynccontextmanager
async def grpc_broker(
    make: MakeBroker, broker_settings: dict[str, Any] | None = None, **grpc_options: Any
) -> AsyncIterator[tuple[Any, Any]]:
    options = {"transport": {"grpc": {"listen": "127.0.0.1:0", **grpc_options}}}
    async with make(auto_create_topic=True, options=options, **(broker_settings or {})) as broker:
        server = grpc_plugin.server_of(broker)
        assert server is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            yield broker, channel


def typed_topic(broker: Any, topic: str, message_type: str, queues: int = 4) -> None:
    """Create ``topic`` with RocketMQ 5's ``message.type`` attribute (sends of other types are refused)."""
    broker.topics.update(TopicConfig(topic, queues, queues, attributes={"message.type": message_type}))


def simple_consumer_settings(group: str, topic: str, **settings: Any) -> Any:
    """The Telemetry command a v5 SimpleConsumer opens its stream with (every tag of ``topic``)."""
    subscription = pb.Subscription(
        group=pb.Resource(name=group),
        subscriptions=[
            pb.SubscriptionEntry(
                topic=pb.Resource(name=topic), expression=pb.FilterExpression(type=pb.TAG, expression="*")
            )
        ],
    )
    return pb.TelemetryCommand(
        settings=pb.Settings(client_type=pb.SIMPLE_CONSUMER, subscription=subscription, **settings)
    )


def test_query_route_hands_out_this_endpoint_and_the_queues(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            server = grpc_plugin.server_of(broker)
            request = pb.QueryRouteRequest(topic=pb.Resource(name="RouteTopic"))
            response = await call(channel, "QueryRoute", "QueryRouteResponse")(request, metadata=META)
            assert response.status.code == pb.OK
            queues = response.message_queues
            assert [q.id for q in queues] == list(range(broker.settings.default_topic_queues))
            assert {q.permission for q in queues} == {pb.READ_WRITE}
            address = queues[0].broker.endpoints.addresses[0]
            assert f"{address.host}:{address.port}" == server.address
            assert queues[0].broker.endpoints.scheme == pb.IPv4
            # A topic without RocketMQ 5's message.type attribute takes NORMAL messages only.
            assert set(queues[0].accept_message_types) == {pb.NORMAL}
            bad = await call(channel, "QueryRoute", "QueryRouteResponse")(
                pb.QueryRouteRequest(topic=pb.Resource(name="bad topic!")), metadata=META
            )
            assert bad.status.code == pb.ILLEGAL_TOPIC

    asyncio.run(main())


def test_telemetry_answers_a_producers_settings_with_the_broker_limits(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            heartbeat = await call(channel, "Heartbeat", "HeartbeatResponse")(
                pb.HeartbeatRequest(client_type=pb.PRODUCER), metadata=META
            )
            assert heartbeat.status.code == pb.OK
            no_id = await call(channel, "Heartbeat", "HeartbeatResponse")(pb.HeartbeatRequest())
            assert no_id.status.code == pb.CLIENT_ID_REQUIRED
            stream = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )(metadata=META)
            settings = pb.Settings(
                client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="T")])
            )
            await stream.write(pb.TelemetryCommand(settings=settings))
            answer = await asyncio.wait_for(stream.read(), 10)
            assert answer.status.code == pb.OK
            assert answer.settings.publishing.max_body_size == broker.settings.max_message_size
            assert answer.settings.backoff_policy.max_attempts >= 1
            await stream.write(pb.TelemetryCommand(verify_message_result=pb.VerifyMessageResult(nonce="n")))
            await stream.done_writing()
            assert await asyncio.wait_for(stream.read(), 10) == grpc.aio.EOF
            done = await call(channel, "NotifyClientTermination", "NotifyClientTerminationResponse")(
                pb.NotifyClientTerminationRequest(), metadata=META
            )
            assert done.status.code == pb.OK

    asyncio.run(main())


def test_send_stores_the_message_with_the_clients_id_tag_keys_and_group(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            typed_topic(broker, "SendTopic", "MIXED")
            send = call(channel, "SendMessage", "SendMessageResponse")
            message = pb.Message(
                topic=pb.Resource(name="SendTopic"),
                user_properties={"color": "blue"},
                body=b"hello v5",
                system_properties=pb.SystemProperties(
                    tag="TagA",
                    keys=["k1", "k2"],
                    message_id="01ABCDEF0123456789ABCDEF0123456789",
                    message_type=pb.FIFO,
                    message_group="order-7",
                ),
            )
            response = await send(pb.SendMessageRequest(messages=[message]), metadata=META)
            assert response.status.code == pb.OK, response.status
            (entry,) = response.entries
            assert entry.message_id == "01ABCDEF0123456789ABCDEF0123456789"
            # Another message of the group (a new id: the same id again is a resend, issue 37).
            second = pb.Message()
            second.CopyFrom(message)
            second.system_properties.message_id = "01ABCDEF0123456789ABCDEF012345678A"
            again = await send(pb.SendMessageRequest(messages=[second]), metadata=META)
            assert again.entries[0].offset == entry.offset + 1  # one group, one queue
            stored = []
            for qid in range(broker.topics.get("SendTopic").write_queue_nums):
                got = broker.store.get_message("g", "SendTopic", qid, 0, 32)
                stored += [decode_message(bytes(b)) for b in got.buffers]
            assert len(stored) == 2 and stored[0].queue_id == stored[1].queue_id
            props = stored[0].properties
            assert stored[0].body == b"hello v5"
            assert props["UNIQ_KEY"] == "01ABCDEF0123456789ABCDEF0123456789"
            assert (props["TAGS"], props["KEYS"], props["color"]) == ("TagA", "k1 k2", "blue")
            assert props["__SHARDINGKEY"] == "order-7"

            # delivery_timestamp is a timer message: parked in the wheel's topic until its time,
            # and a time beyond timerMaxDelaySec (3 days) is refused, as RocketMQ 5 refuses it.
            due_ms = int(time.time() * 1000) + 60_000
            timed = pb.Message(
                topic=pb.Resource(name="SendTopic"),
                body=b"later",
                system_properties=pb.SystemProperties(
                    message_id="01ABCDEF0123456789ABCDEF0123456790",
                    message_type=pb.DELAY,
                    delivery_timestamp={"seconds": due_ms // 1000, "nanos": due_ms % 1000 * 1_000_000},
                ),
            )
            parked = await send(pb.SendMessageRequest(messages=[timed]), metadata=META)
            assert parked.status.code == pb.OK, parked.status
            wheel = broker.store.get_message("g", "rmq_sys_wheel_timer", 0, 0, 32)
            (waiting,) = [decode_message(bytes(b)) for b in wheel.buffers]
            assert waiting.body == b"later"
            assert waiting.properties["TIMER_DELIVER_MS"] == str(due_ms)
            assert waiting.properties["REAL_TOPIC"] == "SendTopic"
            timed.system_properties.delivery_timestamp.FromMilliseconds(2_000_000_000_000)
            timed.system_properties.message_id = "01ABCDEF0123456789ABCDEF0123456791"  # not a resend
            too_late = await send(pb.SendMessageRequest(messages=[timed]), metadata=META)
            assert too_late.status.code == pb.BAD_REQUEST, too_late.status
            assert "timerMaxDelaySec" in too_late.status.message

            empty = await send(
                pb.SendMessageRequest(messages=[pb.Message(topic=pb.Resource(name="SendTopic"))]),
                metadata=META,
            )
            assert empty.status.code == pb.MESSAGE_BODY_EMPTY
            bad_name = pb.Message(topic=pb.Resource(name="bad topic!"), body=b"x")
            refused = await send(pb.SendMessageRequest(messages=[bad_name]), metadata=META)
            assert refused.status.code == pb.ILLEGAL_TOPIC

    asyncio.run(main())


def test_bad_input_gets_grpc_statuses_and_the_broker_keeps_serving(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, max_frame_bytes=64 * 1024) as (_broker, channel):
            raw = channel.unary_unary(SERVICE + "SendMessage")  # bytes in, bytes out
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await raw(b"\xff\xff\xff\xff garbage", metadata=META)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert "malformed apache.rocketmq.v2.SendMessageRequest" in info.value.details()
            telemetry = channel.stream_stream(SERVICE + "Telemetry")(metadata=META)
            await telemetry.write(b"\xff\xff\xff garbage")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await telemetry.read()
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            unknown = channel.unary_unary("/apache.rocketmq.v2.MessagingService/NoSuchRpc")
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await unknown(b"", metadata=META)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
            big = pb.Message(topic=pb.Resource(name="BigTopic"), body=b"x" * (128 * 1024))
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await call(channel, "SendMessage", "SendMessageResponse")(
                    pb.SendMessageRequest(messages=[big]), metadata=META
                )
            assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            ok = await call(channel, "QueryRoute", "QueryRouteResponse")(
                pb.QueryRouteRequest(topic=pb.Resource(name="StillUp")), metadata=META
            )
            assert ok.status.code == pb.OK

    asyncio.run(main())


def test_grpc_options_are_checked_and_selecting_it_as_the_transport_is_refused(
    tidemq_make_broker: MakeBroker, tmp_path: Path
) -> None:
    async def start(**kwargs: Any) -> None:
        async with tidemq_make_broker(**kwargs):
            pass

    with pytest.raises(ConfigError, match="listen"):
        asyncio.run(start(options={"transport": {"grpc": {"listen": "nowhere"}}}))
    with pytest.raises(ConfigError, match="unknown key"):
        asyncio.run(start(options={"transport": {"grpc": {"lisen": "127.0.0.1:0"}}}))
    with pytest.raises(ConfigError, match="beside the remoting transport"):
        asyncio.run(start(plugins={"transport": "grpc"}))
    # With the plain ACL the endpoint serves: it checks the v5 clients' signature (test_grpc_acl.py).
    acl = tmp_path / "acl.yml"
    acl.write_text("accounts: [{accessKey: grpcTester, secretKey: grpcSecret123, admin: true}]\n")
    options = {"transport": {"grpc": {"listen": "127.0.0.1:0"}}, "acl": {"plain": {"file": str(acl)}}}
    asyncio.run(start(plugins={"acl": "plain"}, options=options))


def test_a_missing_grpcio_is_named_when_the_endpoint_is_enabled() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['grpc'] = None\n"
        "from tidemq_transport_grpc.proto import load\n"
        "try:\n    load()\nexcept Exception as exc:\n    print(type(exc).__name__, exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60).stdout
    assert out.startswith("ConfigError") and "pip install 'tidemq[grpc]'" in out


def test_pull_consumer_rpcs_read_offsets_and_messages_as_sent(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            typed_topic(broker, "PullTopic", "FIFO")
            send = call(channel, "SendMessage", "SendMessageResponse")
            for i in range(3):
                message = pb.Message(
                    topic=pb.Resource(name="PullTopic"),
                    user_properties={"idx": str(i)},
                    body=f"m{i}".encode(),
                    system_properties=pb.SystemProperties(
                        tag="A" if i != 1 else "B", message_id=f"01{i:032X}", message_group="g1"
                    ),
                )
                assert (
                    await send(pb.SendMessageRequest(messages=[message]), metadata=META)
                ).status.code == pb.OK
            qid = next(q for q in range(4) if broker.store.get_max_offset_in_queue("PullTopic", q) == 3)
            mq = pb.MessageQueue(topic=pb.Resource(name="PullTopic"), id=qid)
            end = await call(channel, "QueryOffset", "QueryOffsetResponse")(
                pb.QueryOffsetRequest(message_queue=mq, query_offset_policy=pb.END), metadata=META
            )
            assert (end.status.code, end.offset) == (pb.OK, 3)
            pull = channel.unary_stream(
                SERVICE + "PullMessage",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.PullMessageResponse.FromString,
            )
            request = pb.PullMessageRequest(
                group=pb.Resource(name="G5"),
                message_queue=mq,
                offset=0,
                batch_size=10,
                filter_expression=pb.FilterExpression(type=pb.TAG, expression="A"),
            )
            answers = [r async for r in pull(request, metadata=META)]
            assert answers[0].status.code == pb.OK
            got = [a.message for a in answers if a.WhichOneof("content") == "message"]
            assert [m.body for m in got] == [b"m0", b"m2"]  # tag B filtered out
            assert [m.system_properties.message_id for m in got] == [f"01{0:032X}", f"01{2:032X}"]
            assert got[0].user_properties["idx"] == "0" and got[0].system_properties.message_group == "g1"
            assert answers[-1].next_offset == 3
            none = [
                r
                async for r in pull(
                    pb.PullMessageRequest(
                        group=pb.Resource(name="G5"), message_queue=mq, offset=3, batch_size=10
                    ),
                    metadata=META,
                )
            ]
            assert none[0].status.code == pb.MESSAGE_NOT_FOUND and none[-1].next_offset == 3

            get = call(channel, "GetOffset", "GetOffsetResponse")
            missing = await get(
                pb.GetOffsetRequest(group=pb.Resource(name="G5"), message_queue=mq), metadata=META
            )
            assert missing.status.code == pb.OFFSET_NOT_FOUND
            update = call(channel, "UpdateOffset", "UpdateOffsetResponse")
            ok = await update(
                pb.UpdateOffsetRequest(group=pb.Resource(name="G5"), message_queue=mq, offset=3),
                metadata=META,
            )
            assert ok.status.code == pb.OK
            assert broker.offsets.query("G5", "PullTopic", qid) == 3  # what a 4.x consumer of G5 resumes from
            now = await get(
                pb.GetOffsetRequest(group=pb.Resource(name="G5"), message_queue=mq), metadata=META
            )
            assert (now.status.code, now.offset) == (pb.OK, 3)

    asyncio.run(main())


def test_a_broker_stopped_right_after_it_started_stops_its_endpoint_cleanly(tmp_path: Path) -> None:
    # A grpc.aio server whose start was cancelled half-way and then stopped crashed the process
    # (SIGSEGV): run in a subprocess so a crash is a failure here, not the end of the test run.
    import subprocess
    import sys

    code = (
        "import asyncio, sys\n"
        "from pathlib import Path\n"
        "from tidemq.testing.pytest_plugin import running_broker\n"
        "async def main(i):\n"
        "    options = {'transport': {'grpc': {'listen': '127.0.0.1:0'}}}\n"
        "    async with running_broker(Path(sys.argv[1]) / str(i), options=options):\n"
        "        pass\n"
        "for i in range(3):\n"
        "    asyncio.run(main(i))\n"
        "print('clean')\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "clean", out.stderr[-2000:]


def test_one_connection_gets_no_more_streams_than_max_concurrent_streams(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, max_concurrent_streams=2) as (_broker, channel):
            telemetry = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )
            hello = pb.TelemetryCommand(
                settings=pb.Settings(client_type=pb.PRODUCER, publishing=pb.Publishing())
            )
            open_streams = []
            for _ in range(2):
                stream = telemetry(metadata=META)
                await stream.write(hello)
                assert (await asyncio.wait_for(stream.read(), 10)).status.code == pb.OK
                open_streams.append(stream)
            third = telemetry(metadata=META)

            async def first_answer() -> Any:
                await third.write(hello)
                return await third.read()

            answer = asyncio.ensure_future(first_answer())
            await asyncio.sleep(0.5)
            assert not answer.done()  # waits for a free stream, not served beside the two
            open_streams[0].cancel()
            assert (await asyncio.wait_for(answer, 10)).status.code == pb.OK
            for stream in (open_streams[1], third):
                stream.cancel()

    asyncio.run(main())


def test_the_born_host_a_client_reports_or_its_peer_address_is_kept_when_it_is_an_ip() -> None:
    from tidemq_transport_grpc.peer import born_address

    assert born_address("192.168.1.5") == ("192.168.1.5", 0)
    assert born_address("fe80::1") == ("fe80::1", 0)
    assert born_address("ipv4:10.0.0.7:51234") == ("10.0.0.7", 51234)
    assert born_address("ipv6:[::1]:51234") == ("::1", 51234)
    assert born_address("not-an-ip") == ("127.0.0.1", 0)


def test_a_client_on_ipv6_can_send(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            message = pb.Message(
                topic=pb.Resource(name="V6Topic"),
                body=b"from v6",
                system_properties=pb.SystemProperties(message_id="01BB", born_host="fe80::1"),
            )
            response = await call(channel, "SendMessage", "SendMessageResponse")(
                pb.SendMessageRequest(messages=[message]), metadata=META
            )
            assert response.status.code == pb.OK, response.status

    asyncio.run(main())


@pytest.mark.skipif(__import__("shutil").which("openssl") is None, reason="needs the openssl command")
def test_tls_serves_clients_that_trust_its_ca_and_refuses_plain_ones(
    tidemq_make_broker: MakeBroker, tmp_path: Path
) -> None:
    from test_tls_verification import make_certs

    certs = make_certs(tmp_path)
    tls = {"tls_certfile": str(certs["good"]), "tls_keyfile": str(certs["good_key"])}

    async def main() -> None:
        options = {"transport": {"grpc": {"listen": "127.0.0.1:0", **tls}}}
        async with tidemq_make_broker(auto_create_topic=True, options=options) as broker:
            server = grpc_plugin.server_of(broker)
            assert server is not None
            trusted = grpc.ssl_channel_credentials(root_certificates=certs["ca"].read_bytes())
            request = pb.QueryRouteRequest(topic=pb.Resource(name="TlsTopic"))
            async with grpc.aio.secure_channel(server.address, trusted) as channel:
                answer = await call(channel, "QueryRoute", "QueryRouteResponse")(
                    request, metadata=META, timeout=10
                )
                assert answer.status.code == pb.OK
            async with grpc.aio.insecure_channel(server.address) as channel:
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await call(channel, "QueryRoute", "QueryRouteResponse")(request, metadata=META, timeout=5)
                assert info.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(main())

    async def start(grpc_options: dict[str, str]) -> None:
        async with tidemq_make_broker(
            options={"transport": {"grpc": {"listen": "127.0.0.1:0", **grpc_options}}}
        ):
            pass

    with pytest.raises(ConfigError, match="both tls_certfile and tls_keyfile"):
        asyncio.run(start({"tls_certfile": str(certs["good"])}))
    with pytest.raises(ConfigError, match="tls_keyfile = .*No such file"):
        asyncio.run(start({**tls, "tls_keyfile": str(tmp_path / "missing.key")}))


def test_a_pull_at_the_end_of_the_queue_waits_for_the_next_message(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            broker.topics.create_in_send("PollTopic", "TBW102", 1)
            mq = pb.MessageQueue(topic=pb.Resource(name="PollTopic"), id=0)
            pull = channel.unary_stream(
                SERVICE + "PullMessage",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.PullMessageResponse.FromString,
            )
            request = pb.PullMessageRequest(
                group=pb.Resource(name="GP"),
                message_queue=mq,
                offset=0,
                batch_size=4,
                long_polling_timeout={"seconds": 10},
            )

            async def pull_all() -> list[Any]:
                return [r async for r in pull(request, metadata=META, timeout=15)]

            waiting = asyncio.ensure_future(pull_all())
            await asyncio.sleep(0.5)
            assert not waiting.done()  # held: nothing to read yet
            message = pb.Message(
                topic=pb.Resource(name="PollTopic"),
                body=b"late",
                system_properties=pb.SystemProperties(message_id="01CC"),
            )
            sent = await call(channel, "SendMessage", "SendMessageResponse")(
                pb.SendMessageRequest(messages=[message]), metadata=META
            )
            assert sent.status.code == pb.OK
            answers = await asyncio.wait_for(waiting, 10)
            assert answers[0].status.code == pb.OK and answers[1].message.body == b"late"
            # A deadline shorter than the poll: answered (nothing new) before the client gives up.
            request.offset = 1
            started = asyncio.get_running_loop().time()
            held = [r async for r in pull(request, metadata=META, timeout=1.5)]
            assert held[0].status.code == pb.MESSAGE_NOT_FOUND
            assert 0.8 < asyncio.get_running_loop().time() - started < 1.5
            # Without long_polling_timeout a pull answers at once.
            request.ClearField("long_polling_timeout")
            request.offset = 1
            empty = await asyncio.wait_for(pull_all(), 2)
            assert empty[0].status.code == pb.MESSAGE_NOT_FOUND

    asyncio.run(main())


class _SendWatch:
    """A plugin vetoing sends to one topic and recording the sends it saw settle."""

    def __init__(self, vetoed: str) -> None:
        self.vetoed = vetoed
        self.settled: list[tuple[str, str]] = []

    @hookimpl
    def tidemq_before_send(self, context: Any) -> str | None:
        return "quota exceeded" if context.topic == self.vetoed else None

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        self.settled.append((context.topic, context.status))


def test_grpc_sends_go_through_the_send_hooks_as_remoting_sends_do(tidemq_make_broker: MakeBroker) -> None:
    watch = _SendWatch("VetoedTopic")
    pm = get_plugin_manager()
    name = pm.register(watch, name="grpc-send-watch")

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (_broker, channel):
            send = call(channel, "SendMessage", "SendMessageResponse")

            def message(topic: str) -> Any:
                return pb.Message(
                    topic=pb.Resource(name=topic),
                    body=b"b",
                    system_properties=pb.SystemProperties(message_id="01CC"),
                )

            refused = await send(pb.SendMessageRequest(messages=[message("VetoedTopic")]), metadata=META)
            assert refused.status.code == pb.FORBIDDEN and "quota exceeded" in refused.status.message
            ok = await send(pb.SendMessageRequest(messages=[message("HookedTopic")]), metadata=META)
            assert ok.status.code == pb.OK
            assert ("HookedTopic", "SUCCESS") in watch.settled
            assert ("VetoedTopic", "NO_PERMISSION") in watch.settled

    try:
        asyncio.run(main())
    finally:
        pm.hook_manager.unregister(name=name)


def test_a_half_message_waits_for_end_transaction_and_a_bad_transaction_id_is_refused(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            typed_topic(broker, "TxTopic", "TRANSACTION")
            send = call(channel, "SendMessage", "SendMessageResponse")
            end = call(channel, "EndTransaction", "EndTransactionResponse")
            half = pb.Message(
                topic=pb.Resource(name="TxTopic"),
                body=b"half",
                system_properties=pb.SystemProperties(message_id="01DD", message_type=pb.TRANSACTION),
            )
            sent = await send(pb.SendMessageRequest(messages=[half]), metadata=META)
            assert sent.status.code == pb.OK, sent.status
            tx_id = sent.entries[0].transaction_id
            assert tx_id

            for qid in range(broker.topics.get("TxTopic").write_queue_nums):
                assert not broker.store.get_message("g", "TxTopic", qid, 0, 32).buffers
            for bad in ("", "nonsense", "not-an-id:7"):
                refused = await end(
                    pb.EndTransactionRequest(
                        topic=pb.Resource(name="TxTopic"),
                        message_id="01DD",
                        transaction_id=bad,
                        resolution=pb.COMMIT,
                    ),
                    metadata=META,
                )
                assert refused.status.code == pb.INVALID_TRANSACTION_ID, bad
            wrong_topic = await end(
                pb.EndTransactionRequest(
                    topic=pb.Resource(name="Other"),
                    message_id="01DD",
                    transaction_id=tx_id,
                    resolution=pb.COMMIT,
                ),
                metadata=META,
            )
            assert wrong_topic.status.code != pb.OK  # the half message's producer group is its topic's
            done = await end(
                pb.EndTransactionRequest(
                    topic=pb.Resource(name="TxTopic"),
                    message_id="01DD",
                    transaction_id=tx_id,
                    resolution=pb.COMMIT,
                ),
                metadata=META,
            )
            assert done.status.code == pb.OK, done.status
            bodies = []
            for qid in range(broker.topics.get("TxTopic").write_queue_nums):
                got = broker.store.get_message("g", "TxTopic", qid, 0, 32)
                bodies += [decode_message(bytes(b)).body for b in got.buffers]
            assert bodies == [b"half"]

    asyncio.run(main())


def test_the_broker_s_transaction_check_reaches_the_producer_s_telemetry_stream(
    tidemq_make_broker: MakeBroker,
) -> None:
    """A half message left unknown: the check service asks the producer over its Telemetry stream
    (RecoverOrphanedTransactionCommand), whose EndTransaction from the check commits it; a stream
    that ended is no longer asked."""
    fast_checks = {"transaction_check_interval_s": 0.2, "transaction_timeout_s": 0.0}

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, fast_checks) as (broker, channel):
            typed_topic(broker, "TxCheck", "TRANSACTION")
            telemetry = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )
            stream = telemetry(metadata=META)
            settings = pb.Settings(
                client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="TxCheck")])
            )
            await stream.write(pb.TelemetryCommand(settings=settings))
            assert (await asyncio.wait_for(stream.read(), 10)).status.code == pb.OK
            half = pb.Message(
                topic=pb.Resource(name="TxCheck"),
                body=b"ask me",
                system_properties=pb.SystemProperties(
                    message_id="01EE", tag="T", keys=["k"], message_type=pb.TRANSACTION
                ),
            )
            sent = await call(channel, "SendMessage", "SendMessageResponse")(
                pb.SendMessageRequest(messages=[half]), metadata=META
            )
            assert sent.status.code == pb.OK, sent.status
            command = await asyncio.wait_for(stream.read(), 10)
            assert command.WhichOneof("command") == "recover_orphaned_transaction_command"
            check = command.recover_orphaned_transaction_command
            assert check.message.topic.name == "TxCheck" and check.message.body == b"ask me"
            assert check.message.system_properties.message_id == "01EE"
            assert check.message.system_properties.message_type == pb.TRANSACTION
            assert check.transaction_id
            done = await call(channel, "EndTransaction", "EndTransactionResponse")(
                pb.EndTransactionRequest(
                    topic=pb.Resource(name="TxCheck"),
                    message_id="01EE",
                    transaction_id=check.transaction_id,
                    resolution=pb.COMMIT,
                    source=pb.SOURCE_SERVER_CHECK,
                ),
                metadata=META,
            )
            assert done.status.code == pb.OK, done.status
            bodies = []
            for qid in range(broker.topics.get("TxCheck").write_queue_nums):
                got = broker.store.get_message("g", "TxCheck", qid, 0, 32)
                bodies += [decode_message(bytes(b)) for b in got.buffers]
            assert [m.body for m in bodies] == [b"ask me"]
            assert bodies[0].uniq_key == "01EE" and bodies[0].tags == "T"
            await stream.done_writing()
            assert await asyncio.wait_for(stream.read(), 10) == grpc.aio.EOF
            await asyncio.sleep(0.1)
            assert not broker.producers.groups.get("GRPC_PRODUCER_TxCheck")  # dropped with its stream

    asyncio.run(main())


def test_v5_clients_are_registered_with_their_own_language_and_version(
    tidemq_make_broker: MakeBroker,
) -> None:
    """A v5 producer's and consumer's registrations (producerConnection, consumerConnection,
    console, metrics) carry the client's language and version, as RocketMQ 5's proxy registers
    them: from its Settings' user agent, else from its calls' ``x-mq-language`` /
    ``x-mq-client-version`` metadata (the Python client sends both), not GRPC version 0."""
    from tidemq.client import version_desc

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            telemetry = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )
            # A producer whose Settings carry no user agent: its metadata tells.
            python_meta = (
                ("x-mq-client-id", "py-producer@1"),
                ("x-mq-language", "PYTHON"),
                ("x-mq-protocol", "GRPC_V2"),
                ("x-mq-client-version", "5.1.2"),
            )
            producer = telemetry(metadata=python_meta)
            await producer.write(
                pb.TelemetryCommand(
                    settings=pb.Settings(
                        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Who")])
                    )
                )
            )
            assert (await asyncio.wait_for(producer.read(), 10)).status.code == pb.OK
            # A consumer whose Settings say it is a Go client of 5.0.5 (they win over metadata).
            consumer = telemetry(metadata=(("x-mq-client-id", "go-consumer@1"), ("x-mq-language", "JAVA")))
            await consumer.write(
                simple_consumer_settings(
                    "WhoGroup", "Who", user_agent=pb.UA(language=pb.GOLANG, version="5.0.5")
                )
            )
            assert (await asyncio.wait_for(consumer.read(), 10)).status.code == pb.OK

            (made,) = broker.producers.groups["GRPC_PRODUCER_Who"].values()
            assert made.client_id == "py-producer@1"
            assert (made.language, version_desc(made.version)) == ("PYTHON", "V5_1_2")
            (member,) = broker.consumers.groups["WhoGroup"].channels.values()
            assert member.client_id == "go-consumer@1"
            assert (member.language, version_desc(member.version)) == ("GO", "V5_0_5")
            producer.cancel()
            consumer.cancel()

    asyncio.run(main())


def test_get_consumer_status_lists_a_v5_consumer_of_the_endpoint_with_an_empty_table(
    tidemq_make_broker: MakeBroker,
) -> None:
    """mqadmin's ``getConsumerStatus`` (INVOKE_BROKER_TO_GET_CONSUMER_STATUS): the broker asks each
    client of the group; a v5 consumer of this endpoint holds no offsets of its own (it POPs) and
    answers an empty table, as `tidemq proxy` does for its v5 clients; before, its connection
    refused the request and the client was missing from the answer."""
    from tidemq import mqjson
    from tidemq.client import AdminClient
    from tidemq.remoting.codes import RequestCode, ResponseCode

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            telemetry = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )
            consumer = telemetry(metadata=(("x-mq-client-id", "status-consumer@1"),))
            await consumer.write(simple_consumer_settings("StatusGroup", "StatusTopic"))
            assert (await asyncio.wait_for(consumer.read(), 10)).status.code == pb.OK
            admin = AdminClient("127.0.0.1:1", timeout=15)
            try:
                answer = await admin.call(
                    broker.address,
                    RequestCode.INVOKE_BROKER_TO_GET_CONSUMER_STATUS,
                    {"topic": "StatusTopic", "group": "StatusGroup"},
                    ok=tuple(range(-1, 400)),
                )
            finally:
                await admin.close()
            assert answer.code == ResponseCode.SUCCESS, answer.remark
            assert mqjson.loads(answer.body)["consumerTable"] == {"status-consumer@1": {}}
            consumer.cancel()

    asyncio.run(main())

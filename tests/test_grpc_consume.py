"""The v5 consumer RPCs of the gRPC endpoint (ReceiveMessage, AckMessage, ChangeInvisibleDuration,
ForwardMessageToDeadLetterQueue, QueryAssignment, RecallMessage, consumer Telemetry), driven with
raw grpcio stubs against a real broker: what a SimpleConsumer/PushConsumer relies on, and bad input.

The official client's scenarios are in tests/compat/test_grpc_official_consume.py.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from telemetry_support import consumer_settings  # noqa: E402
from test_grpc_transport import META, SERVICE, call, grpc_broker, pb  # noqa: E402

MakeBroker = Callable[..., AbstractAsyncContextManager[Any]]
#: Short minimums so that invisibility and polling can be seen in a fast test.
FAST = {
    "receive_min_invisible_ms": 100,
    "receive_min_polling_ms": 0,
    # Auto-created topics take FIFO and timer messages here (types: test_topic_message_types.py).
    "enable_topic_message_type_check": False,
}


def receive_stub(channel: Any) -> Any:
    return channel.unary_stream(
        SERVICE + "ReceiveMessage",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=pb.ReceiveMessageResponse.FromString,
    )


async def receive(
    channel: Any,
    group: str,
    topic: str,
    *,
    batch: int = 32,
    invisible_ms: int | None = 10_000,
    poll_ms: int | None = 0,
    tag: str = "*",
    auto_renew: bool = False,
    timeout: float = 10,
) -> tuple[list[Any], list[Any]]:
    """One ReceiveMessage: (the stream's answers in order, the messages among them)."""
    request = pb.ReceiveMessageRequest(
        group=pb.Resource(name=group),
        message_queue=pb.MessageQueue(topic=pb.Resource(name=topic), id=-1),
        filter_expression=pb.FilterExpression(type=pb.TAG, expression=tag),
        batch_size=batch,
        auto_renew=auto_renew,
    )
    if invisible_ms is not None:
        request.invisible_duration.FromMilliseconds(invisible_ms)
    if poll_ms is not None:
        request.long_polling_timeout.FromMilliseconds(poll_ms)
    answers = [a async for a in receive_stub(channel)(request, metadata=META, timeout=timeout)]
    return answers, [a.message for a in answers if a.WhichOneof("content") == "message"]


async def send(channel: Any, topic: str, bodies: list[bytes], **system: Any) -> list[Any]:
    messages = [
        pb.Message(
            topic=pb.Resource(name=topic),
            body=body,
            user_properties={"i": str(i)},
            system_properties=pb.SystemProperties(
                message_id=f"01AA{i:030d}{int(time.time() * 1000) % 10**6:06d}"[-34:], **system
            ),
        )
        for i, body in enumerate(bodies)
    ]
    for m in messages:
        m.system_properties.born_timestamp.FromMilliseconds(int(time.time() * 1000))
    answer = await call(channel, "SendMessage", "SendMessageResponse")(
        pb.SendMessageRequest(messages=messages), metadata=META
    )
    assert answer.status.code == pb.OK, answer.status
    return list(answer.entries)


async def ack(channel: Any, group: str, topic: str, messages: list[Any]) -> Any:
    entries = [
        pb.AckMessageEntry(
            message_id=m.system_properties.message_id, receipt_handle=m.system_properties.receipt_handle
        )
        for m in messages
    ]
    return await call(channel, "AckMessage", "AckMessageResponse")(
        pb.AckMessageRequest(group=pb.Resource(name=group), topic=pb.Resource(name=topic), entries=entries),
        metadata=META,
    )


async def change(channel: Any, group: str, topic: str, handle: str, ms: int) -> Any:
    request = pb.ChangeInvisibleDurationRequest(
        group=pb.Resource(name=group), topic=pb.Resource(name=topic), receipt_handle=handle
    )
    request.invisible_duration.FromMilliseconds(ms)
    return await call(channel, "ChangeInvisibleDuration", "ChangeInvisibleDurationResponse")(
        request, metadata=META
    )


def kinds(answers: list[Any]) -> list[str]:
    return [a.WhichOneof("content") for a in answers]


def test_receive_answers_status_messages_then_timestamp_and_ack_settles_them(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            answers, none = await receive(channel, "G1", "RecvTopic")
            assert none == [] and kinds(answers) == ["status", "delivery_timestamp"]
            assert answers[0].status.code == pb.TOPIC_NOT_FOUND
            sent = await send(
                channel, "RecvTopic", [f"m{i}".encode() for i in range(5)], tag="TagA", keys=["k"]
            )
            before = time.time()
            answers, got = await receive(channel, "G1", "RecvTopic", invisible_ms=10_000)
            assert kinds(answers) == ["status"] + ["message"] * 5 + ["delivery_timestamp"]
            assert answers[0].status.code == pb.OK
            assert abs(answers[-1].delivery_timestamp.ToMilliseconds() / 1000 - time.time()) < 5
            assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(5)]
            assert {m.system_properties.message_id for m in got} == {e.message_id for e in sent}
            for m in got:
                system = m.system_properties
                assert m.topic.name == "RecvTopic"
                assert system.tag == "TagA" and list(system.keys) == ["k"]
                assert system.delivery_attempt == 1
                assert system.invisible_duration.ToMilliseconds() == 10_000
                assert system.receipt_handle and system.HasField("queue_offset")
                assert system.born_timestamp.ToMilliseconds() > 0
                assert abs(system.store_timestamp.ToMilliseconds() / 1000 - before) < 5
                assert m.user_properties["i"] in {"0", "1", "2", "3", "4"}
            assert broker.pop.in_flight("G1") == 5
            # Invisible to the group meanwhile.
            _, again = await receive(channel, "G1", "RecvTopic")
            assert again == []
            done = await ack(channel, "G1", "RecvTopic", got)
            assert done.status.code == pb.OK, done.status
            assert [e.status.code for e in done.entries] == [pb.OK] * 5
            assert [e.receipt_handle for e in done.entries] == [
                m.system_properties.receipt_handle for m in got
            ]
            assert broker.pop.in_flight("G1") == 0
            # A replayed ack is refused per entry, and settles nothing twice.
            replay = await ack(channel, "G1", "RecvTopic", got[:2])
            assert replay.status.code == pb.INVALID_RECEIPT_HANDLE
            assert [e.status.code for e in replay.entries] == [pb.INVALID_RECEIPT_HANDLE] * 2
            # One good entry and one replayed: MULTIPLE_RESULTS, each with its own status.
            await send(channel, "RecvTopic", [b"late"])
            _, (late,) = await receive(channel, "G1", "RecvTopic")
            mixed = await ack(channel, "G1", "RecvTopic", [late, got[0]])
            assert mixed.status.code == pb.MULTIPLE_RESULTS
            assert [e.status.code for e in mixed.entries] == [pb.OK, pb.INVALID_RECEIPT_HANDLE]

    asyncio.run(main())


def test_change_invisible_duration_hands_a_new_handle_and_the_message_comes_back_after_it(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            await send(channel, "InvTopic", [b"again"])
            _, (first,) = await receive(channel, "G2", "InvTopic", invisible_ms=30_000)
            old = first.system_properties.receipt_handle
            changed = await change(channel, "G2", "InvTopic", old, 300)
            assert changed.status.code == pb.OK, changed.status
            assert changed.receipt_handle and changed.receipt_handle != old
            # The old handle is spent.
            stale = await ack(channel, "G2", "InvTopic", [first])
            assert stale.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE
            # Visible again after 300 ms, from the retry topic, as the topic the client subscribed.
            deadline = time.monotonic() + 10
            back: list[Any] = []
            while not back and time.monotonic() < deadline:
                _, back = await receive(channel, "G2", "InvTopic", poll_ms=1000)
            (second,) = back
            assert second.body == b"again" and second.topic.name == "InvTopic"
            assert second.system_properties.message_id == first.system_properties.message_id
            assert second.system_properties.delivery_attempt == 2
            done = await ack(channel, "G2", "InvTopic", [second])
            assert done.status.code == pb.OK
            # A message not changed within its invisible time is redelivered as well.
            await send(channel, "InvTopic", [b"slow"])
            _, (slow,) = await receive(channel, "G2", "InvTopic", invisible_ms=300)
            await asyncio.sleep(0.5)
            expired = await ack(channel, "G2", "InvTopic", [slow])
            assert expired.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE
            assert "expired" in expired.entries[0].status.message
            deadline = time.monotonic() + 10
            back = []
            while not back and time.monotonic() < deadline:
                _, back = await receive(channel, "G2", "InvTopic", poll_ms=1000)
            assert [m.body for m in back] == [b"slow"]
            assert back[0].system_properties.delivery_attempt == 2
            assert broker.pop.in_flight("G2") == 1

    asyncio.run(main())


def test_forward_to_dead_letter_queue_moves_the_message_and_it_is_not_redelivered(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            await send(channel, "DlqTopic", [b"poison"])
            _, (msg,) = await receive(channel, "G3", "DlqTopic", invisible_ms=300)
            forward = call(
                channel, "ForwardMessageToDeadLetterQueue", "ForwardMessageToDeadLetterQueueResponse"
            )
            request = pb.ForwardMessageToDeadLetterQueueRequest(
                group=pb.Resource(name="G3"),
                topic=pb.Resource(name="DlqTopic"),
                receipt_handle=msg.system_properties.receipt_handle,
                message_id=msg.system_properties.message_id,
                delivery_attempt=1,
                max_delivery_attempts=17,
            )
            done = await forward(request, metadata=META)
            assert done.status.code == pb.OK, done.status
            dlq = broker.store.get_message("t", "%DLQ%G3", 0, 0, 32)
            assert len(dlq.buffers) == 1
            from tidemq.message import decode_message

            dead = decode_message(bytes(dlq.buffers[0]))
            assert dead.body == b"poison" and dead.uniq_key == msg.system_properties.message_id
            await asyncio.sleep(0.6)  # past its invisible time: still not delivered again
            _, back = await receive(channel, "G3", "DlqTopic", poll_ms=500)
            assert back == []
            assert broker.pop.in_flight("G3") == 0
            # Twice: the handle is spent.
            again = await forward(request, metadata=META)
            assert again.status.code == pb.INVALID_RECEIPT_HANDLE
            assert len(broker.store.get_message("t", "%DLQ%G3", 0, 0, 32).buffers) == 1

    asyncio.run(main())


def test_fifo_group_gets_one_message_group_in_order_and_the_next_only_after_ack(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            import attrs

            cfg = broker.groups.find_or_create("GFIFO")
            broker.groups.update(attrs.evolve(cfg, consume_message_orderly=True))
            await send(channel, "FifoTopic", [f"o{i}".encode() for i in range(6)], message_group="order-1")
            _, got = await receive(channel, "GFIFO", "FifoTopic", batch=3, invisible_ms=5_000)
            assert [m.body for m in got] == [b"o0", b"o1", b"o2"]
            assert {m.system_properties.message_group for m in got} == {"order-1"}
            # The queue is held until the batch is acknowledged.
            _, held = await receive(channel, "GFIFO", "FifoTopic", batch=3)
            assert held == []
            assert (await ack(channel, "GFIFO", "FifoTopic", got)).status.code == pb.OK
            _, rest = await receive(channel, "GFIFO", "FifoTopic", batch=32)
            assert [m.body for m in rest] == [b"o3", b"o4", b"o5"]

    asyncio.run(main())


def test_query_assignment_hands_every_queue_of_this_broker(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            query = call(channel, "QueryAssignment", "QueryAssignmentResponse")
            await send(channel, "AssignTopic", [b"x"])
            answer = await query(
                pb.QueryAssignmentRequest(
                    topic=pb.Resource(name="AssignTopic"), group=pb.Resource(name="GA")
                ),
                metadata=META,
            )
            assert answer.status.code == pb.OK, answer.status
            (assignment,) = answer.assignments
            queue = assignment.message_queue
            assert queue.id == -1 and queue.topic.name == "AssignTopic"
            assert queue.broker.name == broker.settings.name
            address = queue.broker.endpoints.addresses[0]
            assert (
                f"{address.host}:{address.port}"
                == __import__("tidemq_transport_grpc.plugin", fromlist=["server_of"])
                .server_of(broker)
                .address
            )
            missing = await query(
                pb.QueryAssignmentRequest(
                    topic=pb.Resource(name="NoSuchTopic"), group=pb.Resource(name="GA")
                ),
                metadata=META,
            )
            assert missing.status.code == pb.TOPIC_NOT_FOUND
            bad = await query(
                pb.QueryAssignmentRequest(
                    topic=pb.Resource(name="AssignTopic"), group=pb.Resource(name="bad group!")
                ),
                metadata=META,
            )
            assert bad.status.code == pb.ILLEGAL_CONSUMER_GROUP

    asyncio.run(main())


def test_recall_cancels_a_timer_message_through_its_send_handle(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            due_ms = int(time.time() * 1000) + 3_000
            stamp = {"seconds": due_ms // 1000, "nanos": due_ms % 1000 * 1_000_000}
            kept, gone = (
                (
                    await send(
                        channel, "RecallTopic", [b"kept"], message_type=pb.DELAY, delivery_timestamp=stamp
                    )
                )[0],
                (
                    await send(
                        channel, "RecallTopic", [b"recalled"], message_type=pb.DELAY, delivery_timestamp=stamp
                    )
                )[0],
            )
            assert gone.recall_handle and kept.recall_handle
            recall = call(channel, "RecallMessage", "RecallMessageResponse")
            done = await recall(
                pb.RecallMessageRequest(
                    topic=pb.Resource(name="RecallTopic"), recall_handle=gone.recall_handle
                ),
                metadata=META,
            )
            assert done.status.code == pb.OK, done.status
            assert done.message_id == gone.message_id
            for handle, topic in (("not a handle", "RecallTopic"), (kept.recall_handle, "OtherTopic")):
                bad = await recall(
                    pb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle),
                    metadata=META,
                )
                assert bad.status.code in (pb.BAD_REQUEST, pb.TOPIC_NOT_FOUND), bad.status
            deadline = time.monotonic() + 15
            got: list[Any] = []
            while time.monotonic() < deadline and not got:
                _, got = await receive(channel, "GR", "RecallTopic", poll_ms=1000)
            assert [m.body for m in got] == [b"kept"]
            assert got[0].system_properties.delivery_timestamp.ToMilliseconds() == due_ms
            _, more = await receive(channel, "GR", "RecallTopic", poll_ms=1500)
            assert more == []
            # A time in ms where seconds are due (what a v5 client sends for msg.delivery_timestamp
            # set in ms) is out of protobuf's Timestamp range: refused, not an UNKNOWN error.
            wild = pb.Message(topic=pb.Resource(name="RecallTopic"), body=b"x")
            wild.system_properties.message_id = "01FF"
            wild.system_properties.delivery_timestamp.seconds = due_ms
            refused = await call(channel, "SendMessage", "SendMessageResponse")(
                pb.SendMessageRequest(messages=[wild]), metadata=META
            )
            assert refused.status.code == pb.ILLEGAL_DELIVERY_TIME, refused.status

    asyncio.run(main())


def test_consumer_settings_come_from_the_group_and_register_it_as_a_consumer(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            import attrs

            cfg = broker.groups.find_or_create("GSET")
            broker.groups.update(attrs.evolve(cfg, consume_message_orderly=True, retry_max_times=4))
            stream = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )(metadata=META)
            settings = pb.Settings(
                client_type=pb.PUSH_CONSUMER,
                subscription=pb.Subscription(
                    group=pb.Resource(name="GSET"),
                    subscriptions=[
                        pb.SubscriptionEntry(
                            topic=pb.Resource(name="SetTopic"),
                            expression=pb.FilterExpression(type=pb.TAG, expression="A||B"),
                        )
                    ],
                ),
                user_agent=pb.UA(language=pb.PYTHON, version="5.1.2"),
            )
            await stream.write(pb.TelemetryCommand(settings=settings))
            answer = await asyncio.wait_for(stream.read(), 10)
            assert answer.status.code == pb.OK
            sub = answer.settings.subscription
            assert sub.fifo is True
            assert sub.receive_batch_size == 32
            assert sub.long_polling_timeout.ToMilliseconds() == 20_000
            policy = answer.settings.backoff_policy
            assert policy.max_attempts == 5
            assert [d.seconds for d in policy.customized_backoff.next][:3] == [1, 5, 10]
            # The group's connection, as consumerConnection shows it.
            info = broker.consumers.get("GSET")
            assert info is not None and info.client_ids() == ["test-client@1"]
            assert "SetTopic" in info.subscriptions
            assert info.subscriptions["SetTopic"].sub_string == "A||B"
            assert info.consume_type == "CONSUME_PASSIVELY"  # a PushConsumer: fed (mqadmin: PUSH)
            heartbeat = await call(channel, "Heartbeat", "HeartbeatResponse")(
                pb.HeartbeatRequest(client_type=pb.PUSH_CONSUMER, group=pb.Resource(name="GSET")),
                metadata=META,
            )
            assert heartbeat.status.code == pb.OK
            await stream.done_writing()
            assert await asyncio.wait_for(stream.read(), 10) == grpc.aio.EOF
            deadline = time.monotonic() + 5
            while broker.consumers.get("GSET") is not None and broker.consumers.get("GSET").channels:
                assert time.monotonic() < deadline, "the consumer stayed registered after its stream ended"
                await asyncio.sleep(0.05)

    asyncio.run(main())


def test_auto_renew_keeps_a_message_invisible_until_acked_with_its_first_handle(
    tidemq_make_broker: MakeBroker,
) -> None:
    """A PushConsumer receives with auto_renew: the endpoint renews the message's invisibility
    (each renewal spends the handle) and takes the client's ack with the handle it received."""

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            renewals = grpc_plugin_service(broker).renewals
            renewals.slice_ms, renewals.ahead_ms, renewals.period_s = 800, 500, 0.1
            await send(channel, "RenewTopic", [b"long job", b"abandoned"])
            _, got = await receive(channel, "GREN", "RenewTopic", invisible_ms=None, auto_renew=True)
            assert sorted(m.body for m in got) == [b"abandoned", b"long job"]
            assert all(m.system_properties.invisible_duration.ToMilliseconds() == 800 for m in got)
            await asyncio.sleep(2.5)  # three slices: renewed, not redelivered
            _, none = await receive(channel, "GREN", "RenewTopic", poll_ms=0)
            assert none == []
            job = next(m for m in got if m.body == b"long job")
            done = await ack(channel, "GREN", "RenewTopic", [job])  # the handle it was first given
            assert done.status.code == pb.OK, done.status
            assert renewals.count() == 1
            # Its client goes away: the other one comes back a second later, not a slice later.
            await renewals.clear("test-client@1")
            await asyncio.sleep(1.3)
            _, back = await receive(channel, "GREN", "RenewTopic", poll_ms=2000)
            assert [m.body for m in back] == [b"abandoned"]
            assert broker.pop.in_flight("GREN") == 1

    asyncio.run(main())


def test_bad_consumer_input_gets_rocketmq_statuses_and_settles_nothing(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            await receive(channel, "GOTHER", "BadTopic")
            await send(channel, "BadTopic", [f"b{i}".encode() for i in range(40)])

            async def status_of(**kw: Any) -> int:
                answers, got = await receive(
                    channel, kw.pop("group", "GB"), kw.pop("topic", "BadTopic"), **kw
                )
                assert got == [] and kinds(answers) == ["status", "delivery_timestamp"], answers
                return int(answers[0].status.code)

            assert await status_of(topic="NoSuchTopic") == pb.TOPIC_NOT_FOUND
            assert await status_of(topic="bad topic!") == pb.ILLEGAL_TOPIC
            assert await status_of(group="") == pb.ILLEGAL_CONSUMER_GROUP
            assert await status_of(invisible_ms=-5_000) == pb.ILLEGAL_INVISIBLE_TIME
            assert await status_of(invisible_ms=13 * 3600 * 1000) == pb.ILLEGAL_INVISIBLE_TIME
            assert await status_of(invisible_ms=None) == pb.ILLEGAL_INVISIBLE_TIME
            assert await status_of(batch=0) == pb.BAD_REQUEST
            assert await status_of(batch=-1) == pb.BAD_REQUEST
            assert broker.pop.in_flight() == 0  # none of those popped anything
            # A huge batch is cut to 32, as the proxy cuts it.
            _, got = await receive(channel, "GB", "BadTopic", batch=10**9, invisible_ms=20_000)
            assert len(got) == 32
            handle = got[0].system_properties.receipt_handle
            parts = handle.split(" ")

            async def ack_status(group: str, text: str) -> int:
                entry = pb.AckMessageEntry(message_id="x", receipt_handle=text)
                answer = await call(channel, "AckMessage", "AckMessageResponse")(
                    pb.AckMessageRequest(
                        group=pb.Resource(name=group), topic=pb.Resource(name="BadTopic"), entries=[entry]
                    ),
                    metadata=META,
                )
                return int(answer.entries[0].status.code) if answer.entries else int(answer.status.code)

            forged = [
                "",
                "garbage",
                " ".join(["1"] * 9),
                " ".join(parts[:8]),  # the broker's extraInfo alone
                " ".join([*parts[:7], str(int(parts[7]) + 1000), parts[8]]),  # an offset never popped
                " ".join([*parts[:4], "7", *parts[5:]]),  # a retry item that is not one
                " ".join([*parts[:5], "other-broker", *parts[6:]]),
                " ".join([*parts[:2], str(int(parts[2]) + 1), *parts[3:]]),  # another invisible time
                " ".join([parts[0], "-1", *parts[2:]]),
                handle + " " + "9" * 5000,
            ]
            for text in forged:
                assert await ack_status("GB", text) == pb.INVALID_RECEIPT_HANDLE, text
            # Another group's handle names nothing of this group.
            assert await ack_status("GOTHER", handle) == pb.INVALID_RECEIPT_HANDLE
            expired = " ".join([parts[0], str(int(parts[1]) - 10**7), *parts[2:]])
            assert await ack_status("GB", expired) == pb.INVALID_RECEIPT_HANDLE
            assert broker.pop.in_flight("GB") == 32  # nothing acknowledged by any of those
            empty = await call(channel, "AckMessage", "AckMessageResponse")(
                pb.AckMessageRequest(group=pb.Resource(name="GB"), topic=pb.Resource(name="BadTopic")),
                metadata=META,
            )
            assert empty.status.code == pb.BAD_REQUEST
            for ms in (-1, 13 * 3600 * 1000):
                refused = await change(channel, "GB", "BadTopic", handle, ms)
                assert refused.status.code == pb.ILLEGAL_INVISIBLE_TIME
            forged_change = await change(channel, "GB", "BadTopic", "1 2 3", 1000)
            assert forged_change.status.code == pb.INVALID_RECEIPT_HANDLE
            assert (await ack_status("GB", handle)) == pb.OK  # the real handle still works
            # Malformed protobuf: INVALID_ARGUMENT, and the endpoint keeps serving.
            for rpc in ("AckMessage", "ChangeInvisibleDuration", "QueryAssignment", "RecallMessage"):
                raw = channel.unary_unary(SERVICE + rpc)
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await raw(b"\xff\xff\xff\xff", metadata=META)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in channel.unary_stream(SERVICE + "ReceiveMessage")(b"\x0a\xff", metadata=META):
                    pass
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            _, rest = await receive(channel, "GB", "BadTopic", invisible_ms=20_000)
            assert len(rest) == 8
            assert broker.pop.in_flight("GB") == 31 + 8

    asyncio.run(main())


def test_a_receive_stream_the_client_does_not_read_holds_one_batch_and_gives_it_back(
    tidemq_make_broker: MakeBroker,
) -> None:
    """Flow control: the stream writes as the client reads (a batch of 1 MiB messages); a client
    that never reads holds the broker to one batch and, when it goes away, every message the
    stream could not write comes back a second later (their invisible time was 60 s).

    The unread stream's client has grpc's BDP probing off, so its window stays HTTP/2's 64 KiB:
    with probing on, grpc's transport grows the window to up to 16 MiB as data arrives and takes
    the whole batch into its own memory whether the application reads or not (then nothing is
    left to give back, and the test measured the race between the probe and the writes)."""

    async def main() -> None:
        settings = {"default_topic_queues": 16}
        async with grpc_broker(tidemq_make_broker, settings, **FAST) as (broker, channel):
            body = b"x" * (1024 * 1024)
            for _ in range(16):
                await send(channel, "FlowTopic", [body])
            request = pb.ReceiveMessageRequest(
                group=pb.Resource(name="GF"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="FlowTopic")),
                batch_size=32,
                invisible_duration={"seconds": 60},
                long_polling_timeout={"seconds": 0},
            )
            address = grpc_plugin_server(broker).address
            async with grpc.aio.insecure_channel(address, options=[("grpc.http2.bdp_probe", 0)]) as reader:
                unread = receive_stub(reader)(request, metadata=META, timeout=30)
                first = await unread.read()  # the status; then nothing more is read
                assert first.status.code == pb.OK
                popped = broker.pop.in_flight("GF")
                assert 0 < popped <= 32
                await asyncio.sleep(1.5)
                assert broker.pop.in_flight("GF") == popped  # one batch, no more, however long it waits
                unread.cancel()
            # No message fits the client's window, so the stream wrote none and all come back: a
            # stream that buffered its batch regardless of the window would give none back.
            deadline = time.monotonic() + 10
            again: list[Any] = []  # each comes back once: it is invisible for 60 s after
            while time.monotonic() < deadline and len(again) < popped:
                _, more = await receive(channel, "GF", "FlowTopic", invisible_ms=60_000, poll_ms=1_000)
                # (the first ones are those the batch did not take, on their first delivery)
                again += [m for m in more if m.system_properties.delivery_attempt == 2]
            assert len(again) == popped, "the messages the stream could not write did not all come back"
            assert all(len(m.body) == len(body) for m in again)
            assert not grpc_plugin_service(broker).pending_tasks

    asyncio.run(main())


def test_a_telemetry_stream_the_client_does_not_read_stops_being_read(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            from tidemq_transport_grpc.peer import OUTBOX_LIMIT

            stream = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )(metadata=META)
            settings = pb.Settings(
                client_type=pb.PRODUCER,
                publishing=pb.Publishing(
                    topics=[pb.Resource(name=f"T{i:04d}" + "x" * 200) for i in range(40)]
                ),
            )
            command = pb.TelemetryCommand(settings=settings)
            written = 0

            async def flood() -> None:
                nonlocal written
                for _ in range(5_000):
                    await stream.write(command)
                    written += 1

            writer = asyncio.get_running_loop().create_task(flood())
            await asyncio.sleep(3)
            server = grpc_plugin_server(broker)
            peer = server.service.streams["test-client@1"]
            assert peer.outbox.qsize() <= OUTBOX_LIMIT
            assert written < 5_000, "the broker kept reading a client that reads nothing"
            stuck = written
            await asyncio.sleep(1)
            assert written - stuck < 50
            writer.cancel()
            stream.cancel()
            # Other clients are served meanwhile.
            route = await call(channel, "QueryRoute", "QueryRouteResponse")(
                pb.QueryRouteRequest(topic=pb.Resource(name="AfterFlood")), metadata=META
            )
            assert route.status.code == pb.OK

    asyncio.run(main())


def grpc_plugin_server(broker: Any) -> Any:
    from tidemq_transport_grpc import plugin

    server = plugin.server_of(broker)
    assert server is not None
    return server


def grpc_plugin_service(broker: Any) -> Any:
    return grpc_plugin_server(broker).service.consume


def test_an_unknown_group_is_consumer_group_not_found_when_groups_are_not_created(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        settings = {"auto_create_subscription_group": False}
        async with grpc_broker(tidemq_make_broker, settings, **FAST) as (broker, channel):
            await send(channel, "KnownTopic", [b"x"])
            answers, got = await receive(channel, "NO_SUCH_GROUP", "KnownTopic")
            assert got == [] and answers[0].status.code == pb.CONSUMER_GROUP_NOT_FOUND
            query = await call(channel, "QueryAssignment", "QueryAssignmentResponse")(
                pb.QueryAssignmentRequest(
                    topic=pb.Resource(name="KnownTopic"), group=pb.Resource(name="NO_SUCH_GROUP")
                ),
                metadata=META,
            )
            assert query.status.code == pb.CONSUMER_GROUP_NOT_FOUND
            handle = "0 1 60000 0 0 " + broker.settings.name + " 0 0 0"
            refused = await call(channel, "AckMessage", "AckMessageResponse")(
                pb.AckMessageRequest(
                    group=pb.Resource(name="NO_SUCH_GROUP"),
                    topic=pb.Resource(name="KnownTopic"),
                    entries=[pb.AckMessageEntry(message_id="m", receipt_handle=handle)],
                ),
                metadata=META,
            )
            assert refused.entries[0].status.code == pb.INVALID_RECEIPT_HANDLE  # expired long ago
            assert broker.groups.get("NO_SUCH_GROUP") is None

    asyncio.run(main())


def test_a_long_poll_the_client_cancels_takes_nothing(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            await send(channel, "PollTopic", [b"first"])
            _, (first,) = await receive(channel, "GP", "PollTopic")
            assert (await ack(channel, "GP", "PollTopic", [first])).status.code == pb.OK
            request = pb.ReceiveMessageRequest(
                group=pb.Resource(name="GP"),
                message_queue=pb.MessageQueue(topic=pb.Resource(name="PollTopic")),
                batch_size=32,
                invisible_duration={"seconds": 60},
                long_polling_timeout={"seconds": 5},
            )
            for _ in range(5):  # held polls, each cancelled by its client
                waiting = receive_stub(channel)(request, metadata=META, timeout=10)
                await asyncio.sleep(0.3)
                waiting.cancel()
            await asyncio.sleep(0.3)
            await send(channel, "PollTopic", [b"after"])
            _, got = await receive(channel, "GP", "PollTopic", poll_ms=2000)
            assert [m.body for m in got] == [b"after"]  # no cancelled poll took it
            assert broker.pop.in_flight("GP") == 1

    asyncio.run(main())


def test_a_fifo_message_forwarded_to_the_dead_letter_queue_frees_its_queue(
    tidemq_make_broker: MakeBroker,
) -> None:
    """What a FIFO PushConsumer does with a message that failed all its local attempts."""

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            import attrs

            cfg = broker.groups.find_or_create("GFDLQ")
            broker.groups.update(attrs.evolve(cfg, consume_message_orderly=True))
            await send(channel, "FifoDlq", [b"bad", b"next"], message_group="g")
            _, (bad,) = await receive(channel, "GFDLQ", "FifoDlq", batch=1, invisible_ms=30_000)
            assert bad.body == b"bad"
            forward = call(
                channel, "ForwardMessageToDeadLetterQueue", "ForwardMessageToDeadLetterQueueResponse"
            )
            done = await forward(
                pb.ForwardMessageToDeadLetterQueueRequest(
                    group=pb.Resource(name="GFDLQ"),
                    topic=pb.Resource(name="FifoDlq"),
                    receipt_handle=bad.system_properties.receipt_handle,
                    message_id=bad.system_properties.message_id,
                    delivery_attempt=1,
                    max_delivery_attempts=3,
                ),
                metadata=META,
            )
            assert done.status.code == pb.OK, done.status
            assert len(broker.store.get_message("t", "%DLQ%GFDLQ", 0, 0, 32).buffers) == 1
            _, (nxt,) = await receive(channel, "GFDLQ", "FifoDlq", batch=1, poll_ms=2000)
            assert nxt.body == b"next"  # the queue moved on, without waiting 30 s

    asyncio.run(main())


def test_a_simple_consumer_is_registered_as_consuming_actively(tidemq_make_broker: Any) -> None:
    """RocketMQ 5's proxy registers a SimpleConsumer CONSUME_ACTIVELY (it fetches when it wants;
    mqadmin's consumerProgress shows PULL) and a PushConsumer CONSUME_PASSIVELY; so does the
    endpoint, at the settings and at each heartbeat."""

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, **FAST) as (broker, channel):
            stream = channel.stream_stream(
                SERVICE + "Telemetry",
                request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=pb.TelemetryCommand.FromString,
            )(metadata=META)
            settings = consumer_settings("GSIMPLE", "SimpleTopic", client_type=pb.SIMPLE_CONSUMER)
            await stream.write(pb.TelemetryCommand(settings=settings))
            answer = await asyncio.wait_for(stream.read(), 10)
            assert answer.status.code == pb.OK
            info = broker.consumers.get("GSIMPLE")
            assert info is not None and info.client_ids() == ["test-client@1"]
            assert info.consume_type == "CONSUME_ACTIVELY"
            heartbeat = await call(channel, "Heartbeat", "HeartbeatResponse")(
                pb.HeartbeatRequest(client_type=pb.SIMPLE_CONSUMER, group=pb.Resource(name="GSIMPLE")),
                metadata=META,
            )
            assert heartbeat.status.code == pb.OK
            assert broker.consumers.get("GSIMPLE").consume_type == "CONSUME_ACTIVELY"
            await stream.done_writing()
            assert await asyncio.wait_for(stream.read(), 10) == grpc.aio.EOF

    asyncio.run(main())

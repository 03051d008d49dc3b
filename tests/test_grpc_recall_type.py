"""RecallMessage checks its topic's ``message.type`` as RocketMQ 5's proxy does
(ProducerProcessor.recallMessage: the topic must take DELAY messages, else
MESSAGE_PROPERTY_CONFLICT_WITH_TYPE); ``enable_topic_message_type_check = false`` skips it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from test_grpc_consume import send  # noqa: E402
from test_grpc_transport import META, call, grpc_broker, pb, typed_topic  # noqa: E402

MakeBroker = Callable[..., AbstractAsyncContextManager[Any]]


async def _recall(channel: Any, topic: str, handle: str) -> Any:
    request = pb.RecallMessageRequest(topic=pb.Resource(name=topic), recall_handle=handle)
    return await call(channel, "RecallMessage", "RecallMessageResponse")(request, metadata=META)


def test_a_recall_naming_a_topic_that_takes_no_delay_messages_is_refused(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            typed_topic(broker, "RecallDelay", "DELAY")
            typed_topic(broker, "RecallMixed", "MIXED")
            typed_topic(broker, "RecallNormal", "NORMAL")
            typed_topic(broker, "RecallFifo", "FIFO")
            due_ms = int(time.time() * 1000) + 60_000
            stamp = {"seconds": due_ms // 1000, "nanos": 0}
            handles = {}
            for topic in ("RecallDelay", "RecallMixed"):
                (sent,) = await send(
                    channel, topic, [b"later"], message_type=pb.DELAY, delivery_timestamp=stamp
                )
                assert sent.status.code == pb.OK and sent.recall_handle, sent.status
                handles[topic] = sent.recall_handle
            # A NORMAL (or FIFO) topic: refused before the handle is looked at, in RocketMQ's words.
            for topic in ("RecallNormal", "RecallFifo"):
                refused = await _recall(channel, topic, handles["RecallDelay"])
                assert refused.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, refused.status
                kind = topic.removeprefix("Recall").upper()
                assert refused.status.message == (
                    f"TopicMessageType validate failed, the expected type is {kind}, but actual type is DELAY"
                )
            # A DELAY or MIXED topic: recalled.
            for topic, handle in handles.items():
                done = await _recall(channel, topic, handle)
                assert done.status.code == pb.OK, (topic, done.status)
            # A topic this broker auto-creates for the lookup is NORMAL: refused too.
            auto = await _recall(channel, "RecallAuto", handles["RecallDelay"])
            assert auto.status.code == pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE, auto.status

    asyncio.run(main())


def test_without_the_type_check_a_recall_is_not_checked_for_its_topic_type(
    tidemq_make_broker: MakeBroker,
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker, enable_topic_message_type_check=False) as (
            broker,
            channel,
        ):
            typed_topic(broker, "RecallPlain", "NORMAL")
            due_ms = int(time.time() * 1000) + 60_000
            stamp = {"seconds": due_ms // 1000, "nanos": 0}
            (sent,) = await send(
                channel, "RecallPlain", [b"later"], message_type=pb.DELAY, delivery_timestamp=stamp
            )
            assert sent.status.code == pb.OK and sent.recall_handle, sent.status
            done = await _recall(channel, "RecallPlain", sent.recall_handle)
            assert done.status.code == pb.OK, done.status

    asyncio.run(main())

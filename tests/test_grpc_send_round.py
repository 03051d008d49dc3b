"""A gRPC SendMessage of several messages under sync flush: all of them put first, their
durability awaited together, so the request waits for one flush round, not one per message (as
RocketMQ's proxy sends a request's messages as one batch).  The answers stay per message and
equal to what the same messages get sent one request each.  A real mmap broker with sync flush,
its commit log's ``flush`` behind a gate (tests/round_support.py), raw gRPC calls on loopback.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from round_support import GatedFlush  # noqa: E402
from test_grpc_transport import META, call, pb  # noqa: E402

from tidemq.remoting.protocol import TopicConfig  # noqa: E402
from tidemq.testing.pytest_plugin import running_broker  # noqa: E402
from tidemq_transport_grpc import plugin as grpc_plugin  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@contextlib.asynccontextmanager
async def sync_grpc_broker(tmp_path: Path) -> AsyncIterator[tuple[Any, Any, GatedFlush]]:
    """A sync-flush broker (every round on the flush thread) with the gRPC endpoint; its flush gated."""
    options = {
        "transport": {"grpc": {"listen": "127.0.0.1:0"}},
        "flush": {"sync": {"timeout_ms": 20000, "inline_max_us": 0}},
    }
    plugins = {"store": "mmap", "flush": "sync"}
    async with running_broker(
        tmp_path / "b", plugins, options=options, auto_create_topic=True, max_message_size=65536
    ) as broker:
        server = grpc_plugin.server_of(broker)
        assert server is not None
        async with grpc.aio.insecure_channel(server.address) as channel:
            await asyncio.wait_for(channel.channel_ready(), 10)
            gated = GatedFlush(broker.store.commitlog)
            try:
                yield broker, channel, gated
            finally:
                gated.gate.set()  # the broker stops with a working flush


async def make_topic(broker: Any, topic: str, queues: int, message_type: str | None = None) -> None:
    attributes = {"message.type": message_type} if message_type else {}
    broker.topics.update(TopicConfig(topic, queues, queues, attributes=attributes))
    while broker.topics.unwritten:  # sends wait for topics.json until it is written
        await asyncio.sleep(0.01)


def plain(topic: str, message_id: str, body: bytes = b"m" * 100, **system: Any) -> Any:
    return pb.Message(
        topic=pb.Resource(name=topic),
        body=body,
        system_properties=pb.SystemProperties(message_id=message_id, **system),
    )


def test_a_sendmessage_of_16_waits_for_one_flush_round(tmp_path: Path) -> None:
    async def main() -> None:
        async with sync_grpc_broker(tmp_path) as (broker, channel, gated):
            await make_topic(broker, "OneQueue", 1)
            send = call(channel, "SendMessage", "SendMessageResponse")
            ids = [f"01AA{i:030X}" for i in range(16)]
            pending = asyncio.ensure_future(
                send(pb.SendMessageRequest(messages=[plain("OneQueue", i) for i in ids]), metadata=META)
            )
            # The flush thread is in the round's flush, held: nothing may be answered yet.
            assert await asyncio.to_thread(gated.entered.wait, 10)
            await asyncio.sleep(0.3)
            assert not pending.done()
            # Every message is in the commit log already, waiting for that one round.
            assert broker.store.get_max_offset_in_queue("OneQueue", 0) == 16
            gated.gate.set()
            response = await asyncio.wait_for(pending, 20)
            assert response.status.code == pb.OK, response.status
            assert [e.message_id for e in response.entries] == ids
            assert [e.offset for e in response.entries] == list(range(16))
            assert {e.status.code for e in response.entries} == {pb.OK}
            assert len(gated.returned) == 1  # one round for the 16 (16 rounds before)

            # Over the topic's 4 queues: four puts, made together while the first round is held
            # (it may carry the first put alone): every message waits for at most two rounds.
            await make_topic(broker, "FourQueues", 4)
            gated.gate.clear()
            gated.entered.clear()
            before = len(gated.returned)
            spread = asyncio.ensure_future(
                send(
                    pb.SendMessageRequest(messages=[plain("FourQueues", f"01AB{i:030X}") for i in range(16)]),
                    metadata=META,
                )
            )
            assert await asyncio.to_thread(gated.entered.wait, 10)
            await asyncio.sleep(0.3)
            assert sum(broker.store.get_max_offset_in_queue("FourQueues", q) for q in range(4)) == 16
            gated.gate.set()
            answered = await asyncio.wait_for(spread, 20)
            assert {e.status.code for e in answered.entries} == {pb.OK}
            assert 1 <= len(gated.returned) - before <= 2

    asyncio.run(main())


def test_the_answers_of_one_request_equal_those_of_one_request_per_message(tmp_path: Path) -> None:
    """Refusals before the store (empty, too large, a bad topic, a type conflict), a resend of an
    earlier message of the same request, a half message and a timer message among plain ones:
    each entry as the message alone gets it."""

    def messages(topic: str, tag: str) -> list[Any]:
        due_ms = int(time.time() * 1000) + 600_000
        ident = [f"01{tag}{i:030X}" for i in range(10)]
        return [
            plain(topic, ident[0]),
            plain(topic, ident[1], body=b""),  # MESSAGE_BODY_EMPTY
            plain(topic, ident[2]),
            plain("bad topic!", ident[3]),  # ILLEGAL_TOPIC
            plain(topic, ident[4], message_type=pb.TRANSACTION),  # a half message
            plain(topic, ident[5], body=b"x" * 70000),  # MESSAGE_BODY_TOO_LARGE
            plain(f"{topic}Normal", ident[6], message_group="g1", message_type=pb.FIFO),  # type conflict
            plain(topic, ident[0]),  # a resend of the first: answered from the window
            plain(topic, ident[8], message_type=pb.DELAY, delivery_timestamp={"seconds": due_ms // 1000}),
            plain(topic, ident[9], tag="T", keys=["k"]),
        ]

    shared = (4, 8)  # stored in topics both runs share (the half topic, the timer wheel)

    def answers(response: Any, skip: tuple[int, ...] = shared) -> list[tuple[Any, ...]]:
        return [
            (
                e.status.code,
                e.status.message,
                e.message_id[4:],  # the ids differ in their tag only
                e.offset if i not in skip else None,
                bool(e.transaction_id),
                bool(e.recall_handle),
            )
            for i, e in enumerate(response.entries)
        ]

    async def main() -> None:
        async with sync_grpc_broker(tmp_path) as (broker, channel, gated):
            gated.gate.set()  # flushes run freely
            for topic in ("Batched", "OneByOne"):
                await make_topic(broker, topic, 1, "MIXED")
                await make_topic(broker, f"{topic}Normal", 1, "NORMAL")
            send = call(channel, "SendMessage", "SendMessageResponse")
            together = await send(pb.SendMessageRequest(messages=messages("Batched", "BB")), metadata=META)
            alone = [
                await send(pb.SendMessageRequest(messages=[m]), metadata=META)
                for m in messages("OneByOne", "CC")
            ]
            assert together.status.code == pb.MULTIPLE_RESULTS
            expected = [answers(r, (0,) if i in shared else ())[0] for i, r in enumerate(alone)]
            assert answers(together) == expected
            codes = [e.status.code for e in together.entries]
            assert codes == [
                pb.OK,
                pb.MESSAGE_BODY_EMPTY,
                pb.OK,
                pb.ILLEGAL_TOPIC,
                pb.OK,
                pb.MESSAGE_BODY_TOO_LARGE,
                pb.MESSAGE_PROPERTY_CONFLICT_WITH_TYPE,
                pb.OK,
                pb.OK,
                pb.OK,
            ]
            offsets = [e.offset for e in together.entries]
            assert offsets[7] == offsets[0]  # the resend names the first copy
            stored = broker.store.get_max_offset_in_queue("Batched", 0)
            assert stored == broker.store.get_max_offset_in_queue("OneByOne", 0) == 3

    asyncio.run(main())

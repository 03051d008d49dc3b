"""A send leaves no garbage cycles behind.

The broker raises the collector's young-generation threshold (``tidemq.cli.tune_gc``): what
reference counting frees costs nothing, but every object caught in a reference cycle waits for a
collection, so a per-request cycle turns into megabytes of resident memory under load (the
memory target of issue 19).  These tests send through a real socket and count what
``gc.collect()`` finds unreachable afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Callable

from tidemq.broker import Broker
from tidemq.message import BatchItem, encode_batch
from tidemq.remoting import FrameDecoder, RemotingCommand, encode
from tidemq.remoting.codes import RequestCode, ResponseCode

MakeBroker = Callable[..., contextlib.AbstractAsyncContextManager[Broker]]
#: Unreachable objects tolerated after the measured sends: asyncio and the stream client may leave
#: a handful; one cycle per request would leave hundreds.
SLACK = 40


def send_frame(opaque: int, queue_id: int, batch: int = 1) -> bytes:
    fields = {
        "a": "gc-producer",
        "b": "GcTopic",
        "c": "TBW102",
        "d": "4",
        "e": str(queue_id),
        "f": "0",
        "g": "1700000000000",
        "h": "0",
        "j": "0",
        "k": "false",
        "m": "true" if batch > 1 else "false",
    }
    if batch > 1:
        fields["i"] = "WAIT\x01true\x02"
        body = encode_batch(
            [
                BatchItem(b"x" * 100, 0, {"UNIQ_KEY": f"U{opaque:08d}{i:04d}", "TAGS": "TagA"})
                for i in range(batch)
            ]
        )
        code = RequestCode.SEND_BATCH_MESSAGE
    else:
        fields["i"] = f"WAIT\x01true\x02UNIQ_KEY\x01U{opaque:012d}\x02"
        body = b"x" * 100
        code = RequestCode.SEND_MESSAGE_V2
    return b"".join(encode(RemotingCommand(code, opaque=opaque, ext_fields=fields, body=body)))


@contextlib.asynccontextmanager
async def connected(address: str) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, _, port = address.rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        yield reader, writer
    finally:
        writer.close()
        await writer.wait_closed()


async def exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frames: list[bytes]
) -> list[int]:
    """Write the frames in one go (pipelined: one read on the broker's side) and collect the codes."""
    writer.write(b"".join(frames))
    await writer.drain()
    decoder = FrameDecoder(1 << 24)
    codes: list[int] = []
    while len(codes) < len(frames):
        data = await asyncio.wait_for(reader.read(1 << 16), 10)
        assert data, "the broker closed the connection"
        codes += [cmd.code for cmd in decoder.feed(data)]
    return codes


async def unreachable_after(broker: Broker, rounds: list[list[bytes]]) -> int:
    async with connected(broker.address) as (reader, writer):
        assert await exchange(reader, writer, [send_frame(1, 0)]) == [ResponseCode.SUCCESS]  # topic created
        gc.collect()
        gc.disable()
        try:
            for frames in rounds:
                codes = await exchange(reader, writer, frames)
                assert codes == [ResponseCode.SUCCESS] * len(frames)
            await asyncio.sleep(0.05)  # let the store's threads finish their rounds
            return gc.collect()
        finally:
            gc.enable()


def test_pipelined_single_sends_leave_no_cycles(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> int:
        async with tidemq_make_broker(auto_create_topic=True) as broker:
            rounds = [[send_frame(2 + r * 50 + i, i % 4) for i in range(50)] for r in range(6)]
            return await unreachable_after(broker, rounds)

    assert asyncio.run(main()) < SLACK


def test_batch_sends_leave_no_cycles(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> int:
        async with tidemq_make_broker(auto_create_topic=True) as broker:
            rounds = [[send_frame(2 + r * 10 + i, i % 4, batch=16) for i in range(10)] for r in range(6)]
            return await unreachable_after(broker, rounds)

    assert asyncio.run(main()) < SLACK


def pull_frame(opaque: int, queue_id: int, subscription: str = "*") -> bytes:
    fields = {
        "consumerGroup": "gc-consumer",
        "topic": "GcTopic",
        "queueId": str(queue_id),
        "queueOffset": "0",
        "maxMsgNums": "32",
        "sysFlag": "4",  # FLAG_SUBSCRIPTION: the subscription travels with the pull
        "commitOffset": "0",
        "suspendTimeoutMillis": "0",
        "subscription": subscription,
        "subVersion": "0",
        "expressionType": "TAG",
    }
    return b"".join(encode(RemotingCommand(RequestCode.PULL_MESSAGE, opaque=opaque, ext_fields=fields)))


def test_pulls_leave_no_cycles(tidemq_make_broker: MakeBroker) -> None:
    async def main() -> int:
        async with tidemq_make_broker(auto_create_topic=True) as broker:
            async with connected(broker.address) as (reader, writer):
                sends = [send_frame(2 + i, i % 4, batch=16) for i in range(8)]
                assert await exchange(reader, writer, sends) == [ResponseCode.SUCCESS] * 8
            # Unfiltered and tag-filtered pulls (the filtered walk and the filter cache too).
            pulls = [pull_frame(100 + i, i % 4, "*" if i % 2 else "TagA || TagB") for i in range(8)]
            return await unreachable_after(broker, [pulls] * 5)

    assert asyncio.run(main()) < SLACK

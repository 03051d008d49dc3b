"""A client process of tests/test_grpc_streams.py: opens many producer Telemetry streams.

    python grpc_streams_worker.py HOST:PORT COUNT PREFIX [burst]

Opens COUNT streams over COUNT/100 connections (each stream's settings answered), prints one
JSON line ``{"ok": n, "failed": {status: details}}``, keeps them open until its stdin closes.
At most 100 streams are being set up at once, or all of them with ``burst``.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import grpc

from tidemq_transport_grpc.proto import load

pb = load()


async def main(address: str, count: int, prefix: str, burst: bool) -> None:
    own = [("grpc.use_local_subchannel_pool", 1)]  # a connection per channel
    channels = [grpc.aio.insecure_channel(address, options=own) for _ in range(max(count // 100, 1))]
    failed: dict[str, str] = {}
    settings = pb.Settings(
        client_type=pb.PRODUCER, publishing=pb.Publishing(topics=[pb.Resource(name="Many")])
    )

    opening = asyncio.Semaphore(count if burst else 100)  # streams being set up at once

    async def one(i: int) -> Any:
        async with opening:
            return await establish(i)

    async def establish(i: int) -> Any:
        stream = channels[i % len(channels)].stream_stream(
            "/apache.rocketmq.v2.MessagingService/Telemetry",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString,
        )(metadata=(("x-mq-client-id", f"{prefix}{i}@streams"),))
        try:
            await stream.write(pb.TelemetryCommand(settings=settings))
            answer = await asyncio.wait_for(stream.read(), 120)
            if answer.status.code == pb.OK:
                return stream
            failed[pb.Code.Name(answer.status.code)] = answer.status.message
        except grpc.aio.AioRpcError as exc:
            # A write to a call the server already ended fails with grpc's own INTERNAL: the
            # call's status says what the server answered.
            code = await stream.code() if exc.code() is grpc.StatusCode.INTERNAL else exc.code()
            failed[code.name] = (await stream.details()) or exc.details() or ""
        except TimeoutError:
            failed["TIMEOUT"] = "no settings within 120 s"
        return None

    opened = await asyncio.gather(*(one(i) for i in range(count)))
    print(json.dumps({"ok": sum(s is not None for s in opened), "failed": failed}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    for stream in opened:
        if stream is not None:
            stream.cancel()
    for channel in channels:
        await channel.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:] == ["burst"]))

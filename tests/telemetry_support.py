"""A v5 consumer's Telemetry stream for the gRPC endpoint's tests: the settings a client sends
first, then whatever the test answers to the broker's commands (``on_command``)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from test_grpc_transport import pb

SERVICE = "/apache.rocketmq.v2.MessagingService/"


def consumer_settings(group: str, topic: str, expression: str = "*", client_type: Any = None) -> Any:
    """A consumer's Settings (PushConsumer unless ``client_type``) subscribing ``group`` to ``topic``
    by TAG ``expression``."""
    subscription = pb.Subscription(
        group=pb.Resource(name=group),
        subscriptions=[
            pb.SubscriptionEntry(
                topic=pb.Resource(name=topic),
                expression=pb.FilterExpression(type=pb.TAG, expression=expression),
            )
        ],
    )
    kind = pb.PUSH_CONSUMER if client_type is None else client_type
    return pb.Settings(client_type=kind, subscription=subscription)


class TelemetryConsumer:
    """One Telemetry stream of client ``client_id``: sends ``settings`` first, sets ``settled`` when
    the broker answers them, hands every other command to :meth:`on_command` and writes what that
    queues on ``outgoing``."""

    def __init__(self, channel: Any, client_id: str, settings: Any, metadata: tuple[Any, ...] = ()) -> None:
        self.client_id = client_id
        self.settings = settings
        self.outgoing: asyncio.Queue[Any] = asyncio.Queue()
        self.settled = asyncio.Event()
        stream = channel.stream_stream(
            SERVICE + "Telemetry",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString,
        )
        self.call = stream(self._requests(), metadata=(("x-mq-client-id", client_id), *metadata))
        self.reader = asyncio.ensure_future(self._read())

    def on_command(self, kind: str, command: Any) -> None:
        """A command of the broker's (``kind``: its oneof name) other than the settings' answer."""

    async def _requests(self) -> AsyncIterator[Any]:
        yield pb.TelemetryCommand(settings=self.settings)
        while True:
            command = await self.outgoing.get()
            if command is None:
                return
            yield command

    async def _read(self) -> None:
        async for command in self.call:
            kind = command.WhichOneof("command")
            if kind == "settings":
                self.settled.set()
            else:
                self.on_command(kind, command)

    async def close(self) -> None:
        self.outgoing.put_nowait(None)
        self.call.cancel()
        self.reader.cancel()
        await asyncio.gather(self.reader, return_exceptions=True)

"""The broker services serve a transport that has no RemotingCommand (as the coming gRPC one):
plain values in, typed results out, the same broker state as the remoting processors see."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_broker_processors import call, running

from tidemq.broker.services import BrokerServices, Outcome, PullResult, Send, Status
from tidemq.broker.services.pull import FLAG_SUBSCRIPTION
from tidemq.message import iter_messages
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.transport import Connection, ConnectionState

pytestmark = pytest.mark.timeout(60)


class Peer:
    """A second transport's connection, as much of one as :class:`tidemq.transport.Connection` asks."""

    def __init__(self, address: str) -> None:
        self.remote_address = address
        self.context = ConnectionState()
        self._callbacks: list[Callable[[Any], Any]] = []

    @property
    def closed(self) -> bool:
        return False

    def add_close_callback(self, fn: Callable[[Any], Any]) -> None:
        self._callbacks.append(fn)

    async def invoke(self, request: RemotingCommand, timeout: float) -> RemotingCommand:
        raise NotImplementedError("this transport pushes nothing to its peers")

    async def invoke_oneway(self, request: RemotingCommand) -> None:
        raise NotImplementedError("this transport pushes nothing to its peers")

    def send_response(self, response: RemotingCommand) -> None:
        raise NotImplementedError


def test_send_then_pull_through_the_services_alone(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, client):
            services = BrokerServices(broker)
            peer = Peer("10.1.2.3:4567")
            assert isinstance(peer, Connection)
            sent = []
            for body in (b"first", b"second"):
                send = services.send.prepare(peer, "PG", "T", 0, 0, "TBW102", 4, "", 0, -1, 0, 1234, body)
                assert isinstance(send, Send), send
                services.send.put_one(send)
                if not services.send.settled(send):
                    await services.send.settle(send)
                assert (send.status, send.queue_id, send.remark) == (Status.SUCCESS, 0, None)
                sent.append(send)
            assert [s.queue_offset for s in sent] == [0, 1]
            assert peer.context.born_host == ("10.1.2.3", 4567)  # parsed once, kept on the connection

            pulled = await services.pull.pull(
                peer, "CG", "T", 0, 0, 32, FLAG_SUBSCRIPTION, -1, 0, 0, ("TAG", "*")
            )
            assert isinstance(pulled, PullResult) and pulled.status is Status.SUCCESS
            msgs = list(iter_messages(b"".join(pulled.body)))
            assert [m.body for m in msgs] == [b"first", b"second"]
            assert [m.msg_id for m in msgs] == [s.msg_id for s in sent]
            assert msgs[0].born_host == ("10.1.2.3", 4567)
            assert pulled.next_begin_offset == 2 and pulled.max_offset == 2

            # The commit is the broker's, whichever transport made it.
            assert services.offsets.commit("CG", "T", 0, 2).ok
            asked = await call(
                client,
                broker,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": "CG", "topic": "T", "queueId": 0},
            )
            assert (asked.code, asked.ext_fields["offset"]) == (ResponseCode.SUCCESS, "2")

    asyncio.run(main())


def test_refusals_are_typed_outcomes(tmp_path: Path) -> None:
    async def main() -> None:
        async with running(tmp_path, {}) as (broker, _client):
            services = BrokerServices(broker)
            peer = Peer("10.1.2.3:4567")
            bad = services.send.prepare(peer, "PG", "no spaces", 0, 0, "TBW102", 4, "", 0, -1, 0, 0, b"x")
            assert isinstance(bad, Outcome) and bad.status is Status.SYSTEM_ERROR and bad.remark
            empty = services.send.prepare_batch(peer, "PG", "T", 0, 0, "TBW102", 4, 0, 0, b"")
            assert isinstance(empty, Outcome) and empty.status is Status.MESSAGE_ILLEGAL
            missing = await services.pull.pull(
                peer, "CG", "nope", 0, 0, 32, FLAG_SUBSCRIPTION, -1, 0, 0, ("TAG", "*")
            )
            assert isinstance(missing, Outcome) and missing.status is Status.TOPIC_NOT_EXIST
            parse = await services.pull.pull(
                peer, "CG", "TBW102", 0, 0, 32, FLAG_SUBSCRIPTION, -1, 0, 0, ("NOPE", "x")
            )
            assert isinstance(parse, Outcome) and parse.status in (
                Status.SYSTEM_ERROR,
                Status.SUBSCRIPTION_PARSE_FAILED,
            )
            viewed = services.messages.view(10**12)
            assert isinstance(viewed, Outcome) and viewed.status is Status.SYSTEM_ERROR

    asyncio.run(main())


def test_status_values_are_the_remoting_response_codes() -> None:
    """The remoting codecs pass a status on as the response code: the two tables must agree."""
    for status in Status:
        assert ResponseCode[status.name] == status.value

"""CONSUME_MESSAGE_DIRECTLY (309: the console's "resend to consumer", ``queryMsgById -g -d``) to a
RocketMQ 5 consumer of the gRPC endpoint, as RocketMQ 5's proxy relays it: the broker writes a
``VerifyMessageCommand`` (a nonce and the message) on the client's Telemetry stream, and answers
the admin with a ConsumeMessageDirectlyResult from the client's ``VerifyMessageResult`` (OK:
CR_SUCCESS, FAILED_TO_CONSUME_MESSAGE: CR_LATER, MESSAGE_CORRUPTED: CR_RETURN_NULL); no answer in
time is CONSUME_MSG_TIMEOUT, as for a 4.x client.  A real broker with the endpoint; the v5
consumer is a raw gRPC Telemetry stream of this test (tidemq's protobuf module) answering as a
RocketMQ 5 Java PushConsumer does; the admin side is tidemq's admin tool (its library calls in
process, and the ``tidemq admin`` command against a NameServer and broker subprocesses).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from conftest import Server, free_port, run_admin  # noqa: E402
from telemetry_support import TelemetryConsumer, consumer_settings  # noqa: E402
from test_grpc_transport import MakeBroker, call, grpc_broker, pb  # noqa: E402

from tidemq.admin import consumers  # noqa: E402
from tidemq.broker.processors import consumer_control  # noqa: E402
from tidemq.client import AdminClient  # noqa: E402
from tidemq.message import decode_message  # noqa: E402
from tidemq.remoting.codes import RequestCode, ResponseCode  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOPIC = "VerifyT"
GROUP = "G_VERIFY"


class V5Consumer(TelemetryConsumer):
    """A v5 PushConsumer's Telemetry stream: answers each VerifyMessageCommand with ``answer`` (a
    Code name), or not at all when it is None."""

    def __init__(self, channel: Any, client_id: str, answer: str | None = "OK") -> None:
        self.answer = answer
        self.commands: list[Any] = []  # the VerifyMessageCommands received
        super().__init__(channel, client_id, consumer_settings(GROUP, TOPIC))

    def on_command(self, kind: str, command: Any) -> None:
        if kind != "verify_message_command":
            return
        self.commands.append(command.verify_message_command)
        if self.answer is not None:
            self.outgoing.put_nowait(
                pb.TelemetryCommand(
                    status=pb.Status(code=pb.Code.Value(self.answer), message=self.answer),
                    verify_message_result=pb.VerifyMessageResult(nonce=command.verify_message_command.nonce),
                )
            )


@asynccontextmanager
async def consumer(channel: Any, client_id: str, answer: str | None = "OK") -> AsyncIterator[V5Consumer]:
    c = V5Consumer(channel, client_id, answer)
    try:
        await asyncio.wait_for(c.settled.wait(), 10)
        yield c
    finally:
        await c.close()


async def send_one(channel: Any, message_id: str, body: bytes) -> None:
    send = call(channel, "SendMessage", "SendMessageResponse")
    message = pb.Message(
        topic=pb.Resource(name=TOPIC),
        body=body,
        user_properties={"color": "blue"},
        system_properties=pb.SystemProperties(message_id=message_id, tag="TagV", keys=["k1"]),
    )
    response = await send(pb.SendMessageRequest(messages=[message]), metadata=(("x-mq-client-id", "p@1"),))
    assert response.status.code == pb.OK, response.status


def offset_id(broker: Any) -> str:
    """The offset message id of the topic's one message."""
    for qid in range(broker.topics.get(TOPIC).write_queue_nums):
        got = broker.store.get_message("g", TOPIC, qid, 0, 1)
        for buf in got.buffers:
            return decode_message(bytes(buf)).msg_id
    raise AssertionError("no message stored")


def test_consume_directly_reaches_a_v5_consumer_as_verify_message(
    tidemq_make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            await send_one(channel, "01VERIFY00000000000000000000000001", b"resend me")
            msg_id = offset_id(broker)
            admin = AdminClient("127.0.0.1:1", timeout=15)

            async def directly(client_id: str) -> Any:
                fields = {"consumerGroup": GROUP, "clientId": client_id, "msgId": msg_id}
                return await admin.call(
                    broker.address, RequestCode.CONSUME_MESSAGE_DIRECTLY, fields, ok=tuple(range(-1, 400))
                )

            try:
                async with consumer(channel, "10.0.0.1@v5-ok") as ok:
                    # What `tidemq admin queryMsgById -i ID -g G -d CID` calls and prints.
                    result = await consumers.consume_directly(
                        admin, broker.address, GROUP, ok.client_id, msg_id
                    )
                    assert consumers.direct_result_text(result).startswith(
                        "ConsumeMessageDirectlyResult [order=false, autoCommit=true, "
                        "consumeResult=CR_SUCCESS, remark=from gRPC client, spentTimeMills="
                    )
                    (command,) = ok.commands
                    assert command.nonce
                    got = command.message
                    assert (got.topic.name, got.body) == (TOPIC, b"resend me")
                    assert got.system_properties.message_id == "01VERIFY00000000000000000000000001"
                    assert (got.system_properties.tag, list(got.system_properties.keys)) == ("TagV", ["k1"])
                    assert got.user_properties["color"] == "blue"

                for answer, expected in (
                    ("FAILED_TO_CONSUME_MESSAGE", "CR_LATER"),
                    ("MESSAGE_CORRUPTED", "CR_RETURN_NULL"),
                    ("VERIFY_FIFO_MESSAGE_UNSUPPORTED", None),  # as the proxy: no result of its own
                ):
                    async with consumer(channel, f"10.0.0.2@v5-{answer}", answer) as other:
                        response = await directly(other.client_id)
                        assert response.code == ResponseCode.SUCCESS, response.remark
                        body = json.loads(response.body)
                        assert body["consumeResult"] == expected
                        assert answer in body["remark"]

                # A client that never answers: CONSUME_MSG_TIMEOUT after the broker's wait for a
                # client (10 s in RocketMQ's Broker2Client; shortened here).
                monkeypatch.setattr(consumer_control, "CALL_CLIENT_TIMEOUT_S", 0.5)
                async with consumer(channel, "10.0.0.3@v5-silent", None) as silent:
                    response = await directly(silent.client_id)
                    assert response.code == ResponseCode.CONSUME_MSG_TIMEOUT, response.remark
                    assert len(silent.commands) == 1
                    assert not broker_streams(broker)[silent.client_id].verifying  # nothing left waiting

                    # A stream that ends while its answer is awaited: answered at once, not at the timeout.
                    monkeypatch.setattr(consumer_control, "CALL_CLIENT_TIMEOUT_S", 30)
                    pending = asyncio.ensure_future(directly(silent.client_id))
                    while len(silent.commands) < 2:
                        await asyncio.sleep(0.01)
                    silent.call.cancel()
                    response = await asyncio.wait_for(pending, 10)
                    assert response.code == ResponseCode.SYSTEM_ERROR, response.remark

                gone = await directly("10.0.0.9@nobody")
                assert gone.code == ResponseCode.SYSTEM_ERROR and "not online" in (gone.remark or "")
            finally:
                await admin.close()

    asyncio.run(main())


def broker_streams(broker: Any) -> dict[str, Any]:
    from tidemq_transport_grpc import plugin as grpc_plugin

    server = grpc_plugin.server_of(broker)
    return server.service.streams  # type: ignore[no-any-return,union-attr]


def test_tidemq_admin_resends_a_v5_message_to_a_v5_consumer(tmp_path: Path) -> None:
    """``tidemq admin queryMsgByUniqueKey -i <v5 id> -t T -g G -d <client id>`` (mqadmin's), against
    a NameServer and a broker with the gRPC endpoint (subprocesses)."""
    namesrv = Server(["namesrv", "--listen", "127.0.0.1:0"], tmp_path)
    grpc_addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-v"\nlisten = "127.0.0.1:{free_port()}"\n'
        f'namesrv = ["{namesrv.addresses["namesrv"]}"]\ndata_dir = "{tmp_path / "data"}"\n'
        f'[transport.grpc]\nlisten = "{grpc_addr}"\n'
    )
    broker = Server(["broker", "-c", str(tmp_path / "broker.toml")], tmp_path)
    try:
        ns = namesrv.addresses["namesrv"]
        run_admin(ns, "updateTopic", "-t", TOPIC, cwd=tmp_path)

        async def main() -> subprocess.CompletedProcess[str]:
            async with grpc.aio.insecure_channel(grpc_addr) as channel:
                await asyncio.wait_for(channel.channel_ready(), 10)
                await send_one(channel, "01VERIFY00000000000000000000000002", b"again")
                async with consumer(channel, "10.0.0.4@v5-cli") as c:
                    out = await asyncio.to_thread(
                        run_admin,
                        ns,
                        "queryMsgByUniqueKey",
                        "-i",
                        "01VERIFY00000000000000000000000002",
                        "-t",
                        TOPIC,
                        "-g",
                        GROUP,
                        "-d",
                        c.client_id,
                        cwd=tmp_path,
                    )
                    assert [m.message.body for m in c.commands] == [b"again"]
                    return out

        out = asyncio.run(main())
        assert out.stdout.startswith(
            "ConsumeMessageDirectlyResult [order=false, autoCommit=true, consumeResult=CR_SUCCESS, "
            "remark=from gRPC client"
        ), out.stdout
    finally:
        broker.stop()
        namesrv.stop()

"""GET_CONSUMER_RUNNING_INFO (307: ``consumerStatus -g G -i CLIENT [-s]``, the console's consumer
detail) of a RocketMQ 5 consumer of the gRPC endpoint: the broker's relay reaches the client's
Telemetry stream, which answers with what it knows of the consumer (group, consume type as
registered, subscriptions, language, version) and, with ``-s`` (``jstackEnable``), the stacks the
client gives back: a ``PrintThreadStackTraceCommand`` (a nonce) answered by a ``ThreadStackTrace``
with that nonce, as RocketMQ 5's proxy asks a Java client.  A client that does not answer: the info
without stacks after the stack wait (under the broker's 10 s wait); a stream that ends: an error at
once.  The v5 consumer is a raw gRPC Telemetry stream of this test answering as RocketMQ 5's Java
client does; the admin side is tidemq's admin tool (in process, and ``tidemq admin consumerStatus``
against a NameServer and broker subprocesses).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

grpc = pytest.importorskip("grpc")

from conftest import Server, free_port, run_admin  # noqa: E402
from telemetry_support import TelemetryConsumer, consumer_settings  # noqa: E402
from test_grpc_transport import MakeBroker, grpc_broker, pb  # noqa: E402

from tidemq.admin import consumers  # noqa: E402
from tidemq.broker.processors import consumer_control  # noqa: E402
from tidemq.client import AdminClient  # noqa: E402
from tidemq.remoting.codes import RequestCode, ResponseCode  # noqa: E402

pytestmark = pytest.mark.timeout(120)

TOPIC = "StackT"
GROUP = "G_STACK"
STACK = '"main" #1 prio=5 os_prio=0 tid=0x1 nid=0x2 runnable\n   java.lang.Thread.State: RUNNABLE\n'


class V5Consumer(TelemetryConsumer):
    """A v5 consumer's Telemetry stream: answers each PrintThreadStackTraceCommand with ``STACK``
    and status ``answer`` (a Code name), or not at all when ``answer`` is None."""

    def __init__(
        self, channel: Any, client_id: str, answer: str | None = "OK", client_type: Any = None
    ) -> None:
        self.answer = answer
        self.commands: list[Any] = []  # the PrintThreadStackTraceCommands received
        settings = consumer_settings(GROUP, TOPIC, "TagA || TagB", client_type)
        super().__init__(channel, client_id, settings, (("x-mq-language", "JAVA"),))

    def on_command(self, kind: str, command: Any) -> None:
        if kind != "print_thread_stack_trace_command":
            return
        self.commands.append(command.print_thread_stack_trace_command)
        if self.answer is not None:
            self.outgoing.put_nowait(
                pb.TelemetryCommand(
                    status=pb.Status(code=pb.Code.Value(self.answer), message=self.answer),
                    thread_stack_trace=pb.ThreadStackTrace(
                        nonce=command.print_thread_stack_trace_command.nonce, thread_stack_trace=STACK
                    ),
                )
            )


@asynccontextmanager
async def consumer(
    channel: Any, client_id: str, answer: str | None = "OK", **kw: Any
) -> AsyncIterator[V5Consumer]:
    c = V5Consumer(channel, client_id, answer, **kw)
    try:
        await asyncio.wait_for(c.settled.wait(), 10)
        yield c
    finally:
        await c.close()


def broker_streams(broker: Any) -> dict[str, Any]:
    from tidemq_transport_grpc import plugin as grpc_plugin

    server = grpc_plugin.server_of(broker)
    return server.service.streams  # type: ignore[no-any-return,union-attr]


def test_running_info_of_a_v5_consumer_with_its_thread_stacks(
    tidemq_make_broker: MakeBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tidemq_transport_grpc import peer as grpc_peer

    async def main() -> None:
        async with grpc_broker(tidemq_make_broker) as (broker, channel):
            admin = AdminClient("127.0.0.1:1", timeout=15)

            async def running(client_id: str, jstack: bool) -> Any:
                fields = {"consumerGroup": GROUP, "clientId": client_id, "jstackEnable": jstack}
                return await admin.call(
                    broker.address, RequestCode.GET_CONSUMER_RUNNING_INFO, fields, ok=tuple(range(-1, 400))
                )

            try:
                async with consumer(channel, "10.0.0.1@v5-push") as push:
                    # `consumerStatus -g G -i CID -s`: the client's own stacks, and what the broker knows.
                    response = await running(push.client_id, True)
                    assert response.code == ResponseCode.SUCCESS, response.remark
                    info = json.loads(response.body)
                    assert len(push.commands) == 1 and push.commands[0].nonce
                    assert info["jstack"] == STACK
                    props = info["properties"]
                    assert props["consumerGroup"] == GROUP
                    assert props["PROP_CONSUME_TYPE"] == "CONSUME_PASSIVELY"
                    assert props["clientIP"] == "10.0.0.1"
                    assert props["language"] == "JAVA"
                    assert int(props["PROP_CONSUMER_START_TIMESTAMP"]) <= time.time() * 1000
                    ((sub),) = info["subscriptionSet"]
                    assert (sub["topic"], sub["subString"], sorted(sub["tagsSet"])) == (
                        TOPIC,
                        "TagA || TagB",
                        ["TagA", "TagB"],
                    )
                    text = consumers.format_running_info(info)
                    assert "#Consumer Subscription#\n001 Topic: StackT" in text
                    assert text.endswith("#Consumer jstack#\n" + STACK)
                    assert not broker_streams(broker)[push.client_id].stacking

                    # Without -s: answered at once from what is known, nothing asked of the client.
                    response = await running(push.client_id, False)
                    assert response.code == ResponseCode.SUCCESS, response.remark
                    assert "jstack" not in json.loads(response.body)
                    assert len(push.commands) == 1

                async with consumer(channel, "10.0.0.2@v5-simple", client_type=pb.SIMPLE_CONSUMER) as simple:
                    info = json.loads((await running(simple.client_id, False)).body)
                    # A SimpleConsumer fetches when it wants: registered CONSUME_ACTIVELY, as
                    # RocketMQ 5's proxy registers it (the push consumer above: PASSIVELY).
                    assert info["properties"]["PROP_CONSUME_TYPE"] == "CONSUME_ACTIVELY"
                    assert info["subscriptionSet"][0]["topic"] == TOPIC

                # A client that answers with an error status: the info without stacks.
                async with consumer(channel, "10.0.0.3@v5-refuses", "NOT_IMPLEMENTED") as refuses:
                    response = await running(refuses.client_id, True)
                    assert response.code == ResponseCode.SUCCESS, response.remark
                    assert "jstack" not in json.loads(response.body) and len(refuses.commands) == 1

                # A client that never answers: the info without stacks after the stack wait
                # (5 s, under the broker's 10 s for a client; shortened here), never CONSUME_MSG_TIMEOUT.
                monkeypatch.setattr(grpc_peer, "STACK_TIMEOUT_S", 0.5)
                async with consumer(channel, "10.0.0.4@v5-silent", None) as silent:
                    begin = time.monotonic()
                    response = await running(silent.client_id, True)
                    assert response.code == ResponseCode.SUCCESS, response.remark
                    assert 0.4 < time.monotonic() - begin < 5
                    info = json.loads(response.body)
                    assert "jstack" not in info and info["properties"]["consumerGroup"] == GROUP
                    assert not broker_streams(broker)[silent.client_id].stacking

                    # The broker's own wait is shorter than the stack wait: still answered in time.
                    monkeypatch.setattr(grpc_peer, "STACK_TIMEOUT_S", 30)
                    monkeypatch.setattr(consumer_control, "CALL_CLIENT_TIMEOUT_S", 1.0)
                    begin = time.monotonic()
                    response = await running(silent.client_id, True)
                    assert response.code == ResponseCode.SUCCESS, response.remark
                    assert time.monotonic() - begin < 1.0

                    # A stream that ends while its stacks are awaited: an error at once.
                    monkeypatch.setattr(consumer_control, "CALL_CLIENT_TIMEOUT_S", 60)
                    pending = asyncio.ensure_future(running(silent.client_id, True))
                    while len(silent.commands) < 3:
                        await asyncio.sleep(0.01)
                    begin = time.monotonic()
                    silent.call.cancel()
                    response = await asyncio.wait_for(pending, 10)
                    assert response.code == ResponseCode.SYSTEM_ERROR, response.remark
                    assert time.monotonic() - begin < 5

                gone = await running("10.0.0.9@nobody", True)
                assert gone.code == ResponseCode.SYSTEM_ERROR and "not online" in (gone.remark or "")
            finally:
                await admin.close()

    asyncio.run(main())


def test_tidemq_admin_consumer_status_shows_a_v5_consumer_s_stacks(tmp_path: Path) -> None:
    """``tidemq admin consumerStatus -g G -i <client id> -s`` (mqadmin's), against a NameServer and
    a broker with the gRPC endpoint (subprocesses)."""
    namesrv = Server(["namesrv", "--listen", "127.0.0.1:0"], tmp_path)
    grpc_addr = f"127.0.0.1:{free_port()}"
    (tmp_path / "broker.toml").write_text(
        f'[broker]\nname = "broker-s"\nlisten = "127.0.0.1:{free_port()}"\n'
        f'namesrv = ["{namesrv.addresses["namesrv"]}"]\ndata_dir = "{tmp_path / "data"}"\n'
        f'[transport.grpc]\nlisten = "{grpc_addr}"\n'
    )
    broker = Server(["broker", "-c", str(tmp_path / "broker.toml")], tmp_path)
    try:
        ns = namesrv.addresses["namesrv"]
        run_admin(ns, "updateTopic", "-t", TOPIC, cwd=tmp_path)

        async def main() -> tuple[str, str]:
            async with grpc.aio.insecure_channel(grpc_addr) as channel:
                await asyncio.wait_for(channel.channel_ready(), 10)
                async with consumer(channel, "10.0.0.5@v5-cli") as c:
                    args = ("consumerStatus", "-g", GROUP, "-i", c.client_id)
                    with_stack = await asyncio.to_thread(run_admin, ns, *args, "-s", cwd=tmp_path)
                    without = await asyncio.to_thread(run_admin, ns, *args, cwd=tmp_path)
                    assert len(c.commands) == 1
                    return with_stack.stdout, without.stdout

        with_stack, without = asyncio.run(main())
        for out in (with_stack, without):
            assert out.startswith("#Consumer Properties#\n"), out
            assert f"{'PROP_CONSUME_TYPE':<40}: CONSUME_PASSIVELY\n" in out
            assert "001 Topic: StackT" in out and "SubExpression: TagA || TagB" in out
        assert with_stack.endswith("#Consumer jstack#\n" + STACK)
        assert "#Consumer jstack#" not in without
    finally:
        broker.stop()
        namesrv.stop()

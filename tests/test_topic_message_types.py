"""RocketMQ 5's topic attribute ``message.type``: set with ``tidemq admin updateTopic -a``, kept
in topics.json, announced by gRPC QueryRoute and checked on gRPC sends (not on 4.x sends)."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import run_admin

from tidemq.remoting.protocol import TopicConfig
from tidemq.topic_attributes import (
    TopicAttributeError,
    TopicMessageType,
    alter_attributes,
    message_type_of,
    parse_modification,
    type_conflict,
)

pytestmark = pytest.mark.timeout(120)


def test_attribute_modifications_follow_rocketmq_s_rules() -> None:
    assert parse_modification("+message.type=FIFO") == {"+message.type": "FIFO"}
    assert parse_modification("") == {}
    fifo = alter_attributes(True, {}, parse_modification("+message.type=FIFO"))
    assert fifo == {"message.type": "FIFO"}
    assert alter_attributes(False, fifo, {}) == fifo  # no modification keeps what the topic has
    assert alter_attributes(False, fifo, parse_modification("+message.type=MIXED")) == {
        "message.type": "MIXED"
    }
    assert alter_attributes(False, fifo, parse_modification("-message.type")) == {}
    for text, create, current, why in (
        ("message.type=FIFO", True, {}, "add/alter attribute format is wrong"),
        ("message.type", False, fifo, "delete attribute format is wrong"),
        ("+message.type=FIFO,+message.type=NORMAL", True, {}, "key duplication"),
        ("+message.type=BOGUS", True, {}, "value is not in set"),
        ("+queue.type=BatchCQ", True, {}, "unsupported key: queue.type"),
        ("-message.type", True, {}, "only add attribute is supported while creating topic"),
        ("-message.type", False, {}, "attempt to delete a nonexistent key"),
    ):
        with pytest.raises(TopicAttributeError, match=why):
            alter_attributes(create, current, parse_modification(text))


def test_a_message_s_type_and_the_conflict_rocketmq_s_proxy_reports() -> None:
    assert message_type_of({}) is TopicMessageType.NORMAL
    assert message_type_of({"__SHARDINGKEY": "g"}) is TopicMessageType.FIFO
    assert message_type_of({"TIMER_DELIVER_MS": "1", "__SHARDINGKEY": "g"}) is TopicMessageType.DELAY
    assert message_type_of({"DELAY": "3"}) is TopicMessageType.DELAY
    assert message_type_of({"TRAN_MSG": "true", "DELAY": "3"}) is TopicMessageType.TRANSACTION
    assert type_conflict(TopicMessageType.FIFO, TopicMessageType.FIFO) is None
    assert type_conflict(TopicMessageType.MIXED, TopicMessageType.DELAY) is None
    assert type_conflict(TopicMessageType.NORMAL, TopicMessageType.FIFO) == (
        "TopicMessageType validate failed, the expected type is NORMAL, but actual type is FIFO"
    )


def test_attributes_survive_json_and_the_compressed_registration_line() -> None:
    cfg = TopicConfig("T", 4, 4, attributes={"message.type": "FIFO"})
    assert TopicConfig.from_dict(cfg.to_dict()) == cfg
    assert TopicConfig.decode_line(cfg.encode_line()) == cfg
    plain = TopicConfig("P", 4, 4)
    assert "attributes" not in plain.to_dict()  # 4.x readers see the JSON they always saw
    assert plain.encode_line() == "P 4 4 6 SINGLE_TAG"


class GrpcBroker:
    """``tidemq namesrv`` and a ``tidemq broker`` with ``[transport.grpc]``, as subprocesses."""

    def __init__(self, spawn: Any, tmp_path: Path, port: int, grpc_toml: str = "") -> None:
        from conftest import free_port

        self.tmp = tmp_path
        self.namesrv = spawn("namesrv", "--listen", "127.0.0.1:0").addresses["namesrv"]
        self.grpc = f"127.0.0.1:{free_port()}"
        (tmp_path / "broker.toml").write_text(
            f'[broker]\nname = "broker-t"\nlisten = "127.0.0.1:{port}"\nnamesrv = ["{self.namesrv}"]\n'
            f'data_dir = "{tmp_path / "data"}"\n[transport.grpc]\nlisten = "{self.grpc}"\n{grpc_toml}'
        )
        self.spawn = spawn
        self.broker = spawn("broker", "-c", str(tmp_path / "broker.toml")).addresses["broker"]

    def admin(self, *args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
        return run_admin(self.namesrv, *args, cwd=self.tmp, ok=ok, timeout=30)


async def _route_and_send(endpoint: str, sends: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """QueryRoute's accept types of each topic, and the status of each (topic, system properties) send."""
    import grpc

    from tidemq_transport_grpc.proto import load

    pb = load()
    meta = (("x-mq-client-id", "types@1"),)
    out: dict[str, Any] = {"accept": {}, "sent": []}
    async with grpc.aio.insecure_channel(endpoint) as channel:
        route = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/QueryRoute",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.QueryRouteResponse.FromString,
        )
        send = channel.unary_unary(
            "/apache.rocketmq.v2.MessagingService/SendMessage",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.SendMessageResponse.FromString,
        )
        for topic in sorted({t for t, _ in sends}):
            answer = await route(pb.QueryRouteRequest(topic=pb.Resource(name=topic)), metadata=meta)
            out["accept"][topic] = sorted(
                pb.MessageType.Name(t) for t in answer.message_queues[0].accept_message_types
            )
        for topic, system in sends:
            message = pb.Message(
                topic=pb.Resource(name=topic), body=b"x", system_properties=pb.SystemProperties(**system)
            )
            answer = await send(pb.SendMessageRequest(messages=[message]), metadata=meta)
            out["sent"].append((pb.Code.Name(answer.status.code), answer.status.message))
    return out


def test_update_topic_sets_the_type_grpc_announces_and_enforces_and_4x_sends_are_not_checked(
    spawn: Any, tmp_path: Path, port: int
) -> None:
    pytest.importorskip("grpc")
    cluster = GrpcBroker(spawn, tmp_path, port)
    out = cluster.admin("updateTopic", "-t", "Fifo", "-r", "2", "-w", "2", "-a", "+message.type=FIFO").stdout
    assert "attributes={+message.type=FIFO}" in out
    cluster.admin("updateTopic", "-t", "Plain", "-r", "2", "-w", "2")
    cluster.admin("updateTopic", "-t", "Mixed", "-r", "2", "-w", "2", "-a", "+message.type=MIXED")
    # Queue counts changed without -a: the type stays (RocketMQ applies no modification).
    cluster.admin("updateTopic", "-t", "Fifo", "-r", "4", "-w", "4")
    stored = json.loads((tmp_path / "data" / "config" / "topics.json").read_text())["topicConfigTable"]
    assert stored["Fifo"]["attributes"] == {"message.type": "FIFO"} and stored["Fifo"]["writeQueueNums"] == 4
    assert "attributes" not in stored["Plain"]
    cluster.admin("exportMetadata", "-b", cluster.broker, "-t", "-f", str(tmp_path / "meta"))
    meta = json.loads((tmp_path / "meta" / "topic.json").read_text())
    assert meta["topicConfigTable"]["Fifo"]["attributes"] == {"message.type": "FIFO"}

    fifo = {"message_type": 2, "message_group": "g1"}  # MessageType.FIFO
    got = asyncio.run(
        _route_and_send(
            cluster.grpc,
            [("Fifo", fifo), ("Fifo", {}), ("Plain", fifo), ("Plain", {}), ("Mixed", fifo), ("Mixed", {})],
        )
    )
    assert got["accept"] == {
        "Fifo": ["FIFO"],
        "Plain": ["NORMAL"],
        "Mixed": ["DELAY", "FIFO", "NORMAL", "TRANSACTION"],
    }
    conflict = "MESSAGE_PROPERTY_CONFLICT_WITH_TYPE"
    assert got["sent"] == [
        ("OK", "OK"),
        (conflict, "TopicMessageType validate failed, the expected type is FIFO, but actual type is NORMAL"),
        (conflict, "TopicMessageType validate failed, the expected type is NORMAL, but actual type is FIFO"),
        ("OK", "OK"),
        ("OK", "OK"),
        ("OK", "OK"),
    ]
    # A 4.x producer talks to the broker as to a RocketMQ 5 broker: its sends are not type-checked.
    sent = cluster.admin("sendMessage", "-t", "Fifo", "-p", "from 4.x").stdout
    assert "SEND_OK" in sent

    # Removing the attribute makes the topic NORMAL again; bad modifications are refused, named.
    cluster.admin("updateTopic", "-t", "Fifo", "-r", "4", "-w", "4", "-a", "-message.type")
    stored = json.loads((tmp_path / "data" / "config" / "topics.json").read_text())["topicConfigTable"]
    assert "attributes" not in stored["Fifo"]
    for bad, why in (
        ("message.type=FIFO", "add/alter attribute format is wrong"),
        ("+message.type=SLOW", "value is not in set"),
        ("+retention=3", "unsupported key: retention"),
    ):
        refused = cluster.admin("updateTopic", "-t", "Fifo", "-a", bad, ok=False)
        assert refused.returncode != 0 and why in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr


def test_the_type_check_can_be_switched_off(spawn: Any, tmp_path: Path, port: int) -> None:
    pytest.importorskip("grpc")
    cluster = GrpcBroker(spawn, tmp_path, port, "enable_topic_message_type_check = false\n")
    cluster.admin("updateTopic", "-t", "Plain", "-r", "2", "-w", "2")
    got = asyncio.run(_route_and_send(cluster.grpc, [("Plain", {"message_type": 2, "message_group": "g"})]))
    assert got["sent"] == [("OK", "OK")]


def test_a_consumer_of_an_orderly_group_is_told_it_is_fifo(tidemq_make_broker: Any) -> None:
    grpc = pytest.importorskip("grpc")
    from tidemq.broker.subscriptions import SubscriptionGroupConfig
    from tidemq_transport_grpc import plugin as grpc_plugin
    from tidemq_transport_grpc.proto import load

    pb = load()

    async def settings_of(channel: Any, group: str) -> Any:
        stream = channel.stream_stream(
            "/apache.rocketmq.v2.MessagingService/Telemetry",
            request_serializer=lambda m: m.SerializeToString(),
            response_deserializer=pb.TelemetryCommand.FromString,
        )(metadata=(("x-mq-client-id", f"{group}@1"),))
        sub = pb.Subscription(group=pb.Resource(name=group))
        await stream.write(
            pb.TelemetryCommand(settings=pb.Settings(client_type=pb.PUSH_CONSUMER, subscription=sub))
        )
        answer = await asyncio.wait_for(stream.read(), 10)
        stream.cancel()
        return answer.settings.subscription

    async def main() -> None:
        options = {"transport": {"grpc": {"listen": "127.0.0.1:0"}}}
        async with tidemq_make_broker(options=options) as broker:
            # updateSubGroup -g G_FIFO -o true
            broker.groups.update(SubscriptionGroupConfig("G_FIFO", consume_message_orderly=True))
            server = grpc_plugin.server_of(broker)
            async with grpc.aio.insecure_channel(server.address) as channel:
                assert (await settings_of(channel, "G_FIFO")).fifo is True
                assert (await settings_of(channel, "G_PLAIN")).fifo is False

    asyncio.run(main())

"""An in-process broker driven through the tcp transport client: what producers and consumers rely on."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tidemq import hookimpl, mqjson
from tidemq.broker import Broker
from tidemq.config import DEFAULT_PLUGINS, BrokerSettings, Config, compose
from tidemq.message import (
    BatchItem,
    Prop,
    decode_message_id,
    encode_batch,
    iter_messages,
)
from tidemq.plugins import PluginManager, get_plugin_manager
from tidemq.remoting.codes import RequestCode, ResponseCode
from tidemq.remoting.command import RemotingCommand
from tidemq.testing.requests import send_fields

pytestmark = pytest.mark.timeout(60)

PULL_SUSPEND_COMMIT_SUB = 1 | 2 | 4


def make_config(data_dir: Path, plugins: dict[str, str], **settings: Any) -> Config:
    broker = BrokerSettings(listen="127.0.0.1:0", namesrv=[], data_dir=str(data_dir), **settings)
    return Config(broker=broker, plugins={**DEFAULT_PLUGINS, **plugins})


@contextlib.asynccontextmanager
async def running(
    data_dir: Path, plugins: dict[str, str], manager: PluginManager | None = None, **settings: Any
) -> AsyncIterator[tuple[Broker, Any]]:
    broker = Broker(compose(make_config(data_dir, plugins, **settings), manager))
    await broker.start()
    client = get_plugin_manager().create("transport", "tcp").client()
    try:
        yield broker, client
    finally:
        await client.close()
        await broker.stop()


async def call(
    client: Any,
    broker: Broker,
    code: int,
    fields: dict[str, Any] | None = None,
    body: bytes | None = None,
    timeout: float = 5.0,
) -> RemotingCommand:
    return await client.invoke(broker.address, RemotingCommand.request(code, fields or {}, body), timeout)


def pull_fields(
    topic: str,
    queue_id: int,
    offset: int,
    *,
    group: str = "CG",
    sub: str = "*",
    suspend_ms: int = 0,
    sys_flag: int = 4,
    commit: int = 0,
) -> dict[str, Any]:
    return {
        "consumerGroup": group,
        "topic": topic,
        "queueId": queue_id,
        "queueOffset": offset,
        "maxMsgNums": 32,
        "sysFlag": sys_flag | (2 if suspend_ms else 0),
        "commitOffset": commit,
        "suspendTimeoutMillis": suspend_ms,
        "subscription": sub,
        "subVersion": 0,
        "expressionType": "TAG",
    }


async def create_topic(client: Any, broker: Broker, topic: str, perm: int = 6, queues: int = 4) -> None:
    resp = await call(
        client,
        broker,
        RequestCode.UPDATE_AND_CREATE_TOPIC,
        {"topic": topic, "readQueueNums": queues, "writeQueueNums": queues, "perm": perm},
    )
    assert resp.code == ResponseCode.SUCCESS, resp.remark


def test_send_pull_round_trip_keeps_bytes_and_properties(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    body = bytes(range(256)) * 3
    props = {
        Prop.TAGS: "TagA",
        Prop.KEYS: "k1 k2",
        Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX: "ABCDEF0123",
        "color": "blue é",
    }

    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            r1 = await call(
                client, broker, RequestCode.SEND_MESSAGE, send_fields("RoundTrip", 2, props), body
            )
            r2 = await call(
                client, broker, RequestCode.SEND_MESSAGE_V2, send_fields("RoundTrip", 2, props, v2=True), b""
            )
            assert (r1.code, r2.code) == (ResponseCode.SUCCESS, ResponseCode.SUCCESS), (r1.remark, r2.remark)
            assert (r1.ext_fields["queueId"], r1.ext_fields["queueOffset"], r2.ext_fields["queueOffset"]) == (
                "2",
                "0",
                "1",
            )
            resp = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("RoundTrip", 2, 0))
            assert resp.code == ResponseCode.SUCCESS
            assert resp.ext_fields["nextBeginOffset"] == "2" and resp.ext_fields["maxOffset"] == "2"
            msgs = list(iter_messages(resp.payload(), check_crc=True))
            assert [m.body for m in msgs] == [body, b""]
            for m in msgs:
                assert m.topic == "RoundTrip" and m.queue_id == 2
                assert {k: m.properties[k] for k in props} == props
                # The broker names its cluster on what it stores, as RocketMQ 4.6+ (request-reply needs it).
                assert m.properties[Prop.CLUSTER] == broker.settings.cluster
            # The offset message id names this broker and the record's commit-log offset.
            (host, port), offset = decode_message_id(r1.ext_fields["msgId"])
            assert f"{host}:{port}" == broker.address and offset == msgs[0].commit_log_offset
            view = await call(client, broker, RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset})
            assert view.code == ResponseCode.SUCCESS and next(iter_messages(view.payload())).body == body
            # Offsets of the queue as clients ask for them.
            mx = await call(client, broker, RequestCode.GET_MAX_OFFSET, {"topic": "RoundTrip", "queueId": 2})
            mn = await call(client, broker, RequestCode.GET_MIN_OFFSET, {"topic": "RoundTrip", "queueId": 2})
            assert (mx.ext_fields["offset"], mn.ext_fields["offset"]) == ("2", "0")
            now_ms = int(time.time() * 1000)
            by_time = await call(
                client,
                broker,
                RequestCode.SEARCH_OFFSET_BY_TIMESTAMP,
                {"topic": "RoundTrip", "queueId": 2, "timestamp": 0},
            )
            assert by_time.ext_fields["offset"] == "0"
            earliest = await call(
                client, broker, RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": "RoundTrip", "queueId": 2}
            )
            assert now_ms - 60_000 < int(earliest.ext_fields["timestamp"]) <= now_ms
            # Pulling at the end answers "no new message" with where to continue.
            end = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("RoundTrip", 2, 2))
            assert end.code == ResponseCode.PULL_NOT_FOUND and end.ext_fields["nextBeginOffset"] == "2"

    asyncio.run(main())


def test_batch_send_stores_each_message(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    items = [BatchItem(f"m{i}".encode(), 0, {Prop.KEYS: f"key{i}", Prop.TAGS: "B"}) for i in range(5)]

    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            resp = await call(
                client, broker, RequestCode.SEND_BATCH_MESSAGE, send_fields("Batch", 1), encode_batch(items)
            )
            assert resp.code == ResponseCode.SUCCESS, resp.remark
            assert len(resp.ext_fields["msgId"].split(",")) == 5
            pulled = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("Batch", 1, 0))
            msgs = list(iter_messages(pulled.payload()))
            assert [(m.body, m.keys, m.queue_offset) for m in msgs] == [
                (f"m{i}".encode(), [f"key{i}"], i) for i in range(5)
            ]
            bad = await call(
                client, broker, RequestCode.SEND_BATCH_MESSAGE, send_fields("Batch", 1), b"\x00\x00\x00\x05xx"
            )
            assert bad.code == ResponseCode.MESSAGE_ILLEGAL

    asyncio.run(main())


def test_tag_filter_by_code_then_exact_tag(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            for tag in ["a", "b", "c", "a"]:
                await call(
                    client,
                    broker,
                    RequestCode.SEND_MESSAGE,
                    send_fields("Tags", 0, {Prop.TAGS: tag}),
                    tag.encode(),
                )
            await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Tags", 0), b"untagged")
            resp = await call(
                client, broker, RequestCode.PULL_MESSAGE, pull_fields("Tags", 0, 0, sub="a || c")
            )
            assert [m.body for m in iter_messages(resp.payload())] == [b"a", b"c", b"a"]
            assert resp.ext_fields["nextBeginOffset"] == "5"
            everything = await call(
                client, broker, RequestCode.PULL_MESSAGE, pull_fields("Tags", 0, 0, sub="*")
            )
            assert len(list(iter_messages(everything.payload()))) == 5

    asyncio.run(main())


def test_long_polling_answers_when_a_message_arrives(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            await create_topic(client, broker, "Poll")
            # Nothing arrives: the pull is held for its suspend time, then answered "not found".
            start = time.monotonic()
            empty = await call(
                client, broker, RequestCode.PULL_MESSAGE, pull_fields("Poll", 0, 0, suspend_ms=400)
            )
            assert empty.code == ResponseCode.PULL_NOT_FOUND and time.monotonic() - start >= 0.35
            # A message arrives while a 20 s pull is held: it is answered with the message at once.
            start = time.monotonic()
            held = asyncio.create_task(
                call(
                    client,
                    broker,
                    RequestCode.PULL_MESSAGE,
                    pull_fields("Poll", 0, 0, suspend_ms=20_000),
                    timeout=30,
                )
            )
            await asyncio.sleep(0.3)
            assert not held.done()
            other = await call(
                client, broker, RequestCode.SEND_MESSAGE, send_fields("Poll", 1), b"other queue"
            )
            assert other.code == ResponseCode.SUCCESS
            await asyncio.sleep(0.2)
            assert not held.done()  # an arrival in another queue does not answer it
            await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Poll", 0), b"wake up")
            resp = await held
            assert resp.code == ResponseCode.SUCCESS
            assert [m.body for m in iter_messages(resp.payload())] == [b"wake up"]
            assert time.monotonic() - start < 10

    asyncio.run(main())


def test_consumer_offsets_survive_restart(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    if plugin_matrix["store"] == "memory":
        pytest.skip("the memory store keeps nothing across restarts")

    async def first() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            for i in range(3):
                await call(
                    client, broker, RequestCode.SEND_MESSAGE, send_fields("Durable", 0), f"m{i}".encode()
                )
            r = await call(
                client,
                broker,
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "CG", "topic": "Durable", "queueId": 0, "commitOffset": 2},
            )
            assert r.code == ResponseCode.SUCCESS
            # A pull carrying the commit flag commits too (the push consumer's way).
            await call(
                client,
                broker,
                RequestCode.PULL_MESSAGE,
                pull_fields(
                    "Durable", 3, 0, group="CG2", sys_flag=PULL_SUSPEND_COMMIT_SUB, suspend_ms=1, commit=7
                ),
            )

    async def second() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            q = await call(
                client,
                broker,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": "CG", "topic": "Durable", "queueId": 0},
            )
            assert (q.code, q.ext_fields["offset"]) == (ResponseCode.SUCCESS, "2")
            q2 = await call(
                client,
                broker,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": "CG2", "topic": "Durable", "queueId": 3},
            )
            assert q2.ext_fields["offset"] == "7"
            resp = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("Durable", 0, 2))
            assert [m.body for m in iter_messages(resp.payload())] == [b"m2"]
            assert broker.topics.get("Durable") is not None  # topics.json survived too

    asyncio.run(first())
    assert (tmp_path / "config" / "consumerOffset.json").exists()
    asyncio.run(second())


def test_new_group_starts_at_zero_while_the_queue_head_is_stored(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Fresh", 0), b"x")
            q = await call(
                client,
                broker,
                RequestCode.QUERY_CONSUMER_OFFSET,
                {"consumerGroup": "NEW", "topic": "Fresh", "queueId": 0},
            )
            assert (q.code, q.ext_fields["offset"]) == (ResponseCode.SUCCESS, "0")

    asyncio.run(main())


def test_topic_permissions_and_auto_creation(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix, auto_create_topic=False) as (broker, client):
            unknown = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Nobody", 0), b"x")
            assert unknown.code == ResponseCode.TOPIC_NOT_EXIST
            await create_topic(client, broker, "WriteOnly", perm=2)
            await create_topic(client, broker, "ReadOnly", perm=4)
            assert (
                await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("WriteOnly", 0), b"x")
            ).code == ResponseCode.SUCCESS
            denied_pull = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("WriteOnly", 0, 0))
            assert denied_pull.code == ResponseCode.NO_PERMISSION
            denied_send = await call(
                client, broker, RequestCode.SEND_MESSAGE, send_fields("ReadOnly", 0), b"x"
            )
            assert denied_send.code == ResponseCode.NO_PERMISSION
            assert (
                await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("ReadOnly", 0, 0))
            ).code == ResponseCode.PULL_NOT_FOUND
            bad_queue = await call(
                client, broker, RequestCode.SEND_MESSAGE, send_fields("WriteOnly", 99), b"x"
            )
            assert bad_queue.code == ResponseCode.SYSTEM_ERROR and "queueId" in bad_queue.remark
            bad_name = await call(
                client, broker, RequestCode.UPDATE_AND_CREATE_TOPIC, {"topic": "no spaces", "perm": 6}
            )
            assert bad_name.code == ResponseCode.SYSTEM_ERROR
            topics = orjson.loads((await call(client, broker, RequestCode.GET_ALL_TOPIC_CONFIG)).body)[
                "topicConfigTable"
            ]
            assert topics["WriteOnly"]["perm"] == 2 and "TBW102" not in topics

        async with running(tmp_path / "auto", plugin_matrix) as (broker, client):
            made = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("MadeOnSend", 3), b"x")
            assert made.code == ResponseCode.SUCCESS
            cfg = broker.topics.get("MadeOnSend")
            assert cfg is not None and cfg.write_queue_nums == 4 and cfg.perm == 6
            reserved = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("TBW102", 0), b"x")
            assert reserved.code == ResponseCode.SYSTEM_ERROR

    asyncio.run(main())


def test_bad_input_is_answered_and_the_broker_keeps_serving(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            host, port = broker.address.rsplit(":", 1)

            def garbage(payload: bytes) -> bytes:
                with socket.create_connection((host, int(port)), timeout=5) as s:
                    s.sendall(payload)
                    s.shutdown(socket.SHUT_WR)
                    chunks = []
                    while chunk := s.recv(65536):
                        chunks.append(chunk)
                    return b"".join(chunks)

            await asyncio.to_thread(garbage, b"\xde\xad\xbe\xef" * 64)  # absurd frame length
            await asyncio.to_thread(garbage, struct.pack(">ii", 12, 8) + b"{not json}")  # bad header
            unknown = await call(client, broker, 4242)
            assert unknown.code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED and "4242" in unknown.remark
            missing = await call(client, broker, RequestCode.PULL_MESSAGE, {"topic": "T"})
            assert missing.code == ResponseCode.SYSTEM_ERROR and "consumerGroup" in missing.remark
            typed = await call(client, broker, RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": "zero"})
            assert typed.code == ResponseCode.SYSTEM_ERROR and "queueId" in typed.remark
            heartbeat = await call(client, broker, RequestCode.HEART_BEAT, {}, b"[1,2")
            assert heartbeat.code == ResponseCode.SYSTEM_ERROR
            ok = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("StillUp", 0), b"fine")
            assert ok.code == ResponseCode.SUCCESS

    asyncio.run(main())


def test_retry_then_dead_letter_after_max_reconsume(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix, max_reconsume_times=2) as (broker, client):
            sent = await call(
                client, broker, RequestCode.SEND_MESSAGE, send_fields("Work", 0, {Prop.TAGS: "t"}), b"job"
            )
            _, offset = decode_message_id(sent.ext_fields["msgId"])
            retry = "%RETRY%Workers"
            for attempt in range(1, 4):
                back = await call(
                    client,
                    broker,
                    RequestCode.CONSUMER_SEND_MSG_BACK,
                    {"group": "Workers", "offset": offset, "delayLevel": 0},
                )
                assert back.code == ResponseCode.SUCCESS, back.remark
                if attempt <= 2:
                    # The retry waits in the schedule queue of its delay level (issue 10).
                    level = 3 + attempt - 1
                    waiting = broker.store.get_message("Workers", "SCHEDULE_TOPIC_XXXX", level - 1, 0, 1)
                    msg = next(iter_messages(bytes(waiting.buffers[0])))
                    assert (msg.body, msg.reconsume_times, msg.properties[Prop.RETRY_TOPIC]) == (
                        b"job",
                        attempt,
                        "Work",
                    )
                    assert msg.properties[Prop.DELAY_TIME_LEVEL] == str(level)
                    assert msg.properties[Prop.REAL_TOPIC] == retry
                    assert broker.store.get_max_offset_in_queue(retry, 0) == 0  # not delivered yet
                    offset = msg.commit_log_offset
            dlq = broker.topics.get("%DLQ%Workers")
            assert dlq is not None and dlq.perm == 2  # dead letters are kept, not delivered
            assert broker.store.get_max_offset_in_queue("%DLQ%Workers", 0) == 1

    asyncio.run(main())


class Veto:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    @hookimpl
    def tidemq_before_send(self, context: Any) -> str | None:
        return "quota exceeded" if context.topic == "Forbidden" else None

    @hookimpl
    def tidemq_after_send(self, context: Any) -> None:
        self.seen.append((context.topic, context.status, context.side))

    @hookimpl
    def tidemq_after_consume(self, context: Any) -> None:
        self.seen.append((context.topic, f"pulled {context.message_count}", context.side))


def test_send_hooks_observe_and_veto(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    manager = PluginManager()
    manager.load_entry_points()
    veto = Veto()
    manager.register(veto, name="veto-test")

    async def main() -> None:
        async with running(tmp_path, plugin_matrix, manager=manager) as (broker, client):
            refused = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Forbidden", 0), b"x")
            assert (refused.code, refused.remark) == (ResponseCode.NO_PERMISSION, "quota exceeded")
            ok = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Allowed", 0), b"x")
            assert ok.code == ResponseCode.SUCCESS
            await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("Allowed", 0, 0))
            assert broker.store.get_max_offset_in_queue("Forbidden", 0) == 0

    asyncio.run(main())
    assert veto.seen == [
        ("Forbidden", "NO_PERMISSION", "broker"),
        ("Allowed", "SUCCESS", "broker"),
        ("Allowed", "pulled 1", "broker"),
    ]


def heartbeat(client_id: str, group: str, topic: str) -> bytes:
    return orjson.dumps(
        {
            "clientID": client_id,
            "consumerDataSet": [
                {
                    "groupName": group,
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [
                        {"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": "1"}
                    ],
                }
            ],
            "producerDataSet": [],
        }
    )


def test_heartbeats_group_membership_and_rebalance_notices(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            notices: list[str] = []

            async def on_request(conn: Any, request: RemotingCommand) -> RemotingCommand | None:
                if request.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
                    notices.append(request.ext_fields["consumerGroup"])
                return None

            transport = get_plugin_manager().create("transport", "tcp")
            first = transport.client(handler=on_request)
            second = transport.client()
            try:
                r = await first.invoke(
                    broker.address,
                    RemotingCommand.request(RequestCode.HEART_BEAT, {}, heartbeat("c1", "G", "Orders")),
                    5,
                )
                assert r.code == ResponseCode.SUCCESS
                assert (
                    broker.topics.get("%RETRY%G") is not None
                )  # consumers look up their retry topic's route
                await second.invoke(
                    broker.address,
                    RemotingCommand.request(RequestCode.HEART_BEAT, {}, heartbeat("c2", "G", "Orders")),
                    5,
                )
                ids = await call(
                    client, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}
                )
                assert orjson.loads(ids.body)["consumerIdList"] == ["c1", "c2"]
                for _ in range(50):
                    if len(notices) >= 2:
                        break
                    await asyncio.sleep(0.05)
                assert notices[:2] == ["G", "G"]  # c1 joined, then c2 joined
                await second.close()  # c2's connection drops: the group shrinks and c1 is told
                for _ in range(100):
                    if len(notices) >= 3:
                        break
                    await asyncio.sleep(0.05)
                assert len(notices) == 3
                ids = await call(
                    client, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}
                )
                assert orjson.loads(ids.body)["consumerIdList"] == ["c1"]
                # Orderly consumers lock queues: a second client cannot take c1's queue.
                mq = {"topic": "Orders", "brokerName": "broker-a", "queueId": 0}
                lock = lambda cid: orjson.dumps({"consumerGroup": "G", "clientId": cid, "mqSet": [mq]})  # noqa: E731
                got = await call(client, broker, RequestCode.LOCK_BATCH_MQ, {}, lock("c1"))
                assert orjson.loads(got.body)["lockOKMQSet"] == [mq]
                refused = await call(client, broker, RequestCode.LOCK_BATCH_MQ, {}, lock("c3"))
                assert orjson.loads(refused.body)["lockOKMQSet"] == []
                await call(client, broker, RequestCode.UNLOCK_BATCH_MQ, {}, lock("c1"))
                taken = await call(client, broker, RequestCode.LOCK_BATCH_MQ, {}, lock("c3"))
                assert orjson.loads(taken.body)["lockOKMQSet"] == [mq]
                unreg = await first.invoke(
                    broker.address,
                    RemotingCommand.request(
                        RequestCode.UNREGISTER_CLIENT, {"clientID": "c1", "consumerGroup": "G"}
                    ),
                    5,
                )
                assert unreg.code == ResponseCode.SUCCESS
                gone = await call(
                    client, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "G"}
                )
                assert gone.code == ResponseCode.SYSTEM_ERROR
            finally:
                await first.close()
                await second.close()

    asyncio.run(main())


def test_query_message_by_key_through_the_index(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            for i in range(3):
                await call(
                    client,
                    broker,
                    RequestCode.SEND_MESSAGE,
                    send_fields("Keyed", 0, {Prop.KEYS: f"order-{i} shared"}),
                    f"b{i}".encode(),
                )
            await call(
                client,
                broker,
                RequestCode.SEND_MESSAGE,
                send_fields("Other", 0, {Prop.KEYS: "order-1"}),
                b"other topic",
            )
            fields = {
                "topic": "Keyed",
                "key": "order-1",
                "maxNum": 32,
                "beginTimestamp": 0,
                "endTimestamp": int(time.time() * 1000) + 60_000,
            }
            for _ in range(100):  # the index is built by the store's dispatch, just after the put
                resp = await call(client, broker, RequestCode.QUERY_MESSAGE, fields)
                if resp.code == ResponseCode.SUCCESS:
                    break
                await asyncio.sleep(0.05)
            assert [m.body for m in iter_messages(resp.payload())] == [b"b1"]
            fields["key"] = "shared"
            shared = await call(client, broker, RequestCode.QUERY_MESSAGE, fields)
            assert sorted(m.body for m in iter_messages(shared.payload())) == [b"b0", b"b1", b"b2"]
            fields["key"] = "absent"
            assert (
                await call(client, broker, RequestCode.QUERY_MESSAGE, fields)
            ).code == ResponseCode.QUERY_NOT_FOUND

    asyncio.run(main())


def test_admin_statistics(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            await create_topic(client, broker, "Stats", queues=2)
            for _ in range(3):
                await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Stats", 1), b"x")
            await call(
                client,
                broker,
                RequestCode.UPDATE_CONSUMER_OFFSET,
                {"consumerGroup": "SG", "topic": "Stats", "queueId": 1, "commitOffset": 1},
            )
            # fastjson's MessageQueue-keyed maps (tidemq.mqjson reads them).
            stats = mqjson.loads(
                (await call(client, broker, RequestCode.GET_TOPIC_STATS_INFO, {"topic": "Stats"})).body
            )
            rows = sorted(mqjson.mq_map(stats["offsetTable"]).items())
            assert [(mq.queue_id, r["minOffset"], r["maxOffset"]) for mq, r in rows] == [(0, 0, 0), (1, 0, 3)]
            consume = mqjson.loads(
                (await call(client, broker, RequestCode.GET_CONSUME_STATS, {"consumerGroup": "SG"})).body
            )
            lag = {
                mq.queue_id: r["brokerOffset"] - max(r["consumerOffset"], 0)
                for mq, r in mqjson.mq_map(consume["offsetTable"]).items()
            }
            assert lag == {0: 0, 1: 2}
            info = orjson.loads((await call(client, broker, RequestCode.GET_BROKER_RUNTIME_INFO)).body)[
                "table"
            ]
            assert info["msgPutTotalTodayNow"] == "3" and int(info["commitLogMaxOffset"]) > 0
            deleted = await call(client, broker, RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": "Stats"})
            assert deleted.code == ResponseCode.SUCCESS and broker.topics.get("Stats") is None

    asyncio.run(main())


def test_silent_consumers_are_dropped_by_housekeeping(tmp_path: Path, plugin_matrix: dict[str, str]) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix, consumer_housekeeping_s=0.5) as (broker, client):
            hb = await call(client, broker, RequestCode.HEART_BEAT, {}, heartbeat("quiet", "Sleepy", "T"))
            assert hb.code == ResponseCode.SUCCESS
            ids = await call(
                client, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Sleepy"}
            )
            assert orjson.loads(ids.body)["consumerIdList"] == ["quiet"]
            await asyncio.sleep(1.5)  # no heartbeat for three housekeeping intervals
            gone = await call(
                client, broker, RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": "Sleepy"}
            )
            assert gone.code == ResponseCode.SYSTEM_ERROR and "no consumer" in gone.remark

    asyncio.run(main())


def test_a_taken_port_fails_start_and_leaves_the_store_usable(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    async def main() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            cfg = make_config(tmp_path, plugin_matrix)
            cfg.broker.listen = f"127.0.0.1:{port}"
            with pytest.raises(OSError):
                await Broker(compose(cfg)).start()
        async with running(tmp_path, plugin_matrix) as (broker, client):
            ok = await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("AfterFailure", 0), b"x")
            assert ok.code == ResponseCode.SUCCESS

    asyncio.run(main())


def test_pulls_without_a_subscription_use_the_heartbeat_one(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    async def main() -> None:
        async with running(tmp_path, plugin_matrix) as (broker, client):
            await call(client, broker, RequestCode.SEND_MESSAGE, send_fields("Subs", 0), b"x")
            unknown = await call(
                client, broker, RequestCode.PULL_MESSAGE, pull_fields("Subs", 0, 0, group="H", sys_flag=0)
            )
            assert unknown.code == ResponseCode.SUBSCRIPTION_NOT_EXIST
            await call(
                client, broker, RequestCode.HEART_BEAT, {}, heartbeat("h1", "H", "Subs")
            )  # subVersion 1
            fields = pull_fields("Subs", 0, 0, group="H", sys_flag=0)
            ok = await call(client, broker, RequestCode.PULL_MESSAGE, {**fields, "subVersion": 1})
            assert ok.code == ResponseCode.SUCCESS
            stale = await call(client, broker, RequestCode.PULL_MESSAGE, {**fields, "subVersion": 2})
            assert stale.code == ResponseCode.SUBSCRIPTION_NOT_LATEST
            bad = await call(client, broker, RequestCode.PULL_MESSAGE, pull_fields("Subs", 0, 0, sub="||"))
            assert bad.code == ResponseCode.SUBSCRIPTION_PARSE_FAILED

    asyncio.run(main())


def test_stop_answers_held_pulls_instead_of_waiting_them_out(
    tmp_path: Path, plugin_matrix: dict[str, str]
) -> None:
    async def main() -> None:
        broker = Broker(compose(make_config(tmp_path, plugin_matrix)))
        await broker.start()
        client = get_plugin_manager().create("transport", "tcp").client()
        try:
            await create_topic(client, broker, "Held")
            held = asyncio.create_task(
                call(
                    client,
                    broker,
                    RequestCode.PULL_MESSAGE,
                    pull_fields("Held", 0, 0, suspend_ms=20_000),
                    timeout=30,
                )
            )
            await asyncio.sleep(0.3)
            start = time.monotonic()
            await broker.stop()
            assert time.monotonic() - start < 10  # not the 20 s suspend, nor a drain timeout
            resp = await held
            assert resp.code == ResponseCode.PULL_NOT_FOUND
        finally:
            await client.close()

    asyncio.run(main())

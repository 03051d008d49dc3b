"""Client pieces that need no broker: ids, subscriptions, compression, routes, process queues, offsets."""

from __future__ import annotations

import asyncio
import os
import re
import zlib

import pytest

from tidemq.client import ClientError, Message, MessageQueue, Producer, new_message_id
from tidemq.client.compression import compress, decompress
from tidemq.client.message import UniqueIdGenerator
from tidemq.client.offset_store import LocalFileOffsetStore
from tidemq.client.process_queue import ProcessQueue
from tidemq.client.push_consumer import ConsumeFrom, PushConsumer, parse_consume_from
from tidemq.client.route import TopicRoute, loads_lenient
from tidemq.client.subscription import Subscription, prepare
from tidemq.errors import CorruptDataError, MessageTooLargeError
from tidemq.message import (
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_MASK,
    MessageInner,
    Prop,
    decode_message,
    encode_message,
    java_string_hash,
)


def test_message_ids_are_unique_upper_hex_and_carry_the_ip() -> None:
    ids = {new_message_id() for _ in range(20000)}
    assert len(ids) == 20000
    for i in list(ids)[:50]:
        assert re.fullmatch(r"[0-9A-F]{32}", i)
    gen = UniqueIdGenerator(ip="10.1.2.3", pid=0x1234)
    assert gen.next_id().startswith("0A0102031234")


def test_subscription_expression_parsing() -> None:
    sub = Subscription.build("T", "TagA || TagB ||  ")
    assert sub.tags == ["TagA", "TagB"]
    assert sub.codes == [java_string_hash("TagA"), java_string_hash("TagB")]
    assert Subscription.build("T", "*").tags == []
    assert Subscription.build("T", None).expression == "*"
    with pytest.raises(ClientError, match="names no tag"):
        Subscription.build("T", "||")
    with pytest.raises(ClientError, match="TAG or SQL92"):
        Subscription.build("T", "a > 1", "XPATH")
    d = sub.to_json()
    assert d["subString"] == "TagA || TagB ||" and d["expressionType"] == "TAG"


def _stored(
    body: bytes,
    tags: str | None = None,
    sys_flag: int = 0,
    topic: str = "T",
    props: dict[str, str] | None = None,
):
    p = dict(props or {})
    if tags:
        p[Prop.TAGS] = tags
    rec = encode_message(MessageInner(topic=topic, body=body, properties=p, sys_flag=sys_flag))
    return decode_message(bytes(rec))


@pytest.mark.parametrize("codec", ["zlib", "lz4", "zstd"])
def test_compression_round_trip_and_flags(codec: str) -> None:
    body = b"tidemq " * 2000
    packed, flags = compress(body, codec)
    assert len(packed) < len(body) and flags & COMPRESSED_FLAG
    assert decompress(packed, flags) == body
    if codec == "zlib":  # 4.x consumers understand only plain zlib with no type bits
        assert flags & COMPRESSION_TYPE_MASK == 0 and zlib.decompress(packed) == body


def test_corrupt_compressed_body_is_a_clear_error() -> None:
    with pytest.raises(CorruptDataError, match="decompress"):
        decompress(b"not zlib", COMPRESSED_FLAG)


def test_prepare_filters_tags_decompresses_and_restores_retry_topic() -> None:
    packed, flags = compress(b"x" * 5000, "zlib")
    msgs = [
        _stored(b"a", "TagA"),
        _stored(b"b", "TagC"),
        _stored(packed, "TagB", flags),
        _stored(b"r", "TagA", topic="%RETRY%G", props={Prop.RETRY_TOPIC: "T"}),
    ]
    out = prepare(msgs, Subscription.build("T", "TagA || TagB"), "G")
    assert [m.body[:1] for m in out] == [b"a", b"x", b"r"]
    assert out[1].body == b"x" * 5000
    assert out[2].topic == "T"


def test_route_parses_fastjson_integer_keys_and_derives_queues() -> None:
    body = (
        b'{"brokerDatas":[{"brokerAddrs":{0:"127.0.0.1:10911",1:"127.0.0.1:10912"},"brokerName":"b","cluster":"C"},'
        b'{"brokerAddrs":{0:"127.0.0.1:20911"},"brokerName":"a","cluster":"C"},'
        b'{"brokerAddrs":{1:"127.0.0.1:30911"},"brokerName":"slaveonly","cluster":"C"}],'
        b'"queueDatas":[{"brokerName":"b","perm":6,"readQueueNums":2,"writeQueueNums":2,"topicSysFlag":0},'
        b'{"brokerName":"a","perm":4,"readQueueNums":3,"writeQueueNums":3,"topicSysFlag":0},'
        b'{"brokerName":"slaveonly","perm":6,"readQueueNums":1,"writeQueueNums":1,"topicSysFlag":0}],"filterServerTable":{}}'
    )
    route = TopicRoute.from_json("T", body)
    assert route.broker("b").broker_addrs == {0: "127.0.0.1:10911", 1: "127.0.0.1:10912"}
    # a is read-only; slaveonly has no master: neither is writable
    assert route.publish_queues() == [MessageQueue("T", "b", 0), MessageQueue("T", "b", 1)]
    assert len(route.subscribe_queues()) == 6
    assert route.publish_queues("New", max_queues=1) == [MessageQueue("New", "b", 0)]
    assert loads_lenient(b'{"a":{5:"x"}}') == {"a": {"5": "x"}}


def test_process_queue_commits_only_up_to_the_lowest_unfinished() -> None:
    pq = ProcessQueue()
    msgs = [_stored(b"m") for _ in range(4)]
    for i, m in enumerate(msgs):
        m.queue_offset = 10 + i
    pq.put(msgs)
    assert pq.msg_count == 4 and pq.msg_size == 4
    assert pq.remove([msgs[2], msgs[3]]) == 10  # 10 and 11 still running
    assert pq.remove([msgs[0]]) == 11
    assert pq.remove([msgs[1]]) == 14  # empty: max offset + 1
    # orderly take / rollback / commit
    pq.put(msgs)
    batch = pq.take(2)
    assert [m.queue_offset for m in batch] == [10, 11] and pq.commit_point() == 10
    pq.rollback()
    assert [m.queue_offset for m in pq.take(1)] == [10]
    assert pq.commit() == 11


def test_local_offset_store_survives_a_restart(tmp_path) -> None:
    async def main() -> None:
        mq = MessageQueue("T", "broker-a", 1)
        store = LocalFileOffsetStore(tmp_path, "inst", "G")
        await store.load()
        assert await store.read(mq) == -1
        store.update(mq, 42)
        store.update(mq, 40)  # never goes back unless asked
        assert await store.read(mq) == 42
        await store.persist([mq])
        again = LocalFileOffsetStore(tmp_path, "inst", "G")
        await again.load()
        assert await again.read(mq) == 42
        assert (tmp_path / "inst" / "G" / "offsets.json").exists()

    asyncio.run(main())


def test_producer_refuses_a_message_too_large_even_compressed() -> None:
    p = Producer("G", "127.0.0.1:1", max_message_size=1000, compress_over=100)
    body = os.urandom(10_000)  # incompressible
    with pytest.raises(MessageTooLargeError, match="over the limit of 1000"):
        p._prepare(Message("T", body))
    # a compressible body over the limit fits once compressed
    small, flags, props = p._prepare(Message("T", b"a" * 50_000, tags="T1", keys=["k1", "k2"]))
    assert len(small) < 1000 and flags & COMPRESSED_FLAG
    assert (
        props[Prop.TAGS] == "T1"
        and props[Prop.KEYS] == "k1 k2"
        and Prop.UNIQ_CLIENT_MESSAGE_ID_KEYIDX in props
    )


def test_bad_arguments_are_clear_errors() -> None:
    with pytest.raises(ClientError, match="compression"):
        Producer("G", "127.0.0.1:1", compression="gzip")
    with pytest.raises(ClientError, match="group"):
        Producer("", "127.0.0.1:1")
    with pytest.raises(TypeError, match="bytes"):
        Message("T", "text")  # type: ignore[arg-type]
    with pytest.raises(ClientError, match="message_model"):
        PushConsumer("G", "127.0.0.1:1", message_model="FANOUT")
    assert parse_consume_from("first") is ConsumeFrom.FIRST_OFFSET
    assert parse_consume_from("CONSUME_FROM_TIMESTAMP") is ConsumeFrom.TIMESTAMP
    with pytest.raises(ClientError, match="consume_from"):
        parse_consume_from("middle")
    from tidemq.errors import PluginError

    with pytest.raises(PluginError, match="latency_fault"):
        Producer("G", "127.0.0.1:1", selector="latency_faults")


def test_send_before_start_is_a_clear_error() -> None:
    async def main() -> None:
        p = Producer("G", "127.0.0.1:1")
        with pytest.raises(ClientError, match="not started"):
            await p.send(Message("T", b"x"))

    asyncio.run(main())


def test_broker_relayed_consumer_requests_dispatch_on_the_consumer_protocols() -> None:
    """The client instance answers a broker's GET_CONSUMER_STATUS_FROM_CLIENT and
    GET_CONSUMER_RUNNING_INFO by what the group's consumer is (tidemq.client.consumer_types):
    push and pull consumers hold offsets and report running info; a POP consumer holds no offsets
    and answers an empty table (as RocketMQ's client does), and says it reports no running info."""
    from tidemq import mqjson
    from tidemq.client import (
        ClientInstance,
        HoldsOffsets,
        ReportsRunningInfo,
        SimpleConsumer,
        SpeaksForClients,
    )
    from tidemq.client.pull_consumer import PullConsumer
    from tidemq.remoting.codes import RequestCode, ResponseCode
    from tidemq.remoting.command import RemotingCommand

    push, pull = PushConsumer("GPush", "127.0.0.1:1"), PullConsumer("GPull", "127.0.0.1:1")
    simple = SimpleConsumer("GPop", "127.0.0.1:1", subscriptions={"T": "*"})
    for consumer in (push, pull):
        assert isinstance(consumer, HoldsOffsets) and isinstance(consumer, ReportsRunningInfo)
        assert not isinstance(consumer, SpeaksForClients)
    assert not isinstance(simple, HoldsOffsets) and not isinstance(simple, ReportsRunningInfo)

    instance = ClientInstance("127.0.0.1:1")
    instance.register_consumer(simple)  # type: ignore[arg-type]

    async def ask(code: int, fields: dict[str, str]) -> RemotingCommand:
        answer = await instance.operator_request(RemotingCommand.request(code, fields))
        assert answer is not None
        return answer

    status = asyncio.run(ask(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"group": "GPop", "topic": "T"}))
    assert status.code == ResponseCode.SUCCESS, status.remark
    assert mqjson.loads(status.body) == {"consumerTable": {}, "messageQueueTable": {}}
    info = asyncio.run(ask(RequestCode.GET_CONSUMER_RUNNING_INFO, {"consumerGroup": "GPop", "clientId": "x"}))
    assert info.code == ResponseCode.SYSTEM_ERROR and "reports no running info" in (info.remark or "")
    gone = asyncio.run(ask(RequestCode.GET_CONSUMER_STATUS_FROM_CLIENT, {"group": "GNone", "topic": "T"}))
    assert gone.code == ResponseCode.SYSTEM_ERROR and "not exist" in (gone.remark or "")

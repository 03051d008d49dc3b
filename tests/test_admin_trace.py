"""``tidemq admin queryMsgTraceById`` against a real broker with the trace topic.

Trace messages are put on the trace topic as a tracing client puts them: a body of encoded
records, KEYS = the traced message ids and keys.  Two writers: tidemq's encoder
(:func:`tidemq.trace.format.encode_context`), and text built by hand to RocketMQ 4.9's Java
``TraceDataEncoder`` layout with Java-client message ids, so trace written by a Java client reads
the same.  The view is RocketMQ's: Pub line(s), one table per consumer group.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from conftest import run_admin, wait_for

from tidemq.admin import admin
from tidemq.client import AdminClient, LoopThread, Message, Producer
from tidemq.trace.format import TraceBean, TraceContext, TraceType, encode_context
from tidemq.trace.view import query_trace

pytestmark = pytest.mark.timeout(120)

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
_NO_ENV = {k: None for k in os.environ if k.startswith("TIDEMQ_")}
C1, C2 = "\x01", "\x02"  # TraceConstants.CONTENT_SPLITOR / FIELD_SPLITOR


class TraceCluster:
    """An in-process NameServer and broker (trace topic on) and a producer for trace messages."""

    def __init__(self, tmp: Path) -> None:
        from tidemq.broker import Broker
        from tidemq.config import NamesrvSettings, compose, parse_config
        from tidemq.namesrv import NameServer
        from tidemq.plugins import get_plugin_manager

        self.loop = LoopThread("trace-cluster")

        async def start() -> None:
            self.ns = NameServer(
                NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp / "namesrv")),
                get_plugin_manager().create("transport", "tcp"),
            )
            await self.ns.start()
            raw: dict[str, Any] = {
                "broker": {
                    "name": "broker-a",
                    "listen": "127.0.0.1:0",
                    "namesrv": [self.ns.address],
                    "data_dir": str(tmp / "broker-a"),
                    "trace_topic_enable": True,
                },
                "store": {"mmap": {"commitlog_file_size": 8 << 20, "consumequeue_entries": 10_000}},
            }
            self.broker = Broker(compose(parse_config(raw)))
            await self.broker.start()
            self.producer = Producer("trace-writer", self.ns.address)
            await self.producer.start()

        self.loop.run(start(), 30)
        self.namesrv = str(self.ns.address)

    def put_trace(self, body: str | bytes, keys: list[str]) -> None:
        """One trace message, as a tracing client's dispatcher sends it."""
        msg = Message(TRACE_TOPIC, body if isinstance(body, bytes) else body.encode(), keys=keys)
        self.loop.run(self.producer.send(msg), 30)

    def trace_of(self, msg_id: str) -> Any:
        async def ask() -> Any:
            client = AdminClient(self.namesrv)
            try:
                return await query_trace(client, msg_id)
            finally:
                await client.close()

        return self.loop.run(ask(), 30)

    def admin(self, *args: str) -> tuple[int, str, str]:
        result = CliRunner().invoke(admin, [*args, "-n", self.namesrv], env=_NO_ENV, catch_exceptions=False)
        return result.exit_code, result.stdout, result.stderr

    def stop(self) -> None:
        async def stop() -> None:
            await self.producer.shutdown()
            await self.broker.stop()
            await self.ns.stop()

        self.loop.run(stop(), 30)
        self.loop.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TraceCluster]:
    c = TraceCluster(tmp_path_factory.mktemp("trace"))
    try:
        yield c
    finally:
        c.stop()


def _lines(out: str, kind: str) -> list[list[str]]:
    """The rows of one kind (Pub / Sub / EndTx), cut into mqadmin's fixed-width columns
    ("%-10s %-20s %-20s %-20s %-10s %-10s"; tidemq's extra column after them)."""
    cuts = [0, 11, 32, 53, 74, 85]
    return [
        [line[a:b].strip() for a, b in zip(cuts, cuts[1:], strict=False)] + line[85:].split()
        for line in out.splitlines()
        if line.startswith(kind + " ")
    ]


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000))


def test_tidemq_records_show_pub_and_each_consumer_group(cluster: TraceCluster) -> None:
    """Pub, two groups (one retried after a failure), a consume not finished yet, an end
    transaction; records about another message in the same trace message are not shown."""
    mid, other = "7F00000100012A9F0000000000000001", "7F00000100012A9F0000000000000002"
    t0 = 1_700_000_000_000
    bean = TraceBean(topic="Orders", msg_id=mid, tags="TagA", keys="order-7", store_host="10.0.0.5:10911")
    ctxs = [
        TraceContext(TraceType.PUB, t0, "DefaultRegion", group_name="pg-orders", cost_time=3, beans=[bean]),
        TraceContext(
            TraceType.PUB, t0, group_name="pg-other", beans=[TraceBean(topic="Orders", msg_id=other)]
        ),
        TraceContext(
            TraceType.SUB_BEFORE,
            t0 + 10,
            group_name="cg-billing",
            request_id="r1",
            beans=[TraceBean(msg_id=mid)],
        ),  # fmt: skip
        TraceContext(
            TraceType.SUB_AFTER,
            t0 + 40,
            group_name="cg-billing",
            cost_time=30,
            is_success=False,
            request_id="r1",
            beans=[TraceBean(msg_id=mid)],
        ),  # fmt: skip
        TraceContext(
            TraceType.SUB_BEFORE,
            t0 + 5000,
            group_name="cg-billing",
            request_id="r2",
            beans=[TraceBean(msg_id=mid, retry_times=1)],
        ),  # fmt: skip
        TraceContext(
            TraceType.SUB_AFTER,
            t0 + 5007,
            group_name="cg-billing",
            cost_time=7,
            request_id="r2",
            beans=[TraceBean(msg_id=mid)],
        ),  # fmt: skip
        TraceContext(
            TraceType.SUB_BEFORE,
            t0 + 20,
            group_name="cg-audit",
            request_id="r3",
            beans=[TraceBean(msg_id=mid)],
        ),  # fmt: skip
        TraceContext(
            TraceType.SUB_AFTER,
            t0 + 20,
            group_name="cg-other",
            request_id="r4",
            beans=[TraceBean(msg_id=other)],
        ),  # fmt: skip
    ]
    # The SubBefores and SubAfters arrive in separate trace messages, as a dispatcher batches them.
    cluster.put_trace("".join(encode_context(c) for c in ctxs[:3]), [mid, "order-7", other])
    cluster.put_trace("".join(encode_context(c) for c in ctxs[3:]), [mid, other])
    tx = TraceBean(
        topic="Orders", msg_id=mid, transaction_state="COMMIT_MESSAGE", from_transaction_check=True
    )
    cluster.put_trace(encode_context(TraceContext(TraceType.END_TRANSACTION, t0 + 2, group_name="pg-orders", beans=[tx])), [mid])  # fmt: skip
    assert wait_for(lambda: len(cluster.trace_of(mid).consumers) == 2, timeout=10)

    code, out, err = cluster.admin("queryMsgTraceById", "-i", mid)
    assert code == 0, err
    assert "#ProducerGroup" in out and "#ConsumerGroup" in out
    pub = _lines(out, "Pub")
    assert pub == [["Pub", "pg-orders", "127.0.0.1", _when(t0), "3ms", "success", "10.0.0.5:10911"]]
    sub = _lines(out, "Sub")
    # Groups sorted by name, attempts by time; the unfinished consume is "pending".
    assert sub == [
        ["Sub", "cg-audit", "127.0.0.1", _when(t0 + 20), "-", "pending"],
        ["Sub", "cg-billing", "127.0.0.1", _when(t0 + 40), "30ms", "failed"],
        ["Sub", "cg-billing", "127.0.0.1", _when(t0 + 5007), "7ms", "success"],
    ]
    assert _lines(out, "EndTx") == [
        ["EndTx", "pg-orders", "127.0.0.1", _when(t0 + 2), "true", "COMMIT_MESSAGE"]
    ]
    assert "pg-other" not in out and "cg-other" not in out
    # One table per consumer group, each under its own header, as mqadmin prints them.
    assert out.count("#ConsumerGroup") == 2

    # -b/-e: a time range that holds no trace message finds nothing.
    code, out, err = cluster.admin("queryMsgTraceById", "-i", mid, "-b", "0", "-e", "1000")
    assert code == 1 and f"no trace of message {mid}" in err


def test_java_written_trace_reads_the_same(cluster: TraceCluster) -> None:
    """Text built by hand to RocketMQ 4.9's TraceDataEncoder layout (14-field Pub, 8-field
    SubBefore, 9-field SubAfter with its time and group; an older client's 7-field SubAfter),
    Java-client ids, the Java dispatcher's KEYS (the message id and each key).  Read by the real
    command line."""
    mid = "AC11000214D018B4AAC27A1E6F5D0003"  # MessageClientIDSetter: ip, pid, hash, time, counter
    offset_id = "AC11000200002A9F0000000000001C5A"  # ip, port, commit-log offset
    rid = "AC11000214D018B4AAC27A1E6F9C0007"
    t0 = 1_700_000_100_000
    pub = C1.join(["Pub", str(t0), "DefaultRegion", "JavaProducerGroup", "JavaOrders", mid, "TagJ", "k-1 k-2", "172.17.0.2:10911", "42", "6", "0", offset_id, "true"]) + C2  # fmt: skip
    before = C1.join(["SubBefore", str(t0 + 50), "DefaultRegion", "JavaConsumerGroup", rid, mid, "0", "k-1 k-2"]) + C2  # fmt: skip
    after = C1.join(["SubAfter", rid, mid, "11", "true", "k-1 k-2", "0", str(t0 + 61), "JavaConsumerGroup"]) + C2  # fmt: skip
    # A RocketMQ 4.4-4.8 consumer: its SubAfter stops at the context code (no time, no group).
    old_rid = "AC11000214D018B4AAC27A1E6FA00009"
    old_before = C1.join(["SubBefore", str(t0 + 70), "DefaultRegion", "OldJavaGroup", old_rid, mid, "0", "k-1 k-2"]) + C2  # fmt: skip
    old_after = C1.join(["SubAfter", old_rid, mid, "3", "false", "k-1 k-2", "0"]) + C2
    cluster.put_trace(pub, [mid, "k-1", "k-2"])
    cluster.put_trace(before + after + old_before + old_after, [mid, "k-1", "k-2"])
    assert wait_for(lambda: cluster.trace_of(mid).consumers != [], timeout=10)

    out = run_admin(cluster.namesrv, "queryMsgTraceById", "-i", mid, "-t", TRACE_TOPIC, cwd=Path.cwd()).stdout
    assert _lines(out, "Pub") == [
        ["Pub", "JavaProducerGroup", "127.0.0.1", _when(t0), "6ms", "success", "172.17.0.2:10911"]
    ]
    assert _lines(out, "Sub") == [
        ["Sub", "JavaConsumerGroup", "127.0.0.1", _when(t0 + 61), "11ms", "success"],
        ["Sub", "OldJavaGroup", "127.0.0.1", _when(t0 + 70), "3ms", "failed"],
    ]
    # Finding by one of the message's keys is not finding by id (mqadmin keeps the id's records).
    code, _, err = cluster.admin("queryMsgTraceById", "-i", "k-1")
    assert code == 1 and "no trace of message k-1" in err


def test_missing_trace_topic_and_bad_flags_are_one_line_errors(cluster: TraceCluster) -> None:
    code, out, err = cluster.admin("queryMsgTraceById", "-i", "00AB", "-t", "NoSuchTraceTopic")
    assert code == 1 and out == ""
    assert err.strip() == (
        "tidemq admin: error: trace topic 'NoSuchTraceTopic' does not exist "
        "(brokers create it with trace_topic_enable; -t names another)"
    )
    code, _, err = cluster.admin("queryMsgTraceById", "-i", "00AB", "-c", "0")
    assert code == 2 and "maxNum" in err
    assert "queryMsgTraceById" in CliRunner().invoke(admin, ["--help"]).stdout


def test_garbage_on_the_trace_topic_is_skipped(cluster: TraceCluster) -> None:
    """Anyone may write to the trace topic: bytes that are not text, records cut short, a time
    no clock shows.  The command prints what it can read and never a traceback."""
    mid = "7F00000100012A9F00000000000000FF"
    bad_pub = C1.join(["Pub", "9" * 30, "", "pg-odd", "T", mid, "", "", "", "5", "1", "0", "", "true"]) + C2
    body = b"\xff\xfe\x00junk" + C2.encode() + b"SubAfter\x01cut" + C2.encode() + bad_pub.encode()
    cluster.put_trace(body, [mid])
    assert wait_for(lambda: cluster.trace_of(mid).found, timeout=10)
    code, out, err = cluster.admin("queryMsgTraceById", "-i", mid)
    assert code == 0, err
    assert _lines(out, "Pub") == [["Pub", "pg-odd", "127.0.0.1", "-", "1ms", "success"]]


def test_the_official_client_records_no_trace() -> None:
    """rocketmq==0.4.4's bundled rocketmq-client-cpp has no message trace (trace came to the C++
    client later, with SetProducerMessageTrace): only the TRACE_ON property name, no trace topic, no record types, no
    dispatcher.  So trace written by a Java client is the compatibility case (above); if this
    fails, the official client gained trace: test reading what it writes."""
    spec = importlib.util.find_spec("rocketmq")
    if spec is None or spec.origin is None:
        pytest.skip("the official client rocketmq==0.4.4 is not installed")
    lib = (Path(spec.origin).parent / "librocketmq.so").read_bytes()
    assert b"PROPERTY_TRACE_SWITCH" in lib  # the property exists...
    for trace_only in (b"RMQ_SYS_TRACE_TOPIC", b"SubBefore", b"SubAfter", b"_INNER_TRACE_PRODUCER", b"TraceDispatcher", b"SetProducerMessageTrace"):  # fmt: skip
        assert trace_only not in lib, trace_only  # ...nothing that would write a trace


def test_a_tracing_producer_and_consumer_are_shown(cluster: TraceCluster) -> None:
    """tidemq's own tracing client: the send and the consume it records are what the command
    prints, with the consume's real cost."""
    from tidemq.client import PushConsumer

    async def run() -> str:
        async with Producer("pg-traced", cluster.namesrv, enable_msg_trace=True) as producer:
            sent = await producer.send(Message("TracedOrders", b"order 1", tags="TagT", keys=["ord-1"]))
        consumer = PushConsumer(
            "cg-traced", cluster.namesrv, consume_from="first", suspend_s=1.0, enable_msg_trace=True
        )
        consumer.subscribe("TracedOrders")
        consumer.register_listener(lambda msgs: time.sleep(0.05))  # a consume that takes 50 ms
        await consumer.start()
        try:
            for _ in range(100):
                trace = await _query(cluster.namesrv, sent.msg_id)
                if trace.pubs and any(a.status == "success" for _, rows in trace.consumers for a in rows):
                    break
                await asyncio.sleep(0.1)
        finally:
            await consumer.shutdown()
        return sent.msg_id

    mid = cluster.loop.run(run(), 60)
    code, out, err = cluster.admin("queryMsgTraceById", "-i", mid)
    assert code == 0, err
    [pub] = _lines(out, "Pub")
    assert pub[:3] == ["Pub", "pg-traced", "127.0.0.1"] and pub[5] == "success"
    [sub] = _lines(out, "Sub")
    assert sub[:3] == ["Sub", "cg-traced", "127.0.0.1"] and sub[5] == "success"
    assert int(sub[4].removesuffix("ms")) >= 45


async def _query(namesrv: str, msg_id: str) -> Any:
    client = AdminClient(namesrv)
    try:
        return await query_trace(client, msg_id)
    finally:
        await client.close()

"""What operators' queries show of messages past the confirm offset (controller mode).

RocketMQ 5 dispatches its consume queues and key index only up to the confirm offset, so a message
stored on a SYNC master but not yet held by the in-sync set is in none of them: QUERY_MESSAGE (by
key and unique key, hence the trace view), QUERY_CONSUME_QUEUE, SEARCH_OFFSET_BY_TIMESTAMP (and
the resets by time that use it), GET_EARLIEST_MSG_STORETIME, QUERY_CONSUME_TIME_SPAN, the consume
stats and the lag metrics do not show it; VIEW_MESSAGE_BY_ID reads the commit log by offset
(``lookMessageByOffset``) and does.  Once confirmed, everything shows again.

An in-process NameServer and broker (real store, real index, remoting on loopback) whose
replication confirms reads up to an offset the test holds; the requests go through the admin
functions and commands operators use (``tidemq admin ...``, the trace view, the admin client).
"""

from __future__ import annotations

import asyncio
import os
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from conftest import free_port

from tidemq.admin import admin
from tidemq.admin.consumers import consume_stats, reset_by_broker
from tidemq.broker import Broker
from tidemq.broker.services import BrokerServices
from tidemq.client import AdminClient, LoopThread
from tidemq.config import NamesrvSettings, compose, parse_config
from tidemq.message import MessageInner
from tidemq.message_types import MessageExt
from tidemq.namesrv import NameServer
from tidemq.plugins import get_plugin_manager
from tidemq.queues import MessageQueue
from tidemq.remoting.codes import RequestCode
from tidemq.remoting.command import RemotingCommand
from tidemq.remoting.protocol import TopicConfig
from tidemq.store import PutResult
from tidemq.trace.format import TraceBean, TraceContext, TraceType, encode_context
from tidemq.trace.view import query_trace
from tidemq_ha_replication.none import NoReplication

pytestmark = pytest.mark.timeout(120)

TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
TOPICS = ("QcKeys", "QcQueue", "QcTime", "QcLag", "QcReset")
FUTURE_MS = 4_102_444_800_000  # 2100-01-01: after every stored message
_NO_ENV = {k: None for k in os.environ if k.startswith("TIDEMQ_") and k != "TIDEMQ_NO_EXTENSIONS"}


class Confirms(NoReplication):
    """The ``none`` replication that confirms reads up to :attr:`offset` (None: no bound)."""

    def __init__(self) -> None:
        self.offset: int | None = None
        self.listener: Callable[[], None] | None = None

    def confirm_offset(self) -> int | None:
        return self.offset

    def bind_confirm_listener(self, listener: Callable[[], None]) -> None:
        self.listener = listener


class Cluster:
    """A NameServer and a broker bounded by a :class:`Confirms` the test moves."""

    def __init__(self, tmp: Path) -> None:
        self.loop = LoopThread("query-confirm")
        self.confirms = Confirms()

        async def start() -> tuple[NameServer, Broker]:
            ns = NameServer(
                NamesrvSettings(listen="127.0.0.1:0", data_dir=str(tmp / "namesrv")),
                get_plugin_manager().create("transport", "tcp"),
            )
            await ns.start()
            raw: dict[str, Any] = {
                "broker": {
                    "name": "broker-q",
                    "listen": "127.0.0.1:0",
                    "namesrv": [ns.address],
                    "data_dir": str(tmp / "broker"),
                    "trace_topic_enable": True,
                },
                "plugins": {"metrics": "prometheus"},
                "metrics": {"prometheus": {"listen": f"127.0.0.1:{free_port()}", "min_scrape_interval_s": 0}},
                "store": {"mmap": {"commitlog_file_size": 8 << 20, "consumequeue_entries": 10_000}},
            }
            components = compose(parse_config(raw))
            components.instances["replication"] = self.confirms
            broker = Broker(components)
            for topic in TOPICS:  # registered with the NameServer at start
                broker.topics.update(TopicConfig(topic, read_queue_nums=2, write_queue_nums=2))
            await broker.start()
            return ns, broker

        self.ns, self.broker = self.loop.run(start(), 30)
        assert self.broker.read_bound.active
        self.namesrv, self.addr = str(self.ns.address), self.broker.address

    # ------------------------------------------------------------------ the store and the bound
    def put(self, topic: str, queue_id: int, body: bytes, keys: str = "", uniq: str = "") -> PutResult:
        props = {"KEYS": keys} if keys else {}
        if uniq:
            props["UNIQ_KEY"] = uniq
        msg = MessageInner(topic, body, queue_id, properties=props, store_host=("127.0.0.1", 10911))
        result = self.broker.store.put_message(msg).result(10)
        assert result.ok
        time.sleep(0.005)  # distinct store times
        return result

    def hold(self) -> None:
        """The in-sync set holds everything stored so far, and nothing put after this."""
        self.confirms.offset = self.broker.store.get_max_phy_offset()

    def confirm(self) -> None:
        """The set caught up: everything stored is confirmed."""
        self.confirms.offset = self.broker.store.get_max_phy_offset()

    # ------------------------------------------------------------------ operators' tools
    def ask(self, fn: Callable[[AdminClient], Any]) -> Any:
        async def run() -> Any:
            client = AdminClient(self.namesrv)
            try:
                return await fn(client)
            finally:
                await client.close()

        return self.loop.run(run(), 30)

    def call(self, code: int, fields: dict[str, Any]) -> RemotingCommand:
        return self.ask(lambda c: c.call(self.addr, code, fields))

    def admin(self, *args: str) -> tuple[int, str]:
        result = CliRunner().invoke(admin, [*args, "-n", self.namesrv], env=_NO_ENV, catch_exceptions=False)
        return result.exit_code, result.stdout + result.stderr

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.broker.metrics_url, timeout=10) as resp:
            text = resp.read().decode()
        samples = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                samples[key] = float(value)
        return samples

    def stop(self) -> None:
        async def stop() -> None:
            await self.broker.stop()
            await self.ns.stop()

        self.loop.run(stop(), 30)
        self.loop.stop()


@pytest.fixture(scope="module")
def module_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("query-confirm"))
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
def cluster(module_cluster: Cluster) -> Iterator[Cluster]:
    module_cluster.confirms.offset = None
    try:
        yield module_cluster
    finally:
        module_cluster.confirms.offset = None


def _sample(samples: dict[str, float], name: str, **labels: str) -> float | None:
    for key, value in samples.items():
        if key.startswith(name + "{") and all(f'{k}="{v}"' in key for k, v in labels.items()):
            return value
    return None


# ---------------------------------------------------------------------- QUERY_MESSAGE
def test_query_by_key_and_unique_key_finds_confirmed_messages_only(cluster: Cluster) -> None:
    """queryMsgByKey / queryMsgByUniqueKey (QUERY_MESSAGE through the index): the unconfirmed
    record is not found (before: found); queryMsgById (VIEW_MESSAGE_BY_ID, by commit-log offset)
    shows it, as RocketMQ's lookMessageByOffset does; once confirmed the key finds both."""
    topic = "QcKeys"
    cluster.put(topic, 0, b"confirmed", keys="order-1")
    cluster.hold()
    held = cluster.put(topic, 1, b"held", keys="order-1", uniq="7F0000010001UNCONFIRMED0000000001")

    def bodies(key: str, unique: bool = False) -> list[bytes]:
        msgs: list[MessageExt] = cluster.ask(lambda c: c.query_messages(topic, key, unique))
        return sorted(m.body for m in msgs)

    assert bodies("order-1") == [b"confirmed"]
    assert bodies("7F0000010001UNCONFIRMED0000000001", unique=True) == []
    code, out = cluster.admin("queryMsgByKey", "-t", topic, "-k", "order-1")
    rows = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("#")]
    assert code == 0 and len(rows) == 1, out
    code, out = cluster.admin("queryMsgByUniqueKey", "-t", topic, "-i", "7F0000010001UNCONFIRMED0000000001")
    assert code != 0 and "no message" in out, out
    # By its offset id the operator still sees it (not bounded, as in RocketMQ).
    code, out = cluster.admin("queryMsgById", "-i", held.msg_id)
    assert code == 0 and "held" in out, out

    cluster.confirm()
    assert bodies("order-1") == [b"confirmed", b"held"]
    assert bodies("7F0000010001UNCONFIRMED0000000001", unique=True) == [b"held"]


def test_query_header_shows_the_index_end_up_to_the_confirm_offset(cluster: Cluster) -> None:
    """QUERY_MESSAGE's ``indexLastUpdatePhyoffset`` (the newest indexed record) is the newest
    confirmed record: RocketMQ 5 indexes only up to the confirm offset (before: the commit-log
    offset of the newest, unconfirmed record); once confirmed, the index's own end."""
    topic = "QcKeys"
    seen = cluster.put(topic, 0, b"seen", keys="hdr-1")
    cluster.hold()
    bound = cluster.confirms.offset
    assert bound is not None
    held = cluster.put(topic, 1, b"held", keys="hdr-1")
    assert held.wrote_offset >= bound

    def header() -> int:
        fields = {
            "topic": topic,
            "key": "hdr-1",
            "maxNum": 32,
            "beginTimestamp": 0,
            "endTimestamp": FUTURE_MS,
        }
        r = cluster.call(RequestCode.QUERY_MESSAGE, fields)
        return int(r.ext_fields["indexLastUpdatePhyoffset"])

    # The first unconfirmed record starts at the bound: RocketMQ has not indexed it yet.
    assert header() == seen.wrote_offset < bound
    cluster.confirm()
    assert header() == held.wrote_offset  # the index's newest record, now confirmed


def test_a_full_page_by_key_is_of_confirmed_records(cluster: Cluster) -> None:
    """64 records (a full page, defaultQueryMaxNum) with one key, then 3 more not confirmed: the
    query answers the 64 confirmed ones (RocketMQ's index holds only those), not 61 of them and
    not the 3 (before: the 3 newest took their place)."""
    topic = "QcKeys"
    for i in range(64):
        cluster.put(topic, i % 2, b"page %02d" % i, keys="bulk")
    cluster.hold()
    for i in range(3):
        cluster.put(topic, 0, b"late %d" % i, keys="bulk")

    msgs: list[MessageExt] = cluster.ask(lambda c: c.query_messages(topic, "bulk"))
    assert sorted(m.body for m in msgs) == [b"page %02d" % i for i in range(64)]
    cluster.confirm()
    msgs = cluster.ask(lambda c: c.query_messages(topic, "bulk"))
    assert len(msgs) == 64 and {b"late 0", b"late 1", b"late 2"} <= {m.body for m in msgs}


def test_trace_view_shows_confirmed_trace_records_only(cluster: Cluster) -> None:
    """queryMsgTraceById reads the trace topic by key: a trace record not yet confirmed is not
    there (before: its Pub line was); confirmed, it is."""
    mid = "7F00000100012A9F00000000000000C1"
    ctx = TraceContext(
        TraceType.PUB,
        int(time.time() * 1000),
        group_name="pg-confirm",
        beans=[TraceBean(topic="QcKeys", msg_id=mid, keys="k", store_host="127.0.0.1:10911")],
    )
    cluster.hold()
    cluster.put(TRACE_TOPIC, 0, encode_context(ctx).encode(), keys=mid)

    assert not cluster.ask(lambda c: query_trace(c, mid)).found
    cluster.confirm()
    trace = cluster.ask(lambda c: query_trace(c, mid))
    assert trace.found and [p.group_name for p in trace.pubs] == ["pg-confirm"]


# ---------------------------------------------------------------------- QUERY_CONSUME_QUEUE
def test_query_cq_lists_entries_up_to_the_confirm_offset(cluster: Cluster) -> None:
    """queryCq (QUERY_CONSUME_QUEUE): max index and entries stop at the confirm offset, an index
    past it "is not exist" (before: max 4 and four entries); confirmed, all four show."""
    topic = "QcQueue"
    for i in range(2):
        cluster.put(topic, 0, b"c%d" % i)
    cluster.hold()
    for i in range(2):
        cluster.put(topic, 0, b"u%d" % i)

    code, out = cluster.admin("queryCq", "-t", topic, "-q", "0", "-i", "0", "-c", "10", "-b", cluster.addr)
    assert code == 0, out
    assert "max: 2, min: 0" in out and out.count("idx: ") == 2, out
    code, out = cluster.admin("queryCq", "-t", topic, "-q", "0", "-i", "2", "-c", "10", "-b", cluster.addr)
    assert code != 0 and "Index 2 of 0@QcQueue is not exist!" in out, out

    cluster.confirm()
    code, out = cluster.admin("queryCq", "-t", topic, "-q", "0", "-i", "0", "-c", "10", "-b", cluster.addr)
    assert code == 0 and "max: 4, min: 0" in out and out.count("idx: ") == 4, out


# ---------------------------------------------------------------------- times and offsets by time
def test_offsets_by_time_and_store_times_stop_at_the_confirm_offset(cluster: Cluster) -> None:
    """SEARCH_OFFSET_BY_TIMESTAMP past every message answers the confirmed end (before: the
    stored end); GET_EARLIEST_MSG_STORETIME of a queue with nothing confirmed is -1 and
    QUERY_CONSUME_TIME_SPAN's times stop at the last confirmed message (before: the unconfirmed
    ones' times); gRPC's QueryOffset by time too.  Confirmed: the stored end and times again."""
    topic = "QcTime"
    c0 = cluster.put(topic, 0, b"c0")
    c1 = cluster.put(topic, 0, b"c1")
    cluster.hold()
    u = [cluster.put(topic, 0, b"u0"), cluster.put(topic, 1, b"u1"), cluster.put(topic, 0, b"u2")]
    store = cluster.broker.store
    stamp = {r.queue_offset: store.get_store_time(topic, 0, r.queue_offset) for r in (c0, c1, u[0], u[2])}
    stamp1 = store.get_store_time(topic, 1, 0)

    def search(qid: int, ts: int) -> int:
        resp = cluster.call(
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, {"topic": topic, "queueId": qid, "timestamp": ts}
        )
        return int(resp.ext_fields["offset"])

    def earliest(qid: int) -> int:
        resp = cluster.call(RequestCode.GET_EARLIEST_MSG_STORETIME, {"topic": topic, "queueId": qid})
        return int(resp.ext_fields["timestamp"])

    def spans() -> dict[int, dict[str, Any]]:
        resp = cluster.call(RequestCode.QUERY_CONSUME_TIME_SPAN, {"topic": topic, "group": "GQC_NONE"})
        body = orjson.loads(resp.body or b"{}")
        return {s["messageQueue"]["queueId"]: s for s in body["consumeTimeSpanSet"]}

    # GET_MAX_OFFSET: the confirmed end whatever ``committed`` says (RocketMQ 5's broker ignores it).
    for committed in (True, False):
        fields = {"topic": topic, "queueId": 0, "committed": committed}
        assert int(cluster.call(RequestCode.GET_MAX_OFFSET, fields).ext_fields["offset"]) == 2
    grpc = LocalBackendOf(cluster)
    assert search(0, FUTURE_MS) == 2 and search(0, stamp[3]) == 2 and search(0, 0) == 0
    assert search(1, FUTURE_MS) == 0
    assert grpc.offset_by_time(topic, 0, FUTURE_MS) == 2 and grpc.offset_by_time(topic, 0, -1, end=True) == 2
    assert earliest(0) == stamp[0] and earliest(1) == -1
    span = spans()
    assert (span[0]["minTimeStamp"], span[0]["maxTimeStamp"]) == (stamp[0], stamp[1])
    assert (span[1]["minTimeStamp"], span[1]["maxTimeStamp"]) == (-1, -1)

    cluster.confirm()
    assert search(0, FUTURE_MS) == 4 and search(0, stamp[3]) == 3 and search(1, FUTURE_MS) == 1
    assert grpc.offset_by_time(topic, 0, FUTURE_MS) == 4
    assert earliest(1) == stamp1
    span = spans()
    assert span[0]["maxTimeStamp"] == stamp[3] and span[1]["maxTimeStamp"] == stamp1


class LocalBackendOf:
    """gRPC's QueryOffset as the gRPC endpoint's backend answers it (the broker's services)."""

    def __init__(self, cluster: Cluster) -> None:
        from tidemq_transport_grpc.backend import LocalBackend  # noqa: PLC0415

        self.cluster = cluster
        self.backend = LocalBackend(BrokerServices(cluster.broker))

    def offset_by_time(self, topic: str, qid: int, ts: int, end: bool = False) -> int:
        policy = "END" if end else "TIMESTAMP"
        got = self.cluster.loop.run(self.backend.queue_offset(topic, "broker-q", qid, policy, ts), 10)
        assert isinstance(got, int)
        return got


# ---------------------------------------------------------------------- lag: stats and metrics
def test_consumer_lag_counts_confirmed_messages_only(cluster: Cluster) -> None:
    """consumerProgress's brokerOffset and diff (GET_CONSUME_STATS), topicStatus's max offset and
    /metrics' rocketmq_group_diff and rocketmq_producer_offset count up to the confirm offset
    (before, /metrics counted the unconfirmed two); a group whose offset is past the confirmed end
    has no last timestamp (RocketMQ reads no store time there).  Confirmed: all five count."""
    topic, group, ahead = "QcLag", "GQC_LAG", "GQC_AHEAD"
    for i in range(3):
        cluster.put(topic, 0, b"c%d" % i)
    cluster.hold()
    for i in range(2):
        cluster.put(topic, 0, b"u%d" % i)
    for g, offset in ((group, 1), (ahead, 5)):
        fields = {"consumerGroup": g, "topic": topic, "queueId": 0, "commitOffset": offset}
        cluster.call(RequestCode.UPDATE_CONSUMER_OFFSET, fields)
    mq = MessageQueue(topic, "broker-q", 0)

    def wrapper(g: str) -> dict[str, Any]:
        table = cluster.ask(lambda c: consume_stats(c, cluster.addr, g, topic))["offsetTable"]
        return dict(table[mq])

    lag = wrapper(group)
    assert (lag["brokerOffset"], lag["consumerOffset"]) == (3, 1)
    assert wrapper(ahead)["lastTimestamp"] == 0
    code, out = cluster.admin("consumerProgress", "-g", group)
    assert code == 0 and "Diff Total: 2" in out, out
    samples = cluster.metrics()
    assert _sample(samples, "rocketmq_group_diff", group=group, topic=topic) == 2
    assert _sample(samples, "rocketmq_producer_offset", topic=topic) == 3

    cluster.confirm()
    assert wrapper(group)["brokerOffset"] == 5
    assert wrapper(ahead)["lastTimestamp"] == cluster.broker.store.get_store_time(topic, 0, 4)
    code, out = cluster.admin("consumerProgress", "-g", group)
    assert code == 0 and "Diff Total: 4" in out, out
    samples = cluster.metrics()
    assert _sample(samples, "rocketmq_group_diff", group=group, topic=topic) == 4
    assert _sample(samples, "rocketmq_producer_offset", topic=topic) == 5


# ---------------------------------------------------------------------- resets by time
def _committed(cluster: Cluster, group: str, topic: str, qid: int) -> int:
    resp = cluster.call(
        RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": qid}
    )
    return int(resp.ext_fields["offset"])


def test_reset_offset_by_time_stops_at_the_confirm_offset(cluster: Cluster) -> None:
    """resetOffsetByTime to a time after every message: offline (the admin commits SEARCH_OFFSET_BY_
    TIMESTAMP's answer) and online (INVOKE_BROKER_TO_RESET_OFFSET) the group lands on the confirmed
    end, not past messages a failover can cut (before: the stored end, 4); confirmed: the end."""
    topic = "QcReset"
    for i in range(2):
        cluster.put(topic, 0, b"c%d" % i)
    cluster.hold()
    for i in range(2):
        cluster.put(topic, 0, b"u%d" % i)
    for g in ("GQC_OFFLINE", "GQC_ONLINE"):
        for qid in (0, 1):
            fields = {"consumerGroup": g, "topic": topic, "queueId": qid, "commitOffset": 0}
            cluster.call(RequestCode.UPDATE_CONSUMER_OFFSET, fields)

    code, out = cluster.admin("resetOffsetByTime", "-g", "GQC_OFFLINE", "-t", topic, "-s", str(FUTURE_MS))
    assert code == 0, out
    assert _committed(cluster, "GQC_OFFLINE", topic, 0) == 2

    async def online_reset(client: AdminClient) -> dict[MessageQueue, int] | None:
        heartbeat = {
            "clientID": "127.0.0.1@qc-online",
            "consumerDataSet": [
                {
                    "groupName": "GQC_ONLINE",
                    "consumeType": "CONSUME_PASSIVELY",
                    "messageModel": "CLUSTERING",
                    "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
                    "subscriptionDataSet": [
                        {"topic": topic, "subString": "*", "tagsSet": [], "codeSet": [], "subVersion": 0}
                    ],
                    "unitMode": False,
                }
            ],
            "producerDataSet": [],
        }
        await client.call(cluster.addr, RequestCode.HEART_BEAT, {}, orjson.dumps(heartbeat))
        table = await reset_by_broker(client, topic, "GQC_ONLINE", FUTURE_MS, True)
        await asyncio.sleep(0)
        return table

    table = cluster.ask(online_reset)
    assert table is not None and table[MessageQueue(topic, "broker-q", 0)] == 2, table

    cluster.confirm()
    code, out = cluster.admin("resetOffsetByTime", "-g", "GQC_OFFLINE", "-t", topic, "-s", str(FUTURE_MS))
    assert code == 0 and _committed(cluster, "GQC_OFFLINE", topic, 0) == 4, out

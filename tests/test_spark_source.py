"""The ``tidemq`` and ``tidemq-store`` Spark data sources against a real broker and SparkSession.

One ``local[2]`` SparkSession and one in-process NameServer + broker (background loop thread,
free loopback ports, mmap store with small CommitLog files so several files exist) serve the
whole module; each test uses its own topic.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq_spark.environment import spark_problem

# pyspark, pyarrow and Java 17: without one, skip with the one line that says which and how to fix.
_PROBLEM = spark_problem()
if _PROBLEM is not None:
    pytest.skip(_PROBLEM, allow_module_level=True)

from tidemq.client import BlockingProducer, LoopThread, Message  # noqa: E402
from tidemq.plugins import get_plugin_manager  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

BROKER = "broker-spark"
_seq = itertools.count()


def unique(prefix: str) -> str:
    return f"{prefix}{os.getpid()}_{next(_seq)}"


class Cluster:
    """A NameServer and one broker on free loopback ports, run on a background event loop."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.data_dir = tmp / BROKER
        self.loop = LoopThread("tidemq-spark-test-cluster")
        self.namesrv: Any = None
        self.broker: Any = None

    def run(self, coro: Any, timeout: float = 60.0) -> Any:
        return self.loop.run(coro, timeout)

    async def start(self) -> None:
        from tidemq.broker import Broker
        from tidemq.config import NamesrvSettings, compose, parse_config
        from tidemq.namesrv import NameServer

        transport = get_plugin_manager().create("transport", "tcp")
        self.namesrv = NameServer(
            NamesrvSettings(listen="127.0.0.1:0", data_dir=str(self.tmp / "namesrv")), transport
        )
        await self.namesrv.start()
        cfg = parse_config(
            {
                "broker": {
                    "name": BROKER,
                    "listen": "127.0.0.1:0",
                    "namesrv": [self.namesrv.address],
                    "data_dir": str(self.data_dir),
                },
                # 256 KiB files: the test data spans several files (BLANK end-of-file markers).
                "store": {"mmap": {"commitlog_file_size": 256 * 1024, "consumequeue_entries": 10000}},
            }
        )
        self.broker = Broker(compose(cfg))
        await self.broker.start()

    async def stop(self) -> None:
        if self.broker is not None:
            await self.broker.stop()
        if self.namesrv is not None:
            await self.namesrv.stop()

    @property
    def ns(self) -> str:
        return self.namesrv.address

    def create_topic(self, topic: str, queues: int = 4) -> None:
        from tidemq.remoting.codes import RequestCode, ResponseCode
        from tidemq.remoting.command import RemotingCommand

        async def go() -> None:
            client = get_plugin_manager().create("transport", "tcp").client()
            try:
                fields = {
                    "topic": topic,
                    "defaultTopic": "TBW102",
                    "readQueueNums": str(queues),
                    "writeQueueNums": str(queues),
                    "perm": "6",
                    "topicFilterType": "SINGLE_TAG",
                    "topicSysFlag": "0",
                    "order": "false",
                }
                req = RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, fields)
                resp = await client.invoke(self.broker.address, req, 5.0)
                assert resp.code == ResponseCode.SUCCESS, resp
            finally:
                await client.close()

        self.run(go())
        self.wait_route(topic, queues)

    def wait_route(self, topic: str, queues: int) -> None:
        from tidemq_spark.client import TidemqSession

        deadline = time.monotonic() + 20
        with TidemqSession(self.ns) as s:
            while True:
                try:
                    if len(s.queues(topic)) == queues:
                        return
                except Exception:
                    pass
                if time.monotonic() > deadline:
                    raise AssertionError(f"no route for {topic}")
                time.sleep(0.1)

    def produce(self, topic: str, count: int, start: int = 0) -> list[Any]:
        """Send ``count`` messages one by one; message i has tag TagA/TagB by parity."""
        results = []
        with BlockingProducer(unique("PG"), self.ns) as p:
            for i in range(start, start + count):
                msg = Message(
                    topic,
                    f"body-{i}".encode(),
                    tags="TagA" if i % 2 == 0 else "TagB",
                    keys=[f"key-{i}", "shared"],
                    properties={"idx": str(i), "color": "blue"},
                )
                results.append(p.send(msg))
        return results


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    pytest.importorskip("tidemq.broker")
    pytest.importorskip("tidemq.namesrv")
    c = Cluster(tmp_path_factory.mktemp("spark-cluster"))
    try:
        c.run(c.start())
        yield c
    finally:
        c.run(c.stop())
        c.loop.stop()


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pyspark.sql import SparkSession

    import tidemq_spark

    # Python workers must run this interpreter (the one with tidemq and pyarrow installed).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    tidemq_spark.register(session)
    yield session
    session.stop()


def read(spark: Any, cluster: Cluster, topic: str, **options: str) -> Any:
    return (
        spark.read.format("tidemq")
        .option("namesrv", cluster.ns)
        .option("topic", topic)
        .options(**options)
        .load()
    )


def official_produce(cluster: Cluster, topic: str, count: int) -> list[dict[str, Any]]:
    """Messages sent by the official client (rocketmq==0.4.4) in its own process."""
    worker = Path(__file__).parent / "compat" / "official_client.py"
    out = subprocess.run(
        [sys.executable, str(worker), "produce", "--namesrv", cluster.ns, "--topic", topic]
        + ["--count", str(count), "--prefix", "official", "--start", "0"],
        capture_output=True,
        text=True,
        timeout=90,
        env={**os.environ, "HOME": str(cluster.tmp)},
        cwd=cluster.tmp,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


# ---------------------------------------------------------------------------- batch reads


def test_batch_read_earliest_to_latest_returns_every_message_once(spark: Any, cluster: Cluster) -> None:
    topic = unique("SparkBatch")
    cluster.create_topic(topic, queues=4)
    sent = cluster.produce(topic, 120)
    official = []
    try:
        import rocketmq.client  # noqa: F401

        official = official_produce(cluster, topic, 10)
    except ImportError:
        pass

    df = read(spark, cluster, topic)
    assert [f.name for f in df.schema.fields] == list(__import__("tidemq_spark").COLUMNS)
    assert df.schema["body"].dataType.typeName() == "binary"
    assert df.schema["store_timestamp"].dataType.typeName() == "timestamp"
    rows = df.collect()
    assert len(rows) == 120 + len(official)
    assert df.rdd.getNumPartitions() == 4  # one partition per queue

    mine = {r.body.decode(): r for r in rows if r.body.startswith(b"body-")}
    assert set(mine) == {f"body-{i}" for i in range(120)}
    r7 = mine["body-7"]
    assert (r7.topic, r7.broker, r7.tags, r7.keys) == (topic, BROKER, "TagB", "key-7 shared")
    assert r7.properties == {"idx": "7", "color": "blue"}  # user properties only
    assert r7.reconsume_times == 0
    assert abs(r7.store_timestamp.timestamp() - time.time()) < 600
    # msg_id is the producer's id, queue/offset are the broker's: exactly as the send results say
    by_id = {s.msg_id: s for s in sent}
    for r in mine.values():
        s = by_id[r.msg_id]
        assert (s.queue.queue_id, s.queue_offset) == (r.queue_id, r.queue_offset)
    # offsets of each queue are contiguous from 0
    for q in range(4):
        offs = sorted(r.queue_offset for r in rows if r.queue_id == q)
        assert offs == list(range(len(offs)))
    if official:
        bodies = {r.body.decode(): r for r in rows if r.body.startswith(b"official-")}
        assert set(bodies) == {f"official-{i}" for i in range(10)}
        assert bodies["official-3"].properties == {"idx": "3", "color": "blue"}
        assert bodies["official-3"].tags == "TagB"


def test_offsets_json_timestamp_and_tag_filter_pushdown(spark: Any, cluster: Cluster) -> None:
    topic = unique("SparkRange")
    cluster.create_topic(topic, queues=2)
    cluster.produce(topic, 40)  # 20 per queue
    q0, q1 = f"{BROKER}:0", f"{BROKER}:1"

    starting = json.dumps({topic: {q0: 3, q1: -2}})
    ending = json.dumps({topic: {q0: 8, q1: 4}})
    rows = read(spark, cluster, topic, startingOffsets=starting, endingOffsets=ending).collect()
    got = sorted((r.queue_id, r.queue_offset) for r in rows)
    assert got == [(0, o) for o in range(3, 8)] + [(1, o) for o in range(0, 4)]

    # the tag filter runs in the broker: only TagA messages come back, offsets keep their gaps
    tag_a = read(spark, cluster, topic, filter="TagA").collect()
    assert len(tag_a) == 20 and {r.tags for r in tag_a} == {"TagA"}
    assert {int(r.properties["idx"]) % 2 for r in tag_a} == {0}

    # SQL92 is passed through to the broker: it filters, or its refusal comes back as one clear error
    sql = read(spark, cluster, topic, filter="idx = '7'", filterType="SQL92")
    if "SQL92" in cluster.broker.filters:
        assert [r.properties["idx"] for r in sql.collect()] == ["7"]
    else:
        with pytest.raises(Exception, match="the broker rejected filter \"idx = '7'\" \\(SQL92\\)"):
            sql.collect()

    # a topic pattern (full match over the NameServer's topic list)
    pattern = (
        spark.read.format("tidemq").option("namesrv", cluster.ns).option("topicPattern", topic[:-2] + ".*")
    )
    assert pattern.load().filter(f"topic = '{topic}'").count() == 40

    # startingTimestamp after everything -> an error (Kafka's default strategy) or, with
    # startingOffsetsByTimestampStrategy=latest, nothing; before everything -> all
    future = str(int(time.time() * 1000) + 60_000)
    with pytest.raises(
        Exception, match=f"{topic} {BROKER}:[01] has no message at or after timestamp {future}"
    ):
        read(spark, cluster, topic, startingTimestamp=future).count()
    assert (
        read(
            spark, cluster, topic, startingTimestamp=future, startingOffsetsByTimestampStrategy="latest"
        ).count()
        == 0
    )
    assert read(spark, cluster, topic, startingTimestamp="0").count() == 40

    with pytest.raises(Exception, match="broker-nope:0"):
        read(spark, cluster, topic, startingOffsets=json.dumps({topic: {"broker-nope:0": 1}})).collect()
    with pytest.raises(Exception, match="exactly one of the options 'subscribe' \\(alias 'topic'\\)"):
        spark.read.format("tidemq").option("namesrv", cluster.ns).load().collect()


# ---------------------------------------------------------------------------- writes


def test_write_then_read_back_and_missing_column_error(spark: Any, cluster: Cluster) -> None:
    topic = unique("SparkSink")
    cluster.create_topic(topic, queues=4)
    rows = [
        (topic, "TagW" if i % 3 else "TagX", f"wk-{i}", f"payload-{i}".encode(), {"n": str(i)})
        for i in range(300)
    ]
    df = spark.createDataFrame(
        rows, "topic string, tags string, keys string, body binary, properties map<string,string>"
    )
    df.write.format("tidemq").option("namesrv", cluster.ns).option("batchSize", "64").mode("append").save()

    back = read(spark, cluster, topic).collect()
    assert len(back) == 300
    got = {r.body.decode(): (r.tags, r.keys, r.properties) for r in back}
    assert got["payload-4"] == ("TagW", "wk-4", {"n": "4"})
    assert got["payload-9"] == ("TagX", "wk-9", {"n": "9"})
    assert len({r.queue_id for r in back}) > 1  # batches are spread over the queues

    # no topic column: the topic option names it; string bodies are sent as UTF-8, key arrays joined
    plain = spark.createDataFrame([("plain", ["k1", "k2"])], "body string, keys array<string>")
    plain.write.format("tidemq").option("namesrv", cluster.ns).option("topic", topic).mode("append").save()
    got_plain = read(spark, cluster, topic).filter("body = cast('plain' as binary)").collect()
    assert [(r.keys, r.tags, r.properties) for r in got_plain] == [("k1 k2", None, {})]

    bad = spark.createDataFrame([(topic, "x")], "topic string, payload string")
    with pytest.raises(Exception, match="no 'body' column"):
        bad.write.format("tidemq").option("namesrv", cluster.ns).mode("append").save()
    mistyped = spark.createDataFrame([(1, b"x")], "topic int, body binary")
    with pytest.raises(Exception, match="column 'topic' is int, expected string"):
        mistyped.write.format("tidemq").option("namesrv", cluster.ns).mode("append").save()


# ---------------------------------------------------------------------------- streaming


def test_streaming_restart_from_checkpoint_reads_each_message_once(
    spark: Any, cluster: Cluster, tmp_path: Path
) -> None:
    topic = unique("SparkStream")
    group = unique("SparkGroup")
    cluster.create_topic(topic, queues=3)
    cluster.produce(topic, 60)
    out, chk = tmp_path / "out", tmp_path / "chk"

    def run_once() -> None:
        stream = (
            spark.readStream.format("tidemq")
            .option("namesrv", cluster.ns)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "25")
            .option("consumerGroup", group)
            .load()
            .selectExpr("queue_id", "queue_offset", "msg_id", "cast(body as string) as body")
        )
        q = (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(chk))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination(120)
        assert q.exception() is None

    run_once()
    first = spark.read.parquet(str(out)).collect()
    assert len(first) == 60
    cluster.produce(topic, 45, start=60)
    run_once()  # same checkpoint: resumes at the stored offsets
    rows = spark.read.parquet(str(out)).collect()
    bodies = sorted(int(r.body.split("-")[1]) for r in rows)
    assert bodies == list(range(105))  # no gap, no duplicate
    assert len({(r.queue_id, r.queue_offset) for r in rows}) == 105
    batches = len(list((chk / "commits").iterdir()))
    assert batches >= 5  # maxOffsetsPerTrigger=25 split 105 messages into micro-batches

    # the streaming sink: copy the topic into another one, then read the copy back
    copy_topic = unique("SparkStreamCopy")
    cluster.create_topic(copy_topic, queues=2)
    q = (
        spark.readStream.format("tidemq")
        .option("namesrv", cluster.ns)
        .option("topic", topic)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(f"'{copy_topic}' as topic", "tags", "keys", "body", "properties")
        .writeStream.format("tidemq")
        .option("namesrv", cluster.ns)
        .option("checkpointLocation", str(tmp_path / "chk-copy"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    copied = read(spark, cluster, copy_topic).collect()
    assert sorted(r.body for r in copied) == sorted(f"body-{i}".encode() for i in range(105))
    assert {r.properties["color"] for r in copied} == {"blue"}

    # consumerGroup: Spark commits a batch's end offsets to the source when it plans the next
    # batch, so the group's offsets are those of the second-to-last batch in the offset log
    from tidemq_spark.client import TidemqSession
    from tidemq_spark.options import QueueKey

    last = max(int(f.name) for f in (chk / "offsets").iterdir() if f.name.isdigit())
    logged = json.loads((chk / "offsets" / str(last - 1)).read_text().splitlines()[-1])
    with TidemqSession(cluster.ns) as s:
        committed = {f"{BROKER}:{q}": s.committed_offset(QueueKey(topic, BROKER, q), group) for q in range(3)}
    assert committed == logged[topic]


# ---------------------------------------------------------------------------- offline store


def test_offline_store_reader_matches_live_read(spark: Any, cluster: Cluster, tmp_path: Path) -> None:
    topic = unique("SparkStore")
    cluster.create_topic(topic, queues=2)
    big = b"x" * 3000  # ~2 MB in total over 256 KiB CommitLog files
    with BlockingProducer(unique("PG"), cluster.ns, compress_over=4096) as p:
        for i in range(0, 700, 50):
            p.send_batch([Message(topic, big + b"-%d" % j, tags="S", keys=f"s{j}") for j in range(i, i + 50)])
        for j in range(700, 720):  # single sends over 4 KiB are stored zlib-compressed
            p.send(Message(topic, big * 4 + b"-%d" % j, tags="Z", keys=f"s{j}"))
    live = read(spark, cluster, topic)
    cols = [
        "topic",
        "queue_id",
        "queue_offset",
        "msg_id",
        "tags",
        "keys",
        "body",
        "born_timestamp",
        "store_timestamp",
    ]

    store = spark.read.format("tidemq-store").option("topic", topic).load(str(cluster.data_dir))
    files = sorted((cluster.data_dir / "commitlog").iterdir())
    assert len(files) >= 4 and store.rdd.getNumPartitions() == len(files)  # one partition per file
    assert store.count() == 720
    assert store.filter("tags = 'Z' and length(body) > 12000").count() == 20  # decompressed
    assert sorted(store.select(*cols).collect()) == sorted(live.select(*cols).collect())

    # every topic of the store: counts per (topic, queue) equal the broker's max offsets
    counts = {
        (r.topic, r.queue_id): r["count"]
        for r in spark.read.format("tidemq-store")
        .load(str(cluster.data_dir))
        .groupBy("topic", "queue_id")
        .count()
        .collect()
    }
    from tidemq_spark.client import TidemqSession
    from tidemq_spark.options import QueueKey

    with TidemqSession(cluster.ns) as s:
        mine = {k: n for k, n in counts.items() if k[0].startswith("Spark")}
        assert {(topic, 0), (topic, 1)} <= set(mine)
        for (t, q), n in mine.items():
            assert s.max_offset(QueueKey(t, BROKER, q)) == n, (t, q)

    # a corrupted body: CRC validation names the file and offset, or skips the record
    from tidemq.message import decode_message

    copy = tmp_path / "store"
    shutil.copytree(cluster.data_dir / "commitlog", copy / "commitlog")
    victim = sorted((copy / "commitlog").iterdir())[-2]
    data = bytearray(victim.read_bytes())
    pos = 0
    while (m := decode_message(data, pos)).topic != topic or m.store_size < 3000:
        pos += m.store_size
    data[pos + 200] ^= 0xFF  # inside the record's uncompressed 3000-byte body
    victim.write_bytes(bytes(data))
    n_all = spark.read.format("tidemq-store").load(str(copy)).count()
    checked = spark.read.format("tidemq-store").option("validateCrc", "true").load(str(copy))
    with pytest.raises(Exception, match=f"{victim.name} at file position {pos}"):
        checked.count()
    n_skip = (
        spark.read.format("tidemq-store")
        .option("validateCrc", "true")
        .option("ignoreCorruptRecords", "true")
        .load(str(copy))
        .count()
    )
    assert n_skip == n_all - 1


def test_offsets_the_broker_does_not_have_fail_or_are_skipped(cluster: Cluster, caplog: Any) -> None:
    from tidemq_spark import DataLossError
    from tidemq_spark.client import TidemqSession
    from tidemq_spark.options import QueueKey

    topic = unique("SparkLoss")
    cluster.create_topic(topic, queues=1)
    cluster.produce(topic, 5)
    key = QueueKey(topic, BROKER, 0)
    with TidemqSession(cluster.ns) as s:
        with pytest.raises(DataLossError, match=r"offsets \[5, 9\) of .* failOnDataLoss=false"):
            list(s.read_range(key, 0, 9, group="g"))
        got = [m.queue_offset for b in s.read_range(key, 0, 9, group="g", fail_on_data_loss=False) for m in b]
        assert got == [0, 1, 2, 3, 4]
        assert "no longer on the broker" in caplog.text


# ---------------------------------------------------------------------------- Kafka's options (issue 26)


def test_kafka_names_assign_offsets_by_timestamp_and_min_partitions(spark: Any, cluster: Cluster) -> None:
    topic = unique("SparkKafka")
    cluster.create_topic(topic, queues=4)
    cluster.produce(topic, 40)
    time.sleep(0.05)
    mid = int(time.time() * 1000)
    time.sleep(0.05)
    cluster.produce(topic, 40, start=40)
    q = [f"{BROKER}:{i}" for i in range(4)]

    def kafka(**options: str) -> Any:
        return spark.read.format("tidemq").option("namesrv", cluster.ns).options(**options).load()

    rows = kafka(subscribe=topic, minPartitions="8").collect()  # Kafka's name; minPartitions splits
    assert len(rows) == 80
    after = {(r.queue_id, r.queue_offset) for r in rows if int(r.properties["idx"]) >= 40}
    first_after = {i: min(o for qid, o in after if qid == i) for i in range(4)}
    per_queue = {i: sum(1 for r in rows if r.queue_id == i) for i in range(4)}
    assert kafka(subscribe=topic, minPartitions="8").rdd.getNumPartitions() == 8  # 4 queues x 2
    # maxRecordsPerPartition first, then minPartitions: 4 queues of ~20 in pieces of <= 5 -> >= 16
    capped = kafka(subscribe=topic, maxRecordsPerPartition="5", minPartitions="2").rdd.getNumPartitions()
    assert capped == sum(-(-n // 5) for n in per_queue.values())

    # assign: only the named queues, by name or by queue id on every broker
    got = kafka(assign=json.dumps({topic: [q[1], q[3]]})).select("queue_id").distinct().collect()
    assert sorted(r.queue_id for r in got) == [1, 3]
    assert kafka(assign=json.dumps({topic: [0]})).count() == per_queue[0]
    with pytest.raises(
        Exception, match=f"option assign names queue \\*:7 of topic '{topic}', which the topic route"
    ):
        kafka(assign=json.dumps({topic: [7]})).count()

    # per-queue timestamps: queue 0 starts and queue 1 ends at `mid`; the others use the offsets options
    by_ts = kafka(
        subscribe=topic,
        startingOffsetsByTimestamp=json.dumps({topic: {q[0]: mid}}),
        endingOffsetsByTimestamp=json.dumps({topic: {q[1]: mid}}),
        startingOffsets=json.dumps({topic: {q[2]: 1}}),
    ).collect()
    got_by_queue = {i: sorted(r.queue_offset for r in by_ts if r.queue_id == i) for i in range(4)}
    assert got_by_queue[0] == list(range(first_after[0], per_queue[0]))
    assert got_by_queue[1] == list(range(0, first_after[1]))
    assert got_by_queue[2] == list(range(1, per_queue[2]))
    assert got_by_queue[3] == list(range(0, per_queue[3]))
    # the global startingTimestamp wins over the per-queue one (Kafka's precedence)
    assert (
        kafka(
            subscribe=topic,
            startingTimestamp="0",
            startingOffsetsByTimestamp=json.dumps({topic: {q[0]: mid}}),
        ).count()
        == 80
    )
    # a timestamp after a queue's last message: error naming the queue, or that queue's latest offset
    future = json.dumps({topic: {q[2]: mid + 3_600_000}})
    with pytest.raises(Exception, match=f"{topic} {q[2]} has no message at or after timestamp"):
        kafka(subscribe=topic, startingOffsetsByTimestamp=future).count()
    latest = kafka(
        subscribe=topic, startingOffsetsByTimestamp=future, startingOffsetsByTimestampStrategy="latest"
    )
    assert latest.count() == 80 - per_queue[2]


def test_stream_reader_admission_control_and_latest_offset(cluster: Cluster) -> None:
    """minOffsetsPerTrigger / maxTriggerDelay / maxOffsetsPerTrigger / AvailableNow on the driver's
    stream reader against the broker (the calls Spark's engine makes, without a query)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadMaxRows

    from tidemq_spark.source import ReadMinRows, TidemqStreamReader
    from tidemq_spark.source_options import SourceOptions

    topic = unique("SparkAdmit")
    cluster.create_topic(topic, queues=2)

    def reader(**options: str) -> TidemqStreamReader:
        base = {"namesrv": cluster.ns, "subscribe": topic, "startingOffsets": "earliest"}
        return TidemqStreamReader(SourceOptions.parse({**base, **options}, streaming=True))

    def total(offsets: dict) -> int:
        return sum(offsets[topic].values())

    r = reader(minOffsetsPerTrigger="30", maxOffsetsPerTrigger="50", maxTriggerDelay="400ms")
    try:
        limit = r.getDefaultReadLimit()
        if ReadMinRows is not None:  # PySpark >= 4.3 carries the minimum in the engine's limit
            assert limit == ReadMinRows(30)
        start = r.initialOffset()
        cluster.produce(topic, 10)
        assert r.latestOffset(start, limit) == start  # 10 < 30: wait for more
        time.sleep(0.45)
        end = r.latestOffset(start, limit)  # maxTriggerDelay passed: the 10 go
        assert total(end) == 10
        cluster.produce(topic, 100, start=10)
        end2 = r.latestOffset(end, limit)  # 100 >= 30 at once, capped by maxOffsetsPerTrigger
        assert total(end2) == 60
        # the engine's ReadAllAvailable overrides the options; reportLatestOffset = the broker's max offsets
        assert total(r.latestOffset(end2, ReadAllAvailable())) == 110
        assert r.reportLatestOffset() == {topic: {f"{BROKER}:0": 55, f"{BROKER}:1": 55}}
        # an engine-given ReadMaxRows alone is respected
        assert 60 < total(r.latestOffset(end2, ReadMaxRows(7))) <= 67
    finally:
        r.stop()

    # Trigger.AvailableNow ignores minOffsetsPerTrigger (it would wait forever) but keeps the max
    r = reader(minOffsetsPerTrigger="100", maxOffsetsPerTrigger="100", maxTriggerDelay="1h")
    try:
        r.prepareForTriggerAvailableNow()
        cluster.produce(topic, 5, start=110)  # after the target: not read
        start = r.initialOffset()
        end = r.latestOffset(start, r.getDefaultReadLimit())
        assert total(end) == 100
        assert total(r.latestOffset(end, r.getDefaultReadLimit())) == 110  # 10 < 100, yet no wait
    finally:
        r.stop()

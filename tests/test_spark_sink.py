"""The ``tidemq`` sink in Kafka's terms: ``topic`` precedence, ``key`` -> queue (per-key order),
``partition``, ``headers``; and the client passthrough (ACL keys, TLS) against secured brokers.

The default run: rows to messages and queue choice (no Spark), the send path (``BatchSender``)
and one keyed Spark write against one in-process broker and one ``local[2]`` SparkSession
(``test_spark_source``'s module fixtures).  The other Spark writes (batch and streaming) and the
secured brokers (ACL, TLS; subprocesses) are ``slow``.
"""

from __future__ import annotations

import logging
import shutil
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest

from tidemq_spark.environment import spark_problem

_PROBLEM = spark_problem()
if _PROBLEM is not None:
    pytest.skip(_PROBLEM, allow_module_level=True)

import pyarrow as pa  # noqa: E402
import test_spark_source  # noqa: E402
from test_spark_source import Cluster, unique  # noqa: E402

from tidemq.client import MessageQueue  # noqa: E402
from tidemq_spark.client import TidemqSession  # noqa: E402
from tidemq_spark.options import TidemqSparkError  # noqa: E402
from tidemq_spark.sink import Outgoing, batch_messages, check_sink_schema, choose_queue, sink_columns  # noqa: E402
from tidemq_spark.sink_options import SinkOptions  # noqa: E402

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

#: The source tests' module-scoped fixtures: one broker and one SparkSession for this module too.
cluster = test_spark_source.cluster
spark = test_spark_source.spark

SECRET = "spark-secret-never-shown"


def java_queue(key: str, n: int) -> int:
    """RocketMQ's SelectMessageQueueByHash, written out independently: Java ``String.hashCode()``
    (UTF-16 units, int overflow), then ``abs(h) % n``."""
    h = 0
    data = key.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (h * 31 + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    if h >= 1 << 31:
        h -= 1 << 32
    return abs(h) % n


def arrow(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=schema)


def outgoing(rows: list[dict[str, Any]], schema: pa.Schema, **options: str) -> list[Outgoing]:
    opts = SinkOptions.parse({"namesrv": "h:1", **options})
    return list(batch_messages(arrow(rows, schema), tuple(schema.names), opts))


# ---------------------------------------------------------------------------- rows to messages (no Spark)


def test_java_hash_rule_matches_known_values() -> None:
    # "hello".hashCode() == 99162322; "Aa" and "BB" collide at 2112 in Java.
    assert java_queue("hello", 1 << 30) == 99162322
    assert java_queue("Aa", 7) == java_queue("BB", 7) == 2112 % 7


def test_the_topic_option_overrides_the_topic_column() -> None:
    schema = pa.schema([("topic", pa.string()), ("body", pa.binary())])
    rows = [{"topic": "FromColumn", "body": b"a"}, {"topic": None, "body": b"b"}]
    assert [o.message.topic for o in outgoing(rows, schema, topic="FromOption")] == ["FromOption"] * 2
    assert outgoing(rows[:1], schema)[0].message.topic == "FromColumn"
    with pytest.raises(TidemqSparkError, match="null topic and no 'topic' option"):
        outgoing(rows, schema)


def test_key_column_sets_the_shard_key_and_keys_unless_a_keys_column_is_given() -> None:
    schema = pa.schema([("key", pa.binary()), ("body", pa.string())])
    out = outgoing([{"key": b"order-1", "body": "x"}, {"key": None, "body": "y"}], schema, topic="T")
    assert (out[0].shard_key, out[0].message.keys, out[0].queue_id) == ("order-1", "order-1", None)
    assert (out[1].shard_key, out[1].message.keys) == (None, None)
    both = pa.schema([("key", pa.string()), ("keys", pa.string()), ("body", pa.string())])
    o = outgoing([{"key": "order-1", "keys": "idx-9", "body": "x"}], both, topic="T")[0]
    assert (o.shard_key, o.message.keys) == ("order-1", "idx-9")
    with pytest.raises(TidemqSparkError, match="the key of a row of topic 'T' is not UTF-8"):
        outgoing([{"key": b"\xff\xfe", "body": "x"}], schema, topic="T")


def test_headers_merge_under_properties_and_must_be_utf8() -> None:
    header = pa.struct([("key", pa.string()), ("value", pa.binary())])
    schema = pa.schema(
        [
            ("value", pa.binary()),
            ("headers", pa.list_(header)),
            ("properties", pa.map_(pa.string(), pa.string())),
        ]
    )
    row = {
        "value": b"v",
        "headers": [{"key": "trace", "value": b"t-1"}, {"key": "color", "value": b"red"}],
        "properties": [("color", "blue")],
    }
    msg = outgoing([row], schema, topic="T")[0].message
    assert msg.body == b"v" and msg.properties == {"trace": "t-1", "color": "blue"}
    bad = {**row, "headers": [{"key": "bin", "value": b"\x80"}]}
    with pytest.raises(TidemqSparkError, match="header 'bin' of a row of topic 'T' is not UTF-8"):
        outgoing([bad], schema, topic="T")


def test_choose_queue_by_partition_by_key_or_not_at_all() -> None:
    from tidemq.client import Message

    queues = [MessageQueue("T", b, q) for b in ("broker-a", "broker-b") for q in range(4)]
    msg = Message("T", b"x")
    assert choose_queue(Outgoing(msg), queues) is None
    assert choose_queue(Outgoing(msg, queue_id=5), queues) == MessageQueue("T", "broker-b", 1)
    for key in ("hello", "order-17", "Aa", "訂單-3", ""):
        assert choose_queue(Outgoing(msg, shard_key=key), queues) == queues[java_queue(key, 8)]
    with pytest.raises(
        TidemqSparkError, match=r"partition 8 is out of range for topic 'T', which has 8 write"
    ):
        choose_queue(Outgoing(msg, queue_id=8), queues)


def test_sink_schema_errors_name_the_column() -> None:
    from pyspark.sql import types as T

    def schema(**cols: Any) -> Any:
        return T.StructType([T.StructField(name, dt) for name, dt in cols.items()])

    opts = SinkOptions.parse({"namesrv": "h:1", "topic": "T"})
    body = T.BinaryType()
    with pytest.raises(
        TidemqSparkError, match="column 'headers' is array<string>, expected array<struct<key"
    ):
        check_sink_schema(schema(body=body, headers=T.ArrayType(T.StringType())), opts)
    with pytest.raises(TidemqSparkError, match="column 'partition' is string, expected integer or long"):
        check_sink_schema(schema(body=body, partition=T.StringType()), opts)
    with pytest.raises(TidemqSparkError, match="'partition' or as 'queueId', not both"):
        check_sink_schema(schema(body=body, partition=T.IntegerType(), queueId=T.IntegerType()), opts)
    with pytest.raises(TidemqSparkError, match="column 'key' is int, expected string or binary"):
        check_sink_schema(schema(body=body, key=T.IntegerType()), opts)
    header = T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])
    ok = schema(value=body, key=body, partition=T.LongType(), headers=T.ArrayType(header))
    check_sink_schema(ok, opts)
    assert sink_columns(ok) == ("value", "key", "partition", "headers")


# ---------------------------------------------------------------------------- Spark writes


def read_back(ns: str, topic: str, **client: Any) -> dict[int, list[Any]]:
    """Every message of ``topic`` by queue id, in queue order."""
    from tidemq_spark.client_options import ClientOptions

    out: dict[int, list[Any]] = {}
    with TidemqSession(ns, client=ClientOptions.parse(client)) as s:
        for key in s.queues(topic):
            msgs: list[Any] = []
            for chunk in s.read_range(key, s.min_offset(key), s.max_offset(key), group="sink-test"):
                msgs.extend(chunk)
            out[key.queue_id] = msgs
    return out


def test_batch_sender_puts_each_key_on_its_queue_in_order_without_spark(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The sink's send path (batch_messages -> choose_queue -> BatchSender) against a real broker,
    signing with keys (this broker checks none) and never logging the secret."""
    from tidemq_spark.client import BatchSender
    from tidemq_spark.client_options import ClientOptions

    caplog.set_level(logging.DEBUG)
    keys = ClientOptions.parse({"accessKey": "spark-ak", "secretKey": SECRET})

    topic = unique("SenderKeyed")
    cluster.create_topic(topic, queues=4)
    schema = pa.schema([("key", pa.string()), ("body", pa.string())])
    rows = [{"key": f"k{i % 9}", "body": str(i)} for i in range(400)]
    opts = SinkOptions.parse({"namesrv": cluster.ns, "topic": topic, "batchSize": "8", "maxInFlight": "16"})
    sender = BatchSender(cluster.ns, "sender-test", batch_size=8, max_in_flight=16, client=keys)
    try:
        for out in batch_messages(arrow(rows, schema), tuple(schema.names), opts):
            sender.add(out.message, choose_queue(out, sender.write_queues(topic)))
        assert sender.flush() == 400
    finally:
        sender.close()
    by_queue = read_back(cluster.ns, topic, accessKey="spark-ak", secretKey=SECRET)
    assert SECRET not in caplog.text
    for qid, msgs in by_queue.items():
        for key in {m.keys[0] for m in msgs}:
            assert java_queue(key, 4) == qid
            mine = [int(m.body) for m in msgs if m.keys[0] == key]
            assert mine == sorted(mine) and len(mine) == sum(1 for r in rows if r["key"] == key)


def write(df: Any, ns: str, **options: str) -> None:
    df.write.format("tidemq").option("namesrv", ns).options(**options).mode("append").save()


@pytest.mark.slow
def test_spark_write_topic_precedence_both_ways(spark: Any, cluster: Cluster) -> None:
    a, b = unique("SinkColumn"), unique("SinkOption")
    cluster.create_topic(a, queues=1)
    cluster.create_topic(b, queues=1)
    df = spark.createDataFrame([(a, f"r{i}") for i in range(5)], "topic string, body string")
    write(df, cluster.ns, topic=b)  # the option wins over the column (Kafka's rule)
    write(df, cluster.ns)  # without the option, the column names the topic
    assert [len(v) for v in read_back(cluster.ns, a).values()] == [5]
    assert [len(v) for v in read_back(cluster.ns, b).values()] == [5]


# The default run covers the keyed path with BatchSender against the broker (no Spark).
@pytest.mark.slow
def test_spark_write_by_key_keeps_each_key_on_its_java_queue_in_order(spark: Any, cluster: Cluster) -> None:
    topic = unique("SinkKeyed")
    cluster.create_topic(topic, queues=4)
    df = spark.range(0, 600, 1, numPartitions=2).selectExpr(
        "concat('order-', cast(id % 13 as string)) as key",
        "concat(cast(spark_partition_id() as string), ':', cast(id as string)) as body",
    )
    write(df, cluster.ns, topic=topic, batchSize="16", maxInFlight="8")
    by_queue = read_back(cluster.ns, topic)
    assert sum(len(v) for v in by_queue.values()) == 600
    seen: dict[str, set[int]] = defaultdict(set)
    order: dict[tuple[str, str], list[int]] = defaultdict(list)
    for qid, msgs in by_queue.items():
        for m in msgs:
            key = m.keys[0]
            seen[key].add(qid)
            task, row = m.body.decode().split(":")
            order[(key, task)].append(int(row))
    assert len(seen) == 13
    for key, qids in seen.items():
        assert qids == {java_queue(key, 4)}, key  # one queue per key: the one a Java producer picks
    for rows in order.values():
        assert rows == sorted(rows)  # a key's rows keep the DataFrame's order within a task
    assert len({q for qs in seen.values() for q in qs}) > 1


@pytest.mark.slow
def test_spark_write_partition_column_and_out_of_range(spark: Any, cluster: Cluster) -> None:
    topic = unique("SinkPartition")
    cluster.create_topic(topic, queues=3)
    # One task: order is kept within a task only (across tasks there is none, as in Kafka).
    df = spark.createDataFrame([(i % 3, f"p{i}") for i in range(30)], "partition int, body string").coalesce(
        1
    )
    write(df, cluster.ns, topic=topic)
    by_queue = read_back(cluster.ns, topic)
    for qid in range(3):
        assert [m.body.decode() for m in by_queue[qid]] == [f"p{i}" for i in range(30) if i % 3 == qid]
    bad = spark.createDataFrame([(3, "x")], "queueId int, body string")
    with pytest.raises(
        Exception, match=r"partition 3 is out of range for topic '[^']+', which has 3 write queues"
    ):
        write(bad, cluster.ns, topic=topic)


@pytest.mark.slow
def test_spark_write_headers_and_properties(spark: Any, cluster: Cluster) -> None:
    topic = unique("SinkHeaders")
    cluster.create_topic(topic, queues=1)
    df = spark.sql(
        "select 'h' as body, array(named_struct('key', 'trace', 'value', cast('t-1' as binary)),"
        " named_struct('key', 'color', 'value', cast('red' as binary))) as headers,"
        " map('color', 'blue') as properties"
    )
    write(df, cluster.ns, topic=topic)
    (msg,) = read_back(cluster.ns, topic)[0]
    assert msg.properties["trace"] == "t-1" and msg.properties["color"] == "blue"


@pytest.mark.slow
def test_streaming_write_by_key_with_kafka_columns(spark: Any, cluster: Cluster, tmp_path: Any) -> None:
    source, target = unique("SinkStreamIn"), unique("SinkStreamOut")
    cluster.create_topic(source, queues=2)
    cluster.create_topic(target, queues=4)
    cluster.produce(source, 60)  # properties idx=0..59
    q = (
        spark.readStream.format("tidemq")
        .option("namesrv", cluster.ns)
        .option("topic", source)
        .option("startingOffsets", "earliest")
        .load()
        .selectExpr(
            "concat('acct-', cast(cast(properties['idx'] as int) % 7 as string)) as key",
            "body as value",
            "array(named_struct('key', 'idx', 'value', cast(properties['idx'] as binary))) as headers",
            "'ignored' as topic",  # the topic option wins
        )
        .writeStream.format("tidemq")
        .option("namesrv", cluster.ns)
        .option("topic", target)
        .option("checkpointLocation", str(tmp_path / "chk"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    by_queue = read_back(cluster.ns, target)
    assert sum(len(v) for v in by_queue.values()) == 60
    for qid, msgs in by_queue.items():
        for m in msgs:
            assert java_queue(m.keys[0], 4) == qid
            assert int(m.properties["idx"]) % 7 == int(m.keys[0].split("-")[1])


# ---------------------------------------------------------------------------- secured brokers (slow)

ACL = """\
globalWhiteRemoteAddresses:
accounts:
  - accessKey: spark-ak
    secretKey: spark-secret-never-shown
    defaultTopicPerm: PUB|SUB
    defaultGroupPerm: PUB|SUB
  - accessKey: admin-ak
    secretKey: admin-secret
    admin: true
"""


@pytest.fixture(scope="module")
def acl_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from test_acl_broker import AclCluster

    c = AclCluster(tmp_path_factory.mktemp("spark-acl"), ACL)
    try:
        yield c
    finally:
        c.stop()


def _one_line_error(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if "TidemqSparkError:" in line]
    assert lines, str(exc)[-2000:]
    return lines[-1]


@pytest.mark.slow
def test_acl_broker_read_and_write_with_keys_and_one_clear_error_without(
    spark: Any, acl_cluster: Any
) -> None:
    topic = unique("SparkAcl")
    out = acl_cluster.admin(
        "updateTopic", "-t", topic, "-r", "2", "-w", "2", "-b", acl_cluster.broker,
        "--access-key", "admin-ak", "--secret-key", "admin-secret",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    ns = acl_cluster.namesrv
    keys = {"accessKey": "spark-ak", "secretKey": SECRET}
    df = spark.createDataFrame([(f"k{i}", f"acl-{i}") for i in range(20)], "key string, body string")
    write(df, ns, topic=topic, **keys)
    got = spark.read.format("tidemq").option("namesrv", ns).option("topic", topic).options(**keys).load()
    assert sorted(r.body.decode() for r in got.collect()) == sorted(f"acl-{i}" for i in range(20))

    wrong = {"access.key": "spark-ak", "secret.key": "not-the-secret"}
    for options, who in (({}, "no accessKey/secretKey options"), (wrong, "access key 'spark-ak'")):
        with pytest.raises(Exception) as err:
            spark.read.format("tidemq").option("namesrv", ns).option("topic", topic).options(
                **options
            ).load().count()
        line = _one_line_error(err.value)
        assert "refused" in line and who in line and "check the accessKey/secretKey options" in line
        with pytest.raises(Exception) as err:
            write(df, ns, topic=topic, **options)
        line = _one_line_error(err.value)
        assert "refused SEND_BATCH_MESSAGE" in line and who in line
        assert SECRET not in str(err.value) and "not-the-secret" not in str(err.value)


@pytest.fixture(scope="module")
def tls_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    from test_tls_e2e import TlsCluster

    c = TlsCluster(tmp_path_factory.mktemp("spark-tls"))
    try:
        yield c
    finally:
        c.stop()


@pytest.mark.slow
def test_tls_only_broker_write_and_read(spark: Any, tls_cluster: Any) -> None:
    topic = unique("SparkTls")
    c = tls_cluster
    tls = {
        "tls": "true",
        "tls.cafile": str(c.ca[0]),
        "tls.certfile": str(c.client_cert[0]),
        "tls.keyfile": str(c.client_cert[1]),
        "tls.checkHostname": "true",
    }
    df = spark.createDataFrame([(f"tls-{i}",) for i in range(12)], "body string")
    write(df, c.namesrv, topic=topic, **tls)
    got = (
        spark.read.format("tidemq").option("namesrv", c.namesrv).option("topic", topic).options(**tls).load()
    )
    assert sorted(r.body.decode() for r in got.collect()) == sorted(f"tls-{i}" for i in range(12))
    assert sum(len(v) for v in read_back(c.namesrv, topic, **tls).values()) == 12
    plain = spark.read.format("tidemq").option("namesrv", c.namesrv).option("topic", topic)
    with pytest.raises(Exception, match="topic|NameServer|connect|timeout|closed"):  # no TLS: no answer
        plain.option("timeoutMs", "2000").load().count()

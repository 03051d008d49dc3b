"""The ``tidemq`` sink: DataFrame rows to messages, sent in SEND_BATCH_MESSAGE batches (at least once)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import attrs
from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    ByteType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
)

from tidemq.client import Message, MessageQueue, select_by_hash

from .client import BatchSender
from .options import TidemqSparkError
from .sink_options import SinkOptions

try:  # PySpark >= 4.1: streaming sink fed with Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # pragma: no cover
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase  # type: ignore[assignment,unused-ignore]

    _STREAM_ARROW = False

log = logging.getLogger(__name__)

#: Column -> the Spark types it may have (Kafka's names where Kafka has the concept).
_SINK_COLUMNS: dict[str, tuple[type, ...]] = {
    "topic": (StringType,),
    "tags": (StringType,),
    "keys": (StringType, ArrayType),
    "key": (StringType, BinaryType),
    "partition": (IntegerType, LongType, ShortType, ByteType),
    "queueId": (IntegerType, LongType, ShortType, ByteType),
    "body": (BinaryType, StringType),
    "value": (BinaryType, StringType),
    "properties": (MapType,),
    "headers": (ArrayType,),
}
_HEADERS = "array<struct<key:string,value:binary>>"


def _type_name(types: tuple[type, ...]) -> str:
    return " or ".join(t.__name__.replace("Type", "").lower() for t in types)


def _headers_ok(dt: Any) -> bool:
    if not isinstance(dt, ArrayType) or not isinstance(dt.elementType, StructType):
        return False
    fields = {f.name: f.dataType for f in dt.elementType.fields}
    return (
        set(fields) == {"key", "value"}
        and isinstance(fields["key"], StringType)
        and isinstance(fields["value"], (BinaryType, StringType))
    )


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Raise a one-line error naming the first missing or mistyped column."""
    fields = {f.name: f for f in schema.fields}
    have = ", ".join(fields) or "none"
    if "body" not in fields and "value" not in fields:
        raise TidemqSparkError(
            f"tidemq sink: the DataFrame has no 'body' column (nor Kafka's 'value'; columns: {have})"
        )
    if "body" in fields and "value" in fields:
        raise TidemqSparkError("tidemq sink: give the message body as 'body' or as 'value', not both")
    if "partition" in fields and "queueId" in fields:
        raise TidemqSparkError("tidemq sink: give the queue as 'partition' or as 'queueId', not both")
    if "topic" not in fields and not opts.topic:
        raise TidemqSparkError(
            f"tidemq sink: the DataFrame has no 'topic' column and no 'topic' option was given (columns: {have})"
        )
    for name, types in _SINK_COLUMNS.items():
        f = fields.get(name)
        if f is not None and not isinstance(f.dataType, types):
            expected = _HEADERS if name == "headers" else _type_name(types)
            raise TidemqSparkError(
                f"tidemq sink: column {name!r} is {f.dataType.simpleString()}, expected {expected}"
            )
    props = fields.get("properties")
    if props is not None and not (
        isinstance(props.dataType, MapType)
        and isinstance(props.dataType.keyType, StringType)
        and isinstance(props.dataType.valueType, StringType)
    ):
        raise TidemqSparkError(
            f"tidemq sink: column 'properties' is {props.dataType.simpleString()}, expected map<string,string>"
        )
    headers = fields.get("headers")
    if headers is not None and not _headers_ok(headers.dataType):
        raise TidemqSparkError(
            f"tidemq sink: column 'headers' is {headers.dataType.simpleString()}, expected {_HEADERS}"
        )


@dataclass
class SentCount(WriterCommitMessage):
    messages: int


@attrs.frozen
class Outgoing:
    """One row as it is sent: the message, and where it goes.

    ``queue_id`` (the ``partition`` column) indexes the topic's write queues; ``shard_key``
    (the ``key`` column) picks a queue by RocketMQ's ``SelectMessageQueueByHash``.  With neither,
    the producer picks (round robin over the brokers).
    """

    message: Message
    queue_id: int | None = None
    shard_key: str | None = None


def choose_queue(outgoing: Outgoing, write_queues: list[MessageQueue]) -> MessageQueue | None:
    """The queue ``outgoing`` must go to, or None for the producer's own selection.

    ``write_queues`` are the topic's writable queues in RocketMQ's order (brokers by name, then
    queue ids), as ``Producer.publish_queues`` and Java's TopicPublishInfo list them, so a key
    lands on the queue a Java producer's ``SelectMessageQueueByHash`` picks for it:
    ``abs(key.hashCode()) % len(write_queues)``.
    """
    if outgoing.queue_id is None and outgoing.shard_key is None:
        return None
    topic = outgoing.message.topic
    if not write_queues:
        raise TidemqSparkError(f"tidemq sink: topic {topic!r} has no writable queue")
    if outgoing.queue_id is not None:
        n = len(write_queues)
        if not 0 <= outgoing.queue_id < n:
            raise TidemqSparkError(
                f"tidemq sink: partition {outgoing.queue_id} is out of range for topic {topic!r}, "
                f"which has {n} write queues (partition 0..{n - 1})"
            )
        return write_queues[outgoing.queue_id]
    return select_by_hash(write_queues, outgoing.message, outgoing.shard_key)


def _text(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    try:
        return bytes(value).decode()
    except UnicodeDecodeError:
        raise TidemqSparkError(
            f"tidemq sink: {what} is not UTF-8 (RocketMQ keys and properties are strings)"
        ) from None


def _properties(props: Any, headers: Any, topic: str) -> dict[str, str]:
    """Kafka-style ``headers`` (values decoded as UTF-8) merged under the ``properties`` map."""
    out: dict[str, str] = {}
    for h in headers or ():
        if h is None or h.get("key") is None or h.get("value") is None:
            continue  # RocketMQ properties have no null values
        out[h["key"]] = _text(h["value"], f"header {h['key']!r} of a row of topic {topic!r}")
    if props:
        out.update(props)
    return out


def batch_messages(batch: Any, columns: tuple[str, ...], opts: SinkOptions) -> Iterator[Outgoing]:
    """The :class:`Outgoing` of each row of one Arrow record batch, in row order.

    The sink's one place that turns rows into what is sent: the at-least-once and the
    exactly-once writers both send what this yields (placed with :func:`choose_queue`).
    The ``topic`` option overrides the ``topic`` column (Kafka's rule).
    """
    cols = {n: batch.column(n).to_pylist() for n in columns if n in batch.schema.names}
    n = batch.num_rows
    none = [None] * n
    topics = none if opts.topic else cols.get("topic", none)
    tags, keys, key_col = cols.get("tags", none), cols.get("keys", none), cols.get("key", none)
    bodies = cols["body"] if "body" in cols else cols["value"]
    props, headers = cols.get("properties", none), cols.get("headers", none)
    queue_ids = cols.get("partition") or cols.get("queueId") or none
    for i in range(n):
        topic = topics[i] or opts.topic
        if not topic:
            raise TidemqSparkError("tidemq sink: a row has a null topic and no 'topic' option was given")
        body = bodies[i]
        if body is None:
            raise TidemqSparkError(f"tidemq sink: a row of topic {topic!r} has a null body")
        if isinstance(body, str):
            body = body.encode()
        key = key_col[i]
        if key is not None:
            key = _text(key, f"the key of a row of topic {topic!r}")
        p, h = props[i], headers[i]
        yield Outgoing(
            Message(
                topic,
                body,
                tags=tags[i] or None,
                keys=keys[i] or key or None,
                properties=_properties(p, h, topic) if (p or h) else {},
            ),
            queue_ids[i],
            key,
        )


def sink_columns(schema: StructType) -> tuple[str, ...]:
    """The columns of ``schema`` the sink reads."""
    return tuple(f.name for f in schema.fields if f.name in _SINK_COLUMNS)


class _Sink:
    opts: SinkOptions
    columns: tuple[str, ...]

    def _write_batches(self, batches: Iterator[Any]) -> SentCount:
        o = self.opts
        sender = BatchSender(
            o.namesrv,
            o.producer_group,
            batch_size=o.batch_size,
            max_batch_bytes=o.max_batch_bytes,
            max_in_flight=o.max_in_flight,
            timeout_s=o.timeout_s,
            client=o.client,
        )
        try:
            for batch in batches:
                for out in batch_messages(batch, self.columns, o):
                    queue = None
                    if out.queue_id is not None or out.shard_key is not None:
                        queue = choose_queue(out, sender.write_queues(out.message.topic))
                    sender.add(out.message, queue)
            return SentCount(sender.flush())
        finally:
            sender.close()


class TidemqWriter(_Sink, DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, opts)
        self.opts = opts
        self.columns = sink_columns(schema)

    def write(self, iterator: Iterator[Any]) -> SentCount:
        return self._write_batches(iterator)

    def commit(self, messages: list[Any]) -> None:
        log.info("tidemq sink: %d messages sent", sum(m.messages for m in messages if m))


class TidemqStreamWriter(_Sink, _StreamWriterBase):
    """At-least-once streaming sink: a failed micro-batch is re-sent whole."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, opts)
        self.opts = opts
        self.columns = sink_columns(schema)

    def write(self, iterator: Iterator[Any]) -> SentCount:
        if _STREAM_ARROW:
            return self._write_batches(iterator)
        return self._write_batches(_rows_to_batches(iterator, self.columns))  # pragma: no cover

    def commit(self, messages: list[Any], batchId: int) -> None:
        log.info("tidemq sink: batch %d, %d messages sent", batchId, sum(m.messages for m in messages if m))

    def abort(self, messages: list[Any], batchId: int) -> None:
        log.warning("tidemq sink: batch %d aborted; Spark re-runs it (messages may repeat)", batchId)


def _rows_to_batches(rows: Iterator[Any], columns: tuple[str, ...]) -> Iterator[Any]:  # pragma: no cover
    import pyarrow as pa

    chunk: list[Any] = []
    for row in rows:
        chunk.append(row.asDict())
        if len(chunk) >= 1024:
            yield pa.RecordBatch.from_pylist([{c: r.get(c) for c in columns} for r in chunk])
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist([{c: r.get(c) for c in columns} for r in chunk])

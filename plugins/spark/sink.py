"""The ``tidemq`` sink: DataFrame rows to messages, sent in SEND_BATCH_MESSAGE batches (at least once)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from .client import BatchSender
from .options import TidemqSparkError
from .sink_options import SinkOptions

try:  # PySpark >= 4.1: streaming sink fed with Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # pragma: no cover
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase  # type: ignore[assignment]

    _STREAM_ARROW = False

log = logging.getLogger(__name__)


_SINK_COLUMNS = {
    "topic": (StringType,),
    "tags": (StringType,),
    "keys": (StringType, ArrayType),
    "body": (BinaryType, StringType),
    "properties": (MapType,),
}


def check_sink_schema(schema: StructType, opts: SinkOptions) -> None:
    """Raise a one-line error naming the first missing or mistyped column."""
    fields = {f.name: f for f in schema.fields}
    have = ", ".join(fields) or "none"
    if "body" not in fields:
        raise TidemqSparkError(f"tidemq sink: the DataFrame has no 'body' column (columns: {have})")
    if "topic" not in fields and not opts.topic:
        raise TidemqSparkError(
            f"tidemq sink: the DataFrame has no 'topic' column and no 'topic' option was given (columns: {have})"
        )
    for name, types in _SINK_COLUMNS.items():
        f = fields.get(name)
        if f is not None and not isinstance(f.dataType, types):
            allowed = " or ".join(t.__name__.replace("Type", "").lower() for t in types)
            raise TidemqSparkError(
                f"tidemq sink: column {name!r} is {f.dataType.simpleString()}, expected {allowed}"
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


@dataclass
class SentCount(WriterCommitMessage):
    messages: int


def batch_messages(batch: Any, columns: tuple[str, ...], opts: SinkOptions) -> Iterator[Any]:
    """The :class:`tidemq.client.Message` of each row of one Arrow record batch, in row order.

    The sink's one place that turns rows into messages: the at-least-once and the
    exactly-once writers both send what this yields.
    """
    from tidemq.client import Message

    cols = {n: batch.column(n).to_pylist() for n in columns if n in batch.schema.names}
    n = batch.num_rows
    none = [None] * n
    topics, tags, keys = cols.get("topic", none), cols.get("tags", none), cols.get("keys", none)
    bodies, props = cols["body"], cols.get("properties", none)
    for i in range(n):
        topic = topics[i] or opts.topic
        if not topic:
            raise TidemqSparkError("tidemq sink: a row has a null topic and no 'topic' option was given")
        body = bodies[i]
        if body is None:
            raise TidemqSparkError(f"tidemq sink: a row of topic {topic!r} has a null body")
        if isinstance(body, str):
            body = body.encode()
        p = props[i]
        yield Message(
            topic,
            body,
            tags=tags[i] or None,
            keys=keys[i] or None,
            properties=dict(p) if p else {},
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
                for msg in batch_messages(batch, self.columns, o):
                    sender.add(msg)
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

"""PySpark Python data sources: ``tidemq`` (live topics: batch/stream read and write) and
``tidemq-store`` (offline CommitLog files).

Driver-side objects (readers planning partitions, stream readers tracking offsets) talk to the
NameServer and brokers through :class:`~tidemq_spark.client.TidemqSession`; partitions are plain
dataclasses (queue, broker address, offset range) pickled to the executors, whose ``read`` pulls
the range with tidemq's client API and yields Arrow record batches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

from tidemq.errors import CorruptDataError

from .client import BatchSender, TidemqSession
from .commitlog import CommitLogFile, CorruptRecordError, iter_file, list_files
from .options import (
    EARLIEST,
    LATEST,
    Offsets,
    QueueKey,
    SinkOptions,
    SourceOptions,
    TidemqSparkError,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)
from .schema import BatchBuilder, arrow_schema, spark_schema

try:  # PySpark >= 4.2: admission control (maxOffsetsPerTrigger) and Trigger.AvailableNow
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older PySpark 4.x
    ReadAllAvailable = ReadMaxRows = ReadLimit = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


try:  # PySpark >= 4.1: streaming sink fed with Arrow batches
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    _STREAM_ARROW = True
except ImportError:  # pragma: no cover
    from pyspark.sql.datasource import DataSourceStreamWriter as _StreamWriterBase  # type: ignore[assignment]

    _STREAM_ARROW = False

log = logging.getLogger(__name__)

#: Rows per Arrow batch handed to Spark.
ARROW_BATCH_ROWS = 4096


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark partition: ConsumeQueue offsets ``[start, end)`` of one queue."""

    topic: str
    broker: str
    queue_id: int
    address: str
    start: int
    end: int

    @property
    def key(self) -> QueueKey:
        return QueueKey(self.topic, self.broker, self.queue_id)


@dataclass(frozen=True)
class StoreFilePartition(InputPartition):
    """One Spark partition of the offline reader: one CommitLog file."""

    path: str
    base_offset: int
    size: int


def register(spark: Any) -> None:
    """Register the ``tidemq`` and ``tidemq-store`` data sources with a SparkSession."""
    spark.dataSource.register(TidemqDataSource)
    spark.dataSource.register(TidemqStoreDataSource)


# ---------------------------------------------------------------------------- reading live topics


class _RangeReader:
    """What batch and stream readers share: planning ranges and pulling them on executors."""

    opts: SourceOptions

    def _read_range(self, part: QueueRange) -> Iterator[Any]:
        o = self.opts
        builder = BatchBuilder(arrow_schema(), part.broker)
        with TidemqSession(o.namesrv, o.timeout_s) as session:
            for msgs in session.read_range(
                part.key,
                part.start,
                part.end,
                group=o.consumer_group,
                expression=o.filter,
                expression_type=o.filter_type,
                batch=o.pull_batch_size,
                fail_on_data_loss=o.fail_on_data_loss,
                address=part.address,
            ):
                builder.add_all(msgs)
                if len(builder) >= ARROW_BATCH_ROWS:
                    yield builder.flush()
        if len(builder):
            yield builder.flush()

    def _split(self, session: TidemqSession, key: QueueKey, start: int, end: int) -> list[QueueRange]:
        if end <= start:
            return []
        addr = session.address(key)
        step = self.opts.max_records_per_partition or (end - start)
        return [
            QueueRange(key.topic, key.broker, key.queue_id, addr, s, min(s + step, end))
            for s in range(start, end, step)
        ]

    def _topics(self, session: TidemqSession) -> list[str]:
        topics = session.resolve_topics(self.opts.topics, self.opts.topic_pattern)
        if not topics and self.opts.topic_pattern is None:
            raise TidemqSparkError("no topic to read")
        return topics

    def _all_queues(self, session: TidemqSession) -> list[QueueKey]:
        return [q for t in self._topics(session) for q in session.queues(t)]

    def _resolve(
        self, session: TidemqSession, key: QueueKey, spec: str | Offsets, timestamp: int | None, default: int
    ) -> int:
        """A start/end spec for one queue as a concrete offset."""
        if timestamp is not None:
            return session.search_offset(key, timestamp)
        if spec == "committed":
            committed = session.committed_offset(key, self.opts.consumer_group)
            return committed if committed >= 0 else session.min_offset(key)
        if isinstance(spec, dict):
            value = spec.get(key, default)
        else:
            value = EARLIEST if spec == "earliest" else LATEST
        if value == EARLIEST:
            return session.min_offset(key)
        if value == LATEST:
            return session.max_offset(key)
        return value

    def _check_named(self, spec: str | Offsets, queues: Sequence[QueueKey], what: str) -> None:
        if isinstance(spec, dict):
            unknown = sorted(set(spec) - set(queues))
            if unknown:
                k = unknown[0]
                raise TidemqSparkError(
                    f"{what} names queue {k.name} of topic {k.topic!r}, which the topic route does not have"
                )


class TidemqBatchReader(_RangeReader, DataSourceReader):
    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> Sequence[InputPartition]:
        o = self.opts
        out: list[QueueRange] = []
        with TidemqSession(o.namesrv, o.timeout_s) as session:
            queues = self._all_queues(session)
            self._check_named(o.starting, queues, "startingOffsets")
            self._check_named(o.ending, queues, "endingOffsets")
            for key in queues:
                start = self._resolve(session, key, o.starting, o.starting_timestamp, EARLIEST)
                end = self._resolve(session, key, o.ending, o.ending_timestamp, LATEST)
                if end < start:
                    raise TidemqSparkError(
                        f"ending offset {end} of {key.topic} {key.name} is before its starting offset {start}"
                    )
                out.extend(self._split(session, key, start, end))
        log.info("tidemq batch read: %d partitions, %d offsets", len(out), sum(p.end - p.start for p in out))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRange):  # Spark reads one placeholder when planning found none
            return iter(())
        return self._read_range(partition)


class TidemqStreamReader(_RangeReader, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch source: offsets are ``{topic: {"broker:queueId": next offset}}``."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._session: TidemqSession | None = None
        self._target: Offsets | None = None
        self._last_end: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The reader is pickled to executors for read(); the driver's connection stays behind.
        state = dict(self.__dict__)
        state["_session"] = None
        return state

    @property
    def session(self) -> TidemqSession:
        if self._session is None:
            self._session = TidemqSession(self.opts.namesrv, self.opts.timeout_s)
        return self._session

    def _latest(self) -> Offsets:
        return {k: self.session.max_offset(k) for k in self._all_queues(self.session)}

    def initialOffset(self) -> dict:
        o = self.opts
        queues = self._all_queues(self.session)
        self._check_named(o.starting, queues, "startingOffsets")
        start = {
            k: self._resolve(self.session, k, o.starting, o.starting_timestamp, EARLIEST) for k in queues
        }
        return offsets_to_json(start)

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(self, start: dict | None = None, limit: Any = None) -> dict:
        if start is None:  # PySpark < 4.2 calls latestOffset() without arguments
            begin = (
                self._last_end
                if self._last_end is not None
                else offsets_from_json(self.initialOffset(), "start")
            )
            max_rows = self.opts.max_offsets_per_trigger
        else:
            begin = offsets_from_json(start, "start offset")
            max_rows = limit.max_rows if ReadMaxRows is not None and isinstance(limit, ReadMaxRows) else None
        latest = self._latest()
        if self._target is not None:
            latest = {k: min(v, self._target.get(k, begin.get(k, 0))) for k, v in latest.items()}
        end = dict(begin)
        for k, v in latest.items():
            end[k] = max(v, begin.get(k, 0))  # new queues start at 0; offsets never go back
        if max_rows:
            end = rate_limit(begin, end, max_rows)
        return offsets_to_json(end)

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = offsets_from_json(start, "start offset")
        stop = offsets_from_json(end, "end offset")
        self._last_end = stop
        out: list[QueueRange] = []
        for key in sorted(stop):
            out.extend(self._split(self.session, key, begin.get(key, 0), stop[key]))
        return out

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRange):  # Spark reads one placeholder when planning found none
            return iter(())
        return self._read_range(partition)

    def commit(self, end: dict) -> None:
        stop = offsets_from_json(end, "committed offset")
        self._last_end = stop
        if not self.opts.commit_offsets:
            return
        for key, offset in stop.items():
            try:
                self.session.commit_offset(key, self.opts.consumer_group, offset)
            except Exception as exc:  # the checkpoint is the source of truth; the group offset is advisory
                log.warning(
                    "committing %s %s = %d for group %s failed: %s",
                    key.topic,
                    key.name,
                    offset,
                    self.opts.consumer_group,
                    exc,
                )

    def stop(self) -> None:
        if self._session is not None:
            self._session.close()
            self._session = None


# ---------------------------------------------------------------------------- writing


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


class _Sink:
    opts: SinkOptions
    columns: tuple[str, ...]

    def _write_batches(self, batches: Iterator[Any]) -> SentCount:
        from tidemq.client import Message

        o = self.opts
        sender = BatchSender(
            o.namesrv,
            o.producer_group,
            batch_size=o.batch_size,
            max_batch_bytes=o.max_batch_bytes,
            max_in_flight=o.max_in_flight,
            timeout_s=o.timeout_s,
        )
        try:
            for batch in batches:
                cols = {n: batch.column(n).to_pylist() for n in self.columns if n in batch.schema.names}
                n = batch.num_rows
                none = [None] * n
                topics, tags, keys = cols.get("topic", none), cols.get("tags", none), cols.get("keys", none)
                bodies, props = cols["body"], cols.get("properties", none)
                for i in range(n):
                    topic = topics[i] or o.topic
                    if not topic:
                        raise TidemqSparkError(
                            "tidemq sink: a row has a null topic and no 'topic' option was given"
                        )
                    body = bodies[i]
                    if body is None:
                        raise TidemqSparkError(f"tidemq sink: a row of topic {topic!r} has a null body")
                    if isinstance(body, str):
                        body = body.encode()
                    p = props[i]
                    sender.add(
                        Message(
                            topic,
                            body,
                            tags=tags[i] or None,
                            keys=keys[i] or None,
                            properties=dict(p) if p else {},
                        )
                    )
            return SentCount(sender.flush())
        finally:
            sender.close()


class TidemqWriter(_Sink, DataSourceArrowWriter):
    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, opts)
        self.opts = opts
        self.columns = tuple(f.name for f in schema.fields if f.name in _SINK_COLUMNS)

    def write(self, iterator: Iterator[Any]) -> SentCount:
        return self._write_batches(iterator)

    def commit(self, messages: list[Any]) -> None:
        log.info("tidemq sink: %d messages sent", sum(m.messages for m in messages if m))


class TidemqStreamWriter(_Sink, _StreamWriterBase):
    """At-least-once streaming sink: a failed micro-batch is re-sent whole."""

    def __init__(self, opts: SinkOptions, schema: StructType) -> None:
        check_sink_schema(schema, opts)
        self.opts = opts
        self.columns = tuple(f.name for f in schema.fields if f.name in _SINK_COLUMNS)

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


class TidemqDataSource(DataSource):
    """``format("tidemq")``: read topics (batch and streaming) and write to them."""

    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidemqBatchReader(SourceOptions.parse(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidemqStreamReader(SourceOptions.parse(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> TidemqWriter:
        return TidemqWriter(SinkOptions.parse(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> TidemqStreamWriter:
        return TidemqStreamWriter(SinkOptions.parse(self.options), schema)


# ---------------------------------------------------------------------------- offline store


class TidemqStoreReader(DataSourceReader):
    def __init__(self, path: str, options: Any) -> None:
        from .options import _bool

        self.path = path
        self.check_crc = _bool(options, "validateCrc", False)
        self.skip_corrupt = _bool(options, "ignoreCorruptRecords", False)
        topics = options.get("topic")
        self.topics = frozenset(t.strip() for t in str(topics).split(",") if t.strip()) if topics else None
        self.broker = options.get("broker") or None

    def partitions(self) -> Sequence[InputPartition]:
        return [StoreFilePartition(f.path, f.base_offset, f.size) for f in list_files(self.path)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, StoreFilePartition):
            return
        builder = BatchBuilder(arrow_schema(), self.broker)
        file = CommitLogFile(partition.path, partition.base_offset, partition.size)
        for msg in iter_file(file, check_crc=self.check_crc, skip_corrupt=self.skip_corrupt):
            if self.topics is not None and msg.topic not in self.topics:
                continue
            try:
                builder.add(msg, decompressed=False)
            except CorruptDataError as exc:
                where = f"{partition.path} (commit-log offset {msg.commit_log_offset})"
                if not self.skip_corrupt:
                    raise CorruptRecordError(f"corrupt CommitLog record in {where}: {exc}") from None
                log.warning("corrupt CommitLog record in %s: %s; skipped", where, exc)
            if len(builder) >= ARROW_BATCH_ROWS:
                yield builder.flush()
        if len(builder):
            yield builder.flush()


class TidemqStoreDataSource(DataSource):
    """``format("tidemq-store").load(path)``: a broker's CommitLog files, one partition per file."""

    @classmethod
    def name(cls) -> str:
        return "tidemq-store"

    def schema(self) -> StructType:
        return spark_schema()

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise TidemqSparkError(
                "tidemq-store needs a path: spark.read.format('tidemq-store').load('/data/broker')"
            )
        list_files(path)  # a bad path fails at planning with a clear message
        return TidemqStoreReader(str(path), self.options)

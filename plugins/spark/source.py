"""The live ``tidemq`` source: batch and micro-batch readers over ConsumeQueue offset ranges.

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

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition

from .client import TidemqSession
from .options import (
    EARLIEST,
    LATEST,
    Offsets,
    QueueKey,
    TidemqSparkError,
    offsets_from_json,
    offsets_to_json,
    rate_limit,
)
from .schema import BatchBuilder, arrow_schema
from .source_options import SourceOptions

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


class _RangeReader:
    """What batch and stream readers share: planning ranges and pulling them on executors."""

    opts: SourceOptions

    def _read_range(self, part: QueueRange) -> Iterator[Any]:
        o = self.opts
        builder = BatchBuilder(arrow_schema(), part.broker)
        with TidemqSession(o.namesrv, o.timeout_s, o.client) as session:
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
        with TidemqSession(o.namesrv, o.timeout_s, o.client) as session:
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
            self._session = TidemqSession(self.opts.namesrv, self.opts.timeout_s, self.opts.client)
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
